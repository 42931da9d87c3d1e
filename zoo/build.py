"""`zoo build`: run an entry's recipe end to end and write every measured field of its card.

Train (torchrun, DDP, 2 processes by default) -> QAT -> export every variant -> evaluate each with
onnxruntime -> write test_data_set_0 -> copy the files into the entry folder -> rewrite the card's
measured fields (metrics, sha256, sizes, parameter count, dataset facts, build time, versions) ->
regenerate the manifest. Hand-written card fields (description, task, licence, recipe) are kept.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import numpy_helper

from zoo import catalog
from zoo.cards import PublishedFile, dump_card, parse_card
from zoo.config import REPO_ROOT, entries_dir
from zoo.data import load_dataset
from zoo.errors import CardError, ZooError
from zoo.evaluate import SPEED_BATCHES, predict, timings
from zoo.fsutil import atomic_copy, atomic_write_bytes, atomic_write_text, plural
from zoo.models import count_params, model_for, model_spec
from zoo.processes import run_stoppable
from zoo.provenance import build_environment, cpu_info, require_clean
from zoo.recipes import entry_training_command, import_command, load_recipe
from zoo.store.fetch import fetch
from zoo.store.history import published_object
from zoo.pointer import read_pointer
from zoo.run_summary import RunSummary
from zoo.kinds import KINDS, kind_of
from zoo.variants.make import make_variant, spec_for
from zoo.variants.opsets import Origin, opset_range

TEST_DATA_EXAMPLES = 16


def build_paths(names: list[str]) -> list[Path]:
    """What building `names` writes in the checkout: their entry folders and the generated catalog files."""
    return [entries_dir() / n for n in names] + catalog.generated_paths()


def build(name: str, nproc: int = 2, threads: int = 1, log=print, init_from: Path | None = None,
          variant_metrics: dict[str, float] | None = None, command_shown: str | None = None,
          allow_dirty: bool = False, writes: list[str] | None = None) -> Path:
    """Train, export, measure and write the card. `init_from`: the converted upstream weights an import starts from.

    The tree must be clean apart from what this run writes (`writes`: the entries of one `zoo build` command):
    the recorded commit is stamped into every file, so building that commit again gives the same bytes."""
    commit, reproducible = require_clean(build_paths(writes or [name]), allow_dirty)
    catalog.require_every_card(being_built=tuple(writes or [name]))  # the manifest it ends with needs them
    card_path, raw = catalog.raw_card(name)
    entry_dir = card_path.parent
    training = raw.get("training") or {}
    recipe, architecture = training.get("recipe"), raw.get("architecture")
    if not recipe or not architecture:
        raise CardError(f"{card_path}: training.recipe and architecture are needed to build this entry")
    if training.get("imported_from") and init_from is None:
        if training.get("import_source"):
            from zoo.importer import resolve_source  # lazy: transformers (~3 s), only for imported entries

            return import_entry(name, resolve_source(training["import_source"]), nproc, threads, log,
                                allow_dirty=allow_dirty, writes=writes)
        raise ZooError(f"'{name}' starts from an upstream checkpoint: run `{import_command(name)}`")
    trainable = raw.get("trainable")
    command = entry_training_command(recipe, architecture, nproc, trainable, init_from and str(init_from))
    # A bad recipe fails here, once, not in every worker; so does a published file to continue from that no store has.
    loaded = load_recipe(recipe, command[command.index("--model") + 2:], model=architecture)
    if loaded.eval_examples is not None:
        raise ZooError(f"{recipe}: eval_examples={loaded.eval_examples} measures part of the {loaded.eval_split} split; "
                       "a card's numbers are measured on all of it: remove eval_examples from the recipe")
    start = loaded.init_from
    if isinstance(start, PublishedFile):
        log(f"[{name}] continuing from {start.label()}: {published_object(start)}")
    env = build_environment(threads, commit)
    with tempfile.TemporaryDirectory(prefix=f"zoo-build-{name}-") as tmp:
        out = Path(tmp) / "run"
        full = [str(Path(sys.executable).with_name("torchrun")), *command[1:], "--output-dir", str(out)]
        log(f"[{name}] {shlex.join(command)}")
        started = time.perf_counter()
        result = run_stoppable(full, f"building '{name}'", cwd=REPO_ROOT, env=env)  # SIGTERM: ranks stop, tmp goes
        if result.returncode != 0:
            raise ZooError(f"building '{name}' failed: `{shlex.join(command)}` exited {result.returncode} (its output is above)")
        summary = RunSummary.read(out)
        _install_files(summary, out, entry_dir)
        _write_test_data(summary, out, entry_dir)
        _write_curve(summary, entry_dir)
    declared = {k: v for k, v in (raw.get("variants") or {}).items()  # the card's kinds the run does not make
                if k not in summary.variants and kind_of(k, v).made != "training"}
    raw.update(_measured_fields(summary, raw, command_shown or shlex.join(command), threads))
    raw["training"].update(git_commit=commit, reproducible=reproducible, cpu=cpu_info())
    raw["training"].pop("continued_from", None)
    if isinstance(start, PublishedFile):  # the card names the file its weights started from
        raw["training"]["continued_from"] = start.model_dump()
    for variant in raw["variants"].values():
        variant["metrics"].update(variant_metrics or {})
    fp32 = entry_dir / raw["variants"]["fp32"]["file"]
    origin = Origin(architecture, recipe, summary.dataset, trainable)
    log(f"[{name}] measuring the opsets the family exports these weights at")
    raw["variants"]["fp32"]["opset_range"] = list(opset_range(fp32, origin, raw["variants"]["fp32"]["opset"],
                                                             load_recipe(recipe, model=architecture).model_args))
    for key, spec in declared.items():  # the card's other kinds, made from the new fp32 file (training's threads)
        raw["variants"][key] = make_variant(key, spec, fp32, entry_dir, origin, log, env)
    raw["training"]["build_time_s"] = round(time.perf_counter() - started, 1)
    log(f"[{name}] measuring every variant's latency side by side ({plural(threads, 'thread')}, batch 1 and 32)")
    _write_speed(raw["variants"], entry_dir, summary.dataset, threads)
    card = parse_card(raw, str(card_path))  # validate before anything is written
    atomic_write_text(card_path, dump_card(card))
    catalog.write_manifest()
    if summary.tracking.run_id:  # tracking was on: the variants join the registry, linked to the run that made them
        _register(name, summary.tracking.uri, summary.tracking.run_id, log)
    return card_path


def _register(name: str, uri: str, run_id: str, log) -> None:
    from mlflow.exceptions import MlflowException  # lazy: MLflow (~2 s), only for builds that track

    from zoo.registry import register  # lazy: MLflow, only for builds that track

    try:
        register(name, uri, run_id=run_id, log=log)
    except (ZooError, MlflowException) as exc:  # the card and files are written: registering again is one command
        log(f"[{name}] not registered in MLflow ({exc}); `zoo register {name} --tracking-uri {uri}` retries")


def export_variant(name: str, key: str, log=print) -> Path:
    """`zoo export NAME --variant KEY`: make a variant the training run does not make (a kind made from fp32, or a
    retraining the card declares) from the entry's fetched fp32 file, and write its card fields."""
    card_path, raw = catalog.raw_card(name)
    variants = raw.get("variants") or {}
    spec = spec_for(name, key, variants)
    kind = kind_of(key, spec)
    recipe = load_recipe(raw["training"]["recipe"], model=raw["architecture"]) if raw["training"].get("recipe") else None
    if kind.made == "training" or (recipe is not None and key in recipe.export.variants):
        raise ZooError(f"'{key}' is made by the training run of the entry's recipe, not from fp32 alone: "
                       f"`zoo build {name}` makes it")
    card = catalog.get_card(name)
    fp32 = fetch(name, "fp32", show_progress=False).path
    variants[key] = make_variant(key, spec, fp32, card_path.parent, Origin.of(card), log)
    raw["variants"] = variants
    if kind.inference:  # its latency next to fp32's, at the threads the card's other figures used
        _write_speed(variants, card_path.parent, card.dataset.name, card.training.threads or 1, only=[key])
    new = parse_card(raw, str(card_path))
    atomic_write_text(card_path, dump_card(new))
    catalog.write_manifest()
    return card_path.parent / new.variants[key].file


def import_entry(name: str, source: Path, nproc: int = 2, threads: int = 1, log=print, allow_dirty: bool = False,
                 writes: list[str] | None = None) -> Path:
    """`zoo import`: convert + parity-check an upstream checkpoint (zoo.importer), then fine-tune and build the
    entry from it with `init_from`."""
    from zoo.importer import convert, read_checkpoint  # lazy: transformers (~3 s), only for imported entries

    read_checkpoint(source.resolve())  # a wrong folder is the first thing to say
    require_clean(build_paths(writes or [name]), allow_dirty)  # before the conversion's minutes, not after
    catalog.require_every_card(being_built=tuple(writes or [name]))  # the manifest it ends with needs them
    weights, _, parity = convert(source.resolve(), name)
    log(f"[{name}] parity with transformers' BertModel: torch {parity['parity_torch_max_abs_diff']:.2e}, "
        f"onnx {parity['parity_onnx_max_abs_diff']:.2e}")
    return build(name, nproc=nproc, threads=threads, log=log, init_from=weights,
                 variant_metrics=parity, command_shown=import_command(name, nproc),
                 allow_dirty=allow_dirty, writes=writes)


def _write_speed(variants: dict, entry_dir: Path, dataset: str, threads: int, only: list[str] | None = None,
                 runs: int = 30) -> None:
    """Each ONNX variant's `speed`: median and p90 latency at batch 1 and 32 and the ratio to fp32, all measured
    side by side in one run on the test split (fp32 from the checkout or the stores when it is a pointer there)."""
    keys = [k for k, v in variants.items() if kind_of(k, v).inference and (only is None or k in only)]
    paths = {k: entry_dir / variants[k]["file"] for k in {"fp32", *keys}}
    if read_pointer(paths["fp32"]) is not None:
        paths["fp32"] = fetch(entry_dir.name, "fp32", show_progress=False).path
    x = load_dataset(dataset).test.x.numpy()
    measured = timings(paths, x, SPEED_BATCHES, threads, runs)
    base = measured["fp32"]
    for key in keys:
        variants[key]["speed"] = {"threads": threads, "runs": runs, **{
            f"batch_{b}": {"median_ms": round(median, 4), "p90_ms": round(p90, 4),
                           "vs_fp32": round(base[b][0] / median, 3)}
            for b, (median, p90) in measured[key].items()}}


def _install_files(summary: RunSummary, out: Path, entry_dir: Path) -> None:
    for v in summary.variants.values():
        atomic_copy(out / v.file, entry_dir / v.file)
        for extra in v.extra_opsets.values():
            atomic_copy(out / extra.file, entry_dir / extra.file)


def _write_curve(summary: RunSummary, entry_dir: Path, points: int = 200) -> None:
    """The training loss per step (downsampled to at most `points` per phase): the docs plot it."""
    curve = {}
    for phase, info in summary.phases.items():
        losses = info.losses
        stride = max(1, len(losses) // points)
        curve[phase] = {"step": list(range(0, len(losses), stride)), "loss": [round(v, 6) for v in losses[::stride]]}
    atomic_write_text(entry_dir / "training_curve.json", json.dumps(curve) + "\n")


def _write_test_data(summary: RunSummary, out: Path, entry_dir: Path) -> None:
    """onnx/models' test_data_set layout: input_0.pb / output_0.pb, from the fp32 model on the eval split."""
    split = load_dataset(summary.dataset).split(summary.eval_split)
    x = split.x[:TEST_DATA_EXAMPLES].numpy()
    y = predict(out / summary.variants["fp32"].file, x)
    folder = entry_dir / "test_data_set_0"
    folder.mkdir(exist_ok=True)
    for filename, array, tensor_name in (("input_0.pb", x, "input"), ("output_0.pb", y, "logits")):
        tensor = numpy_helper.from_array(np.ascontiguousarray(array), tensor_name)
        atomic_write_bytes(folder / filename, tensor.SerializeToString())


def describe(name: str) -> Path:
    """Write a card's static fields (dataset facts, parameter count, inputs/outputs, planned variants) without
    training: for entries whose weights are built elsewhere (a GPU cluster) or imported."""
    card_path, raw = catalog.raw_card(name)
    recipe = load_recipe(raw["training"]["recipe"], model=raw["architecture"])
    raw.update(_static_fields(recipe.model, recipe.model_args, recipe.dataset))
    raw["training"] = {**raw["training"], "command": " ".join(entry_training_command(recipe.name, raw["architecture"], 8)),
                       "seed": recipe.seed}
    variants = raw.get("variants") or {}
    for key in recipe.export.variants:
        if key not in variants or not variants[key].get("sha256"):
            variants[key] = KINDS[key].card_fields(max(recipe.export.opsets))
    raw["variants"] = variants
    card = parse_card(raw, str(card_path))
    atomic_write_text(card_path, dump_card(card))
    catalog.write_manifest()
    return card_path


def _static_fields(architecture: str, model_args: dict, dataset: str | None) -> dict:
    data = load_dataset(dataset or model_spec(architecture).dataset)
    labels = data.labels
    dtype = str(data.train.x.dtype).removeprefix("torch.")
    return {
        "num_params": count_params(model_for(architecture, data, **model_args)),
        "dataset": {"name": data.name, "source": data.source, "license": data.license,
                    "splits": {"train": len(data.train), "val": len(data.val), "test": len(data.test)},
                    "class_balance": data.class_balance()},
        "preprocessing": data.preprocessing,
        "inputs": [{"name": "input", "shape": ["batch", *data.input_shape], "dtype": dtype}],
        "outputs": [{"name": "logits", "shape": ["batch", len(labels)], "dtype": "float32", "labels": labels}],
    }


def _measured_fields(summary: RunSummary, raw: dict, command: str, threads: int) -> dict:
    recipe = load_recipe(raw["training"]["recipe"], model=raw["architecture"])
    variants = {}
    for key, v in summary.variants.items():
        variants[key] = {
            **KINDS[key].card_fields(v.opset), "opset": v.opset, "sha256": v.sha256, "size": v.size,
            "metrics": {"accuracy": v.accuracy},
            "extra_opsets": {int(o): e.file for o, e in v.extra_opsets.items()},
        }
    fields = _static_fields(recipe.model, recipe.model_args, summary.dataset)
    if fields["num_params"] != summary.num_params:
        raise ZooError(f"card and trained model disagree on the parameter count ({fields['num_params']} vs "
                       f"{summary.num_params}): the recipe's model_args changed during the build")
    return {
        **fields,
        "training": {**(raw.get("training") or {}), "command": command, "seed": summary.seed,
                     "threads": threads, "library_versions": summary.library_versions},
        "variants": variants,
    }
