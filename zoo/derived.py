"""Variants made from an entry's built fp32 file: primaries need training, everything else is derived.

Primary (needs training, published): fp32, int8-qat, and variants retrained from fp32 by another recipe
(`recipe:`, e.g. federated). Derived (a deterministic function of the fp32 file, plus the entry's calibration data):
int8-ptq, fp16, ort-training and every other opset. `zoo build` makes derived files with the functions here, and
`zoo fetch` makes them again from a fetched fp32 file when no store has them; same CPU and libraries, same bytes.

- `int8-ptq`: onnxruntime quantize_static calibrated on the recipe's seeded training batches.
- `fp16`: fp16 weights and compute, fp32 inputs/outputs.
- opset N: the fp32 weights loaded back into the family's torch model and exported at opset N (never
  onnx.version_converter, which fails for most opset pairs).
- `format: ort-training`: onnxruntime-training artifacts (training, eval and optimizer models, checkpoint) for the
  card's trainable split, packed in one deterministic zip. Measured: the inference model exported from the
  untouched artifacts must score what fp32 scores.
- `recipe: <federated recipe>`: the fp32 weights retrained by a federated run (`launchers/federated.py run`, real
  server and client processes); measured on that recipe's evaluation data (e.g. the rotated digits it adapts to).

`zoo build` makes every derived variant its card declares after training; `zoo export NAME --variant KEY` remakes one
from the fetched fp32 file without retraining.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from zoo.cards import FROM_FP32, ModelCard, Variant
from zoo.config import REPO_ROOT
from zoo.errors import ZooError

# A variant key `zoo export` can add to a card that does not declare it yet.
DEFAULT_SPECS = {"ort-training": {"file": "model.ort-training.zip", "precision": "fp32", "quantization": "none",
                                  "format": "ort-training"}}
ORT_TRAINING_TOLERANCE = 0.001  # the fp32 weights themselves: they score what fp32 scores
FEDERATED_TOLERANCE = 0.02  # a federated run re-made elsewhere: other CPU kernels, same rounds and shards


# The lowest and highest opsets probed when `zoo build` measures which opsets a family exports correctly.
OPSET_PROBE = (7, 20)
AGREEMENT = 0.999  # another opset of the same weights must predict fp32's labels (rounding may flip a near-tie)


def is_derived(spec: dict) -> bool:
    """Made by `zoo build` after training, from the built fp32 file (training artifacts, federated retraining)."""
    return spec.get("format", "onnx") != "onnx" or spec.get("recipe") is not None


@dataclass(frozen=True)
class Origin:
    """What a derived file is made from besides the fp32 file: the entry's model, recipe, data and on-device split."""

    architecture: str
    recipe: str
    dataset: str
    trainable: list[str] | None = None

    @classmethod
    def of(cls, card: ModelCard) -> "Origin":
        if not card.training.recipe:
            raise ZooError(f"'{card.name}' names no recipe: its derived variants cannot be made here")
        return cls(card.architecture, card.training.recipe, card.dataset.name, card.trainable)


def calibration_batches(recipe, data) -> list[np.ndarray]:
    """The PTQ calibration set: `quantization.calibration_batches` seeded batches of 32 from the training split."""
    import torch

    generator = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(data.train), generator=generator)
    q = recipe.quantization
    return [data.train.x[order[i * 32:(i + 1) * 32]].numpy() for i in range(q.calibration_batches)]


def derive_file(key: str, fp32: Path, target: Path, origin: Origin, recipe=None, data=None,
                fmt: str = "onnx") -> Path:
    """Make the derived variant `key` of `fp32` at `target`: int8-ptq and fp16 stamped with the fp32 file's
    provenance, `fmt` ort-training the packed artifacts of the origin's trainable split. `recipe`/`data`: already
    loaded ones (the trainer's), else the origin's. Bytes only: measuring is the caller's."""
    from zoo import export

    target.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "ort-training":
        from zoo.ondevice import pack_artifacts, training_artifacts

        with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
            training_artifacts(fp32, Path(tmp) / "artifacts", trainable_globs=origin.trainable)
            pack_artifacts(Path(tmp) / "artifacts", target)
        return target
    if key not in FROM_FP32:
        raise ZooError(f"'{key}' is not made from the fp32 file by a tool (derived ONNX variants: {', '.join(FROM_FP32)})")
    inherited = export.inherited_metadata(fp32)
    if key == "int8-ptq":
        from zoo.data import load_dataset
        from zoo.recipes import load_recipe

        recipe = recipe or load_recipe(origin.recipe, model=origin.architecture)
        data = data or load_dataset(origin.dataset)
        path = export.export_int8_ptq(fp32, calibration_batches(recipe, data), target, recipe.quantization.ptq_op_types)
    else:
        path = export.export_fp16(fp32, target)
    return export.stamp(path, key, inherited, source=fp32)


def derive(key: str, variant: Variant, fp32: Path, target: Path, origin: Origin, opset: int | None = None) -> Path:
    """Any file `zoo fetch` and `zoo validate` make from fp32: the card's variant `key`, or with `opset` the fp32
    weights at that opset."""
    if opset is not None:
        return reexport_opset(fp32, opset, target, origin)
    return derive_file(key, fp32, target, origin, fmt=variant.format)


def reexport_opset(fp32: Path, opset: int, target: Path, origin: Origin, model_args: dict | None = None) -> Path:
    """The fp32 weights exported again at `opset` through the family's torch definition."""
    from zoo import export
    from zoo.data import load_dataset
    from zoo.models import build_model
    from zoo.ondevice import TRAINABLE_GLOBS_KEY

    if model_args is None:
        from zoo.recipes import load_recipe

        model_args = load_recipe(origin.recipe, model=origin.architecture).model_args
    data = load_dataset(origin.dataset)
    model = export.load_onnx_weights(fp32, build_model(origin.architecture, num_classes=len(data.labels), **model_args))
    props = export.read_metadata(fp32)
    globs = json.loads(props.get(TRAINABLE_GLOBS_KEY, '["*"]'))
    path = export.export_fp32(model, data.train.x[:2], target, opset)
    onnx_model = onnx.load(str(path))
    fp32_keys = fp32_metadata(onnx_model, model, None if globs == ["*"] else globs)
    return export.stamp(path, "fp32", {**export.inherited_metadata(fp32), **fp32_keys})


def fp32_metadata(onnx_model: onnx.ModelProto, model, patterns: list[str] | None) -> dict[str, str]:
    """The keys only fp32 files carry: the on-device training split and the parameter aliases."""
    from zoo.export import ALIASES_KEY, parameter_aliases
    from zoo.ondevice import TRAINABLE_GLOBS_KEY, TRAINABLE_KEY, trainable_initializers

    params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
    names = trainable_initializers(onnx_model, params, patterns)
    return {TRAINABLE_KEY: json.dumps(names), TRAINABLE_GLOBS_KEY: json.dumps(patterns or ["*"]),
            ALIASES_KEY: json.dumps(parameter_aliases(onnx_model, model), sort_keys=True)}


def prediction_agreement(candidate: Path, reference: np.ndarray, x: np.ndarray) -> float:
    """Share of examples on which `candidate` predicts the `reference` labels (fp32's)."""
    from zoo.evaluate import predict

    return float((predict(candidate, x).argmax(1) == reference).mean())


def opset_range(fp32: Path, origin: Origin, primary: int, model_args: dict | None = None,
                examples: int = 256) -> tuple[int, int]:
    """The contiguous opsets around `primary` at which the family exports these weights with fp32's predictions
    (measured on the first `examples` test examples): what `zoo fetch --opset N` can serve."""
    from zoo.data import load_dataset
    from zoo.evaluate import predict

    x = load_dataset(origin.dataset).test.x[:examples].numpy()
    reference = predict(fp32, x).argmax(1)
    works = {}
    with tempfile.TemporaryDirectory(prefix="zoo-opsets-") as tmp:
        def ok(opset: int) -> bool:
            if opset not in works:
                try:
                    path = reexport_opset(fp32, opset, Path(tmp) / f"opset{opset}.onnx", origin, model_args)
                    works[opset] = prediction_agreement(path, reference, x) >= AGREEMENT
                except Exception:  # noqa: BLE001 - an op the exporter or runtime lacks at that opset
                    works[opset] = False
            return works[opset]

        low = primary
        while low - 1 >= OPSET_PROBE[0] and ok(low - 1):
            low -= 1
        high = primary
        while high + 1 <= OPSET_PROBE[1] and ok(high + 1):
            high += 1
    return low, high



def evaluation_data(card: ModelCard, variant: Variant, split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """The data a variant's metrics are measured on: the card's dataset, or its retraining recipe's data."""
    if variant.recipe is not None:
        from zoo.federated import fleet_data

        return fleet_data(_federated_recipe(variant.recipe, card.dataset.name), split)
    from zoo.data import load_dataset

    part = load_dataset(card.dataset.name).split(split)
    return part.x.numpy(), part.y.numpy()


@contextmanager
def inference_model(path: Path, variant: Variant):
    """The ONNX file a variant predicts with: itself, or for training artifacts the inference model they export
    before any training step."""
    if variant.format != "ort-training":
        yield Path(path)
        return
    from zoo.ondevice import OnnxTrainer, unpack_artifacts

    with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
        folder = unpack_artifacts(path, Path(tmp) / "artifacts")
        yield OnnxTrainer(folder, lr=0.0).export(Path(tmp) / "untouched.onnx")


def make_derived(key: str, spec: dict, fp32: Path, entry_dir: Path, trainable: list[str] | None, dataset: str,
                 log=print, env: dict | None = None) -> dict:
    """Make variant `key` from `fp32` into the entry folder; returns its card fields, measured. `env`: for the
    processes it starts (federated server and clients)."""
    target = entry_dir / spec["file"]
    spec = {k: v for k, v in spec.items() if k not in ("sha256", "size", "metrics")}  # measured again below
    if spec.get("format", "onnx") == "ort-training":
        log(f"[{entry_dir.name}] {key}: onnxruntime-training artifacts from {fp32.name} (trainable {trainable or ['*']})")
        measured = _ort_training(fp32, target, trainable, dataset)
    elif spec.get("recipe"):
        log(f"[{entry_dir.name}] {key}: federated retraining with recipe {spec['recipe']}")
        measured = _federated(fp32, target, spec["recipe"], dataset, env)
    else:
        raise ZooError(f"variant '{key}' is trained with the entry's recipe, not derived: `zoo build {entry_dir.name}`")
    from zoo.store.pointer import pointer_for

    pointer = pointer_for(target)
    return {**spec, **measured, "sha256": pointer.oid, "size": pointer.size}


def _ort_training(fp32: Path, target: Path, trainable: list[str] | None, dataset: str) -> dict:
    from zoo.data import load_dataset
    from zoo.evaluate import accuracy
    from zoo.ondevice import OnnxTrainer, read_split, unpack_artifacts

    derive_file("ort-training", fp32, target, Origin("", "", dataset, trainable), fmt="ort-training")
    with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
        folder = unpack_artifacts(target, Path(tmp) / "artifacts")
        split = read_split(folder)
        untouched = OnnxTrainer(folder, lr=0.0).export(Path(tmp) / "untouched.onnx")
        test = load_dataset(dataset).test
        measured = accuracy(untouched, test.x.numpy(), test.y.numpy())
        opset = next(o.version for o in onnx.load(str(folder / "training_model.onnx")).opset_import if o.domain in ("", "ai.onnx"))
    sizes = {i.name: int(np.prod(i.dims)) for i in onnx.load(str(fp32)).graph.initializer}
    return {"opset": opset, "tolerance": ORT_TRAINING_TOLERANCE, "metrics": {"accuracy": measured,
                                        "trainable_parameters": float(sum(sizes[n] for n in split["trainable"])),
                                        "frozen_parameters": float(sum(sizes[n] for n in split["frozen"]))}}


def _federated_recipe(name: str, dataset: str):
    from zoo.federated import fleet_dataset
    from zoo.recipes import load_recipe

    recipe = load_recipe(name)
    if recipe.federated is None:
        raise ZooError(f"recipe '{name}' has no federated section: a retraining variant names a federated recipe")
    if fleet_dataset(recipe) != dataset:
        raise ZooError(f"recipe '{name}' trains on {fleet_dataset(recipe)}, the entry's dataset is {dataset}")
    return recipe


def _federated(fp32: Path, target: Path, recipe_name: str, dataset: str, env: dict | None) -> dict:
    from zoo.export import read_metadata
    from zoo.store.cache import atomic_copy

    _federated_recipe(recipe_name, dataset)
    with tempfile.TemporaryDirectory(prefix="zoo-federated-") as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, str(REPO_ROOT / "launchers" / "federated.py"), "run", "--recipe", recipe_name,
                   "--onnx", str(fp32), "--output-dir", str(out)]
        if subprocess.run(command, cwd=REPO_ROOT, env=env).returncode != 0:
            raise ZooError(f"federated run for recipe '{recipe_name}' failed (its output is above)")
        summary = json.loads((out / "federated.json").read_text())
        atomic_copy(out / summary["variant"]["file"], target)
    return {"opset": int(read_metadata(target)["zoo.opset"]), "tolerance": FEDERATED_TOLERANCE,
            "metrics": {"accuracy": summary["rounds"][-1]["accuracy"], "initial_accuracy": summary["initial_accuracy"],
                        "central_accuracy": summary["central_accuracy"], "rounds": float(len(summary["rounds"]))}}
