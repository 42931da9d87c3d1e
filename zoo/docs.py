"""Generate the docs site's model pages from the same cards the CLI reads (so the site cannot drift).

`zoo docs` writes docs/models/*.md, docs/reference/recipes.md and the plots under docs/models/img/;
`make docs` then runs `mkdocs build --strict`. Latency is the cards' (`zoo build` measures it); the validation
verdicts come from benchmarks/results/validation.json when that measurement exists.
"""

from __future__ import annotations

import html
import inspect
import json
import re
import types
import typing
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import torch
import yaml

from zoo import catalog
from zoo.cards import ModelCard
from zoo.config import REPO_ROOT
from zoo.data import load_dataset
from zoo.fsutil import atomic_write_text, human_size, plural
from zoo.metrics import wilson_interval
from zoo.models import build_model, model_spec
from zoo.recipes import Recipe, load_recipe
from zoo.registry import model_name, model_uri
from zoo.store.rebuild import build_estimate, buildable, planned_processes
from zoo.variants import KINDS, kind_of, slower_than_fp32
from zoo.variants.checks import summary_line

matplotlib.use("Agg")  # files only, never a window

DOCS = REPO_ROOT / "docs"
RESULTS = REPO_ROOT / "benchmarks" / "results"
# Each launcher's command, and the model capability it needs (None: every model).
LAUNCHERS = [  # {n}: the number of processes
    ("ddp", "torchrun --nproc_per_node {n} launchers/ddp.py", "", None),
    ("fsdp", "torchrun --nproc_per_node {n} launchers/fsdp.py", "", None),
    ("deepspeed ZeRO-3", "deepspeed --num_gpus {n} launchers/deepspeed.py", " parallelism.strategy=zero3", None),
    ("horovod", "horovodrun -np {n} -H localhost:{n} --gloo python launchers/horovod.py", "", None),
    ("tensor parallel", "torchrun --nproc_per_node {n} launchers/tensor_parallel.py", " parallelism.strategy=tp",
     "tensor_parallel_plan"),
    ("pipeline", "torchrun --nproc_per_node {n} launchers/pipeline.py", " parallelism.strategy=pp", "pipeline_blocks"),
]


def launcher_commands(architecture: str, recipe: str, processes: int = 2) -> list[str]:
    """The training command of every launcher that supports this architecture, with `processes` ranks."""
    with torch.device("meta"):  # capabilities only: no weights are allocated
        model = build_model(architecture, num_classes=2, **load_recipe(recipe).model_args)
    return [f"{command.format(n=processes)} --recipe {recipe} --model {architecture}{extra}   # {name}"
            for name, command, extra, needs in LAUNCHERS if needs is None or hasattr(model, needs)]
def columns() -> list[str]:
    """The models index shows one accuracy column per kind that asks for one."""
    return [k for k, kind in KINDS.items() if kind.docs_column]


def _load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _fmt(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _text(text: str) -> str:
    """Card prose as text, not HTML: `<pkg>` in a licence path stays visible."""
    return html.escape(text, quote=False)


def _shape(shape: list) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _size(n: int | None) -> str:
    """A size for tables: read in KiB/MiB, sorted by bytes (docs/js/sortable.js reads data-sort)."""
    return "–" if n is None else f'<span data-sort="{n}">{human_size(n)}</span>'


def _variant_type(v) -> str:
    return " ".join(p for p in (v.precision, v.quantization) if p != "none")


def _verdicts(validation: dict, name: str) -> dict[str, str]:
    """Latest validation verdict per variant: FAIL if any of its checks (or the entry's) failed."""
    rows = [r for r in validation.get("rows", []) if r["entry"] == name]
    entry_rows = [r for r in rows if r["variant"] == "*"]
    verdicts = {}
    for variant in {r["variant"] for r in rows} - {"*"}:
        mine = [r for r in rows if r["variant"] == variant] + entry_rows
        verdicts[variant] = "FAIL" if any(not r["ok"] for r in mine) else "pass"
    if any(r["check"] == "built" for r in entry_rows):
        return {"*": "not built"}
    if entry_rows and all(r.get("skipped") for r in entry_rows):
        return {"*": "skipped (not rebuilt in the fast CI run)"}
    return verdicts


def _plots(card: ModelCard, folder: Path, out: Path) -> list[str]:
    images = []
    curve = _load_json(folder / "training_curve.json")
    phases = {phase: points for phase, points in (curve or {}).items() if points["step"]}
    if phases:
        # One panel per phase, each over its own steps: a QAT phase of a few hundred steps after thousands of fp32
        # steps would otherwise be a sliver at the right edge.
        fig, axes = plt.subplots(1, len(phases), figsize=(6.4, 3.2), sharey=True, squeeze=False,
                                 gridspec_kw={"width_ratios": [2] + [1] * (len(phases) - 1)})
        for ax, (phase, points) in zip(axes[0], phases.items()):
            ax.plot(points["step"], points["loss"])
            ax.set(xlabel=f"{phase} optimizer step", yscale="log", title=phase)
        axes[0][0].set_ylabel("training loss")
        fig.suptitle(f"{card.name}: training curve")
        fig.tight_layout()
        fig.savefig(out / f"{card.name}-curve.png", dpi=110)
        plt.close(fig)
        images.append(f"![training curve](img/{card.name}-curve.png)")
        if "qat" in phases:
            images += ["", "The qat panel continues from the trained fp32 weights with fake quantization inserted "
                           "(weights and activations rounded to int8 in every step, at the recipe's "
                           "`quantization.qat_lr`), so its losses sit above the end of fp32's: what the rounding costs "
                           "after fine-tuning is int8-qat's accuracy in the variants table.", ""]
    # Variants measured on the card's test set only (a retrained variant's accuracy is on its own recipe's data).
    timed = {k: v for k, v in card.variants.items() if v.speed and v.metrics.get(card.primary_metric) is not None
             and kind_of(k, v).reference != "retrained"}
    tested = card.dataset.splits.get("test")
    if timed:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        for (key, v), marker in zip(timed.items(), "osD^vP*X"):  # a marker each: equal points stay distinguishable
            metric = v.metrics[card.primary_metric]
            low, high = wilson_interval(metric, tested) if tested else (metric, metric)
            ax.errorbar(v.speed.batch_32.median_ms, metric, yerr=[[metric - low], [high - metric]], fmt=marker,
                        capsize=3, label=key, markerfacecolor="none", markersize=8)  # the interval as it is: never above 1
        ax.set(xlabel=f"onnxruntime latency, batch 32, {plural(next(iter(timed.values())).speed.threads, 'thread')} (ms)",
               ylabel=card.primary_metric,
               title=f"{card.name}: accuracy (95% CI) vs latency")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{card.name}-tradeoff.png", dpi=110)
        plt.close(fig)
        images.append(f"![accuracy vs latency](img/{card.name}-tradeoff.png)")
    return images


def model_page(entry: catalog.Entry, verdicts: dict[str, str], img_dir: Path, others: dict | None = None,
               baselines: dict | None = None) -> str:
    c = entry.card
    lines = ["---", "hide: [toc]", "---", "", f"# {c.name}", "", _text(c.description), "",
             f"**Task** {c.task} · **Family** {c.family} · **Architecture** `{c.architecture}` · "
             f"**Parameters** {c.num_params:,} · **Licence** {c.license}", ""]
    if not any(v.built for v in c.variants.values()):
        lines += planned_section(c, others or {})
    else:
        lines += variants_section(c, verdicts)
    lines += baselines_section(c, baselines or {})
    extra = [f"opset {o}: `{f}`" for v in c.variants.values() for o, f in v.extra_opsets.items()]
    if extra:
        lines += ["", "The fp32 weights are also exported at " + ", ".join(extra) + "."]
    fp32 = c.variants["fp32"]
    if fp32.opset_range:
        lines += ["", f"Any opset from {fp32.opset_range[0]} to {fp32.opset_range[1]} (measured by `zoo build`: same "
                      f"predictions as fp32): `zoo fetch {c.name} --opset N` re-exports the fp32 weights through the "
                      "family's PyTorch definition and checks them on the test set."]
    derived = [k for k, v in c.variants.items() if v.built and not kind_of(k, v).primary]
    if derived:
        lines += ["", "Primaries (trained, published to the store): "
                      + ", ".join(f"`{k}`" for k, v in c.variants.items() if v.built and kind_of(k, v).primary)
                      + ". Derived from fp32 (made by `zoo fetch` when no store has them, sha256-checked): "
                      + ", ".join(f"`{k}`" for k in derived) + "."]
    lines += ondevice_section(c)
    built = [key for key, v in c.variants.items() if v.built]
    if built:
        lines += ["", "## Get it", "", "```bash"]
        lines += [f"zoo fetch {c.name} --variant {key}" for key in built]
        if buildable(c):
            lines.append(f"zoo fetch {c.name} --build   # no store has it: built from the recipe at the card's commit, "
                         "verified")
        lines += ["```"]
        lines += use_it(c)
        lines += from_mlflow(c)
    lines += ["", "## Train it", "", "```bash"]
    if not built:
        lines.append(f"{c.training.command}   # the card's planned run")
    if c.training.imported_from:
        lines.append(f"zoo import {c.name} --from <checkpoint dir>   # {c.training.imported_from}")
    lines += launcher_commands(c.architecture, c.training.recipe, max(2, planned_processes(c.training.command)))
    lines.append(f"zoo build {c.name}   # train, export, measure, rewrite the card")
    lines += ["```", "", ("Planned: " if not built else "Produced by ") + f"`{c.training.command}`"
              + (f", seed {c.training.seed}" if c.training.seed is not None else "")
              + (f", {plural(c.training.threads, 'thread')} per process" if c.training.threads else "")
              + (f", in {c.training.build_time_s:.0f} s" if c.training.build_time_s else "")
              + (f" on {c.training.cpu.model} ({', '.join(c.training.cpu.flags)})" if c.training.cpu else "")
              + (f", at commit `{c.training.git_commit}` (`zoo reproduce {c.name}` rebuilds it)"
                 if c.training.git_commit and c.training.reproducible else "") + "."]
    if c.training.library_versions:
        lines += ["", "Library versions: " + ", ".join(f"{k} {v}" for k, v in c.training.library_versions.items()) + "."]
    d = c.dataset
    lines += ["", "## Dataset", "", f"**{d.name}**: {_text(d.source)}.", "", f"Licence: {_text(d.license)}.", "",
              "Splits: " + ", ".join(f"{k} {v:,}" for k, v in d.splits.items()) + "."]
    if d.class_balance:
        lines += ["", "Training examples per class: " + ", ".join(f"{k} {v:,}" for k, v in d.class_balance.items()) + "."]
    lines += ["", "## Preprocessing", ""] + [f"{i}. {_text(step)}" for i, step in enumerate(c.preprocessing, 1)]
    lines += ["", "## Inputs and outputs", "", "| tensor | name | shape | dtype |", "| --- | --- | --- | --- |"]
    lines += [f"| input | `{t.name}` | {_shape(t.shape)} | {t.dtype} |" for t in c.inputs]
    lines += [f"| output | `{t.name}` | {_shape(t.shape)} | {t.dtype} |" for t in c.outputs]
    labels = next((t.labels for t in c.outputs if t.labels), None)
    if labels:
        lines += ["", "Labels: " + ", ".join(f"`{label}`" for label in labels) + "."]
    images = _plots(c, entry.dir, img_dir)
    if images:
        lines += ["", "## Measurements", ""] + images
    return "\n".join(lines) + "\n"


def planned_section(c: ModelCard, others: dict) -> list[str]:
    """An entry nobody has built: how to get it, what it would cost, and the variants a build would make. No metrics,
    opsets or hashes: none exist yet."""
    estimate = build_estimate(c, others)
    imports = model_spec(c.architecture).imports
    lines = ["!!! warning \"Not built yet\"", "    No weights of this entry are published, so `zoo fetch` has "
             f"nothing to give. Build it with `zoo build {c.name}` (planned run: `{c.training.command}`)"
             + (f" or import {imports} with `zoo import {c.name} --from <checkpoint dir>`" if imports else "")
             + (f"; {estimate}" if estimate else "") + ".", "",
             "## Planned variants", "",
             f"The fp32 file will be about {human_size(4 * c.num_params)}: 4 bytes for each of the {c.num_params:,} "
             "parameters of the architecture.", "",
             "| variant | type | made by |", "| --- | --- | --- |"]
    lines += [f"| {key} | {_variant_type(v)} | "
              f"{kind_of(key, v).summary} |" for key, v in c.variants.items()]
    return lines


def variants_section(c: ModelCard, verdicts: dict[str, str]) -> list[str]:
    """A built entry's variants: type, opset, accuracy with its 95% interval, validation, latency, size, sha256."""
    lines = ["## Variants", "",
             f"| variant | type | opset | {c.primary_metric} (test, 95% CI) | validation | latency b1 / b32 (ms) | "
             "speed vs fp32 (b1 / b32) | size |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    tested = c.dataset.splits.get("test")
    for key, v in c.variants.items():
        kind = kind_of(key, v)
        label = f"{key} *" if kind.reference == "retrained" else key  # measured on its recipe's data
        speed = (f"{v.speed.batch_1.vs_fp32:.2f}x / {v.speed.batch_32.vs_fp32:.2f}x" if v.speed else "–")
        latency = (f"{v.speed.batch_1.median_ms:.3g} / {v.speed.batch_32.median_ms:.3g}" if v.speed else "–")
        metric = v.metrics.get(c.primary_metric)
        interval = (" [{:.4f}, {:.4f}]".format(*wilson_interval(metric, tested)) if metric is not None and tested
                    and kind.reference != "retrained" else "")
        lines.append(f"| {label} | {_variant_type(v)} | {v.opset} | "
                     f"<span class=\"metric\" data-variant=\"{key}\">{_fmt(metric)}</span>{interval} | "
                     f"{verdicts.get(key, verdicts.get('*', 'not run')) if v.built else 'not built'} | {latency} | "
                     f"{speed} | {_size(v.size)} |")
    lines += ["", f"95% CI: Wilson interval for {tested:,} test examples." if tested else ""]
    if any(kind_of(k, v).reference == "retrained" for k, v in c.variants.items()):  # the footnote under its table
        lines += ["", "\\* retrained by its recipe and measured on that recipe's data (On-device and federated "
                      "training, below)."]
    lines += ["", "<details markdown><summary>sha256 and how each file is made</summary>", "",
              "| variant | sha256 | made by |", "| --- | --- | --- |"]
    lines += [f"| {key} | `{v.sha256 or 'not built'}` | {kind_of(key, v).summary} |" for key, v in c.variants.items()]
    lines += ["", "</details>"]
    lines += speed_section(c)
    return lines


def baselines_section(c: ModelCard, results: dict) -> list[str]:
    """The entry next to the classic tool for its task, from benchmarks/baselines.py: the same examples, accuracy and
    speed side by side, from the one run that measured this build's files (the classic tools were measured in the
    same run, on the same machine); only files whose sha256 is the card's (an older build's numbers are not shown as
    this one's)."""
    for record in baseline_runs(results):
        if lines := _baselines_run(c, record):
            return lines
    return []


def baseline_runs(results: dict) -> list[dict]:
    """The runs of benchmarks/baselines.json, each measured on one machine (results written before runs were kept
    apart hold one run at the top level)."""
    return results.get("runs", [results] if "tasks" in results else [])


def _baselines_run(c: ModelCard, record: dict) -> list[str]:
    task = record.get("tasks", {}).get("language-identification" if c.task == "language-identification" else
                                       c.dataset.name, {})
    rows = task.get("rows", [])

    def this_build(r: dict) -> bool:
        return r["tool"] == c.name and c.variants.get(r["variant"]) and c.variants[r["variant"]].sha256 == r.get("sha256")

    mine = [r for r in rows if r["kind"] == "entry" and this_build(r)]
    if not mine:
        missed = [r for r in task.get("not_measured", []) if this_build(r)]
        return ["", "## Against the classic tools", "", "Not measured on this build by `python benchmarks/baselines.py`"
                f": {missed[0]['reason']}"] if missed else []
    shown = [r for r in rows if r["kind"] == "baseline"] + mine
    cpu = record.get("cpu", {}).get("model", "an unrecorded CPU")
    lines = ["", "## Against the classic tools", "",
             f"Measured side by side on the same examples by `python benchmarks/baselines.py` ({cpu}, "
             f"{record.get('threads', 1)} thread; speed: one example at a time"
             + (", tokenizing included" if c.task == "language-identification" else "") + ")."]

    def label(r: dict) -> str:
        return f"**{c.name} {r['variant']}**" if r["kind"] == "entry" else f"{r['tool']} {r.get('version', '')}".strip()

    if "test_sets" not in task:  # one test split, one accuracy
        lines += ["", "| tool | accuracy (test) | ms per example |", "| --- | ---: | ---: |"]
        lines += [f"| {label(r)} | {100 * r['accuracy']:.1f} | {r['ms_per_text']:.3f} |" for r in shown]
        return lines
    sets = list(task["test_sets"])
    lines += ["", "Accuracy (%) on the fortunes test set, the second-domain set (GNOME user guide, never trained on) "
              "and copies of the fortunes test texts the way users type them.", "",
              "| tool | " + " | ".join(sets) + " | ms per text |", "| --- |" + " ---: |" * (len(sets) + 1)]
    lines += [f"| {label(r)} | " + " | ".join(f"{100 * r['sets'][s]['accuracy']:.1f}" for s in sets)
              + f" | {r['ms_per_text']:.2f} |" for r in shown]
    fp32 = [r for r in mine if r["variant"] == "fp32"]
    for s in ("fortunes", "second-domain"):
        compared = [r for r in rows if r["kind"] == "baseline"] + fp32
        lengths = list(compared[0]["sets"][s]["by_length"])
        lines += ["", f"By language and by text length (characters), {s}:", "",
                  "| tool | " + " | ".join(task["labels"]) + " | " + " | ".join(lengths) + " |",
                  "| --- |" + " ---: |" * (len(task["labels"]) + len(lengths))]
        lines += [f"| {label(r)} | " + " | ".join(f"{100 * v:.1f}" for v in r["sets"][s]["by_language"].values())
                  + " | " + " | ".join(f"{100 * v:.1f}" for v in r["sets"][s]["by_length"].values()) + " |"
                  for r in compared]
    return lines


def use_it(c: ModelCard) -> list[str]:
    """Fetch, the dataset's exact preprocessing (zoo.data, the code that prepared the training data) and onnxruntime
    inference, as one runnable block (tests/test_families.py and test_entries.py execute it)."""
    usage = load_dataset(c.dataset.name).usage
    labels = next((t.labels for t in c.outputs if t.labels), None)
    if not usage or not labels:
        return []
    code = ["import numpy as np", "import onnxruntime as ort", "", "import zoo", "",
            f'path = zoo.fetch("{c.name}")  # fp32; any variant takes the same input', "", usage, "",
            "session = ort.InferenceSession(str(path))",
            f'logits = session.run(None, {{"{c.inputs[0].name}": x}})[0]  # [batch, {len(labels)}]',
            f"labels = {labels!r}",
            "print([labels[i] for i in logits.argmax(axis=1)])"]
    return ["", "## Use it", "", "```python", *code, "```", "",
            f"`zoo fetch {c.name} --fastest` names the quickest variant on this card that keeps fp32's "
            f"{c.primary_metric}; pass its path instead."]


def from_mlflow(c: ModelCard) -> list[str]:
    """The entry in MLflow's model registry: the command that registers it and the URIs that load it."""
    keys = c.inference_variants()
    if not keys:
        return []
    return ["", "### From MLflow", "",
            f"`zoo register {c.name}` makes each ONNX variant a version of `{model_name(c.name)}` in your MLflow "
            "registry (guide: [Use the zoo from MLflow](../guides/mlflow.md)); then:", "", "```python",
            "import mlflow", "",
            f'model = mlflow.pyfunc.load_model("{model_uri(c.name, "fp32")}")  # or @{", @".join(keys[1:] + ["fastest"])}',
            "```"]


def speed_section(c: ModelCard) -> list[str]:
    """Which variant to use: where and how the latency was measured, the fastest that keeps fp32's accuracy, and
    why a variant is slower than fp32 on that CPU."""
    timed = {k: v for k, v in c.variants.items() if v.speed}
    if not timed:
        return ["", "No latency on this card yet: `zoo build` measures every variant side by side."]
    first = next(iter(timed.values())).speed
    cpu = c.training.cpu
    lines = ["", "### Which variant to use", "",
             f"Latency: onnxruntime on the CPU, {plural(first.threads, 'thread')}, median (and p90 on the card) of "
             f"{first.runs} runs after a warm-up, every variant side by side in one run"
             + (f", on {cpu.model} ({', '.join(cpu.flags)})" if cpu else "") + ". Speed vs fp32 is fp32's median "
             "over the variant's: above 1x is faster. Other CPUs differ (int8 gains most with AVX-512 VNNI or "
             "AMX, fp16 needs AVX512-FP16).", ""]
    for batch in (1, 32):
        best = c.fastest(batch)
        lines.append(f"- Batch {batch}: **{best}** is the fastest that keeps fp32's {c.primary_metric} within its "
                     f"tolerance ({c.variants[best].speed.at(batch).vs_fp32:.2f}x fp32): "
                     f"`zoo fetch {c.name} --fastest" + (" --batch 32`" if batch == 32 else "`"))
    lines += [f"- {who} here: {why}." for who, why in slower_than_fp32(c)]
    return lines


def ondevice_section(c) -> list[str]:
    """What a device may train (the card's split), the published training artifacts and federated variants."""
    artifacts = {k: v for k, v in c.variants.items() if kind_of(k, v).reference == "artifacts"}
    retrained = {k: v for k, v in c.variants.items() if kind_of(k, v).reference == "retrained"}
    split = ("every parameter" if c.trainable == ["*"] else
             ", ".join(f"`{g}`" for g in c.trainable) + " (the rest frozen)")
    lines = ["", "## On-device and federated training", "",
             f"Trainable on a device: {split}. The fp32 file records the matching ONNX initializers "
             "in its metadata (`zoo.trainable`), so a device holding only the file knows what it may change."]
    for key, v in artifacts.items():
        m = v.metrics
        counts = (f": {m['trainable_parameters']:,.0f} trainable and {m['frozen_parameters']:,.0f} frozen parameters"
                  if "trainable_parameters" in m else "")
        lines += ["", f"`{key}` is the onnxruntime-training artifacts (training, eval and optimizer models and the "
                      f"initial checkpoint, AdamW, cross-entropy) made from the fp32 file{counts}, in one zip "
                      f"(`{v.file}`). Validation trains it for a few steps and checks the exported model against fp32."]
    for key, v in retrained.items():
        m = v.metrics
        lines += ["", f"`{key}` was retrained from the fp32 file by the federated recipe `{v.recipe}` "
                      f"(`python launchers/federated.py run --recipe {v.recipe}`); its {c.primary_metric} is measured on "
                      "that recipe's evaluation data" + (f": {_fmt(m.get('initial_accuracy'))} before the first round, "
                                                         f"{_fmt(m.get(c.primary_metric))} after {m.get('rounds', 0):.0f} "
                                                         f"rounds, {_fmt(m.get('central_accuracy'))} trained centrally on "
                                                         "the same data" if "initial_accuracy" in m else "") + "."]
    if not c.variants["fp32"].built:  # nothing to fine-tune or remake until the fp32 file exists
        return lines + ["", f"Once `zoo build {c.name}` has made the fp32 file, `zoo finetune {c.name} --onnx` trains "
                            "it on a device and `zoo export` remakes these variants from it."]
    image = len(c.inputs[0].shape) == 4  # the built-in shifts (rot90, flip, invert) are for images
    lines += ["", "```bash", f"zoo finetune {c.name} --onnx " + ("--shift rot90   # or --data your.npz" if image else
                                                                  "--data your.npz   # x_train, y_train, x_test, y_test")]
    lines += [f"zoo export {c.name} --variant {k}   # remake it from the fetched fp32 file" for k in [*artifacts, *retrained]]
    return lines + ["```"]


def preview(entries: dict) -> str:
    """The home page's catalog: what each entry is, its fp32 accuracy and the quickest variant, from the cards."""
    lines = ["| model | task | parameters | fp32 accuracy | fastest at batch 1 (CPU) |", "| --- | --- | --- | --- | --- |"]
    for name, entry in entries.items():
        c = entry.card
        fp32 = c.variants["fp32"]
        fastest = c.fastest(1) if fp32.speed else None
        lines.append(f"| [{name}](models/{name}.md) | {c.task} | {c.num_params:,} | "
                     + (_fmt(c.metric("fp32")) if fp32.built else "not built") + " | "
                     + (f"{fastest}, {c.variants[fastest].speed.batch_1.vs_fp32:.2f}x fp32" if fastest else "–") + " |")
    return "\n".join(lines) + "\n"


def index_page(entries: dict, validation: dict) -> str:
    shown = columns()
    lines = ["---", "hide: [toc]", "---", "", "# Models", "",
             "Every number below is measured by `zoo build` / `zoo validate` and read from the cards. "
             "Click a column header to sort.", "",
             f"| model | task | params | {' | '.join(f'{k} accuracy' for k in shown)} | size (fp32) | "
             "fp32 latency b32 (ms) | fastest at batch 1 | opsets |",
             "| --- | --- | --- |" + " --- |" * len(shown) + " --- | --- | --- | --- |"]
    for name, entry in entries.items():
        c = entry.card
        metric = " | ".join(_fmt(c.metric(k)) if k in c.variants else "–" for k in shown)
        built = [v for v in c.variants.values() if v.built]  # a planned entry has no opsets yet
        opsets = sorted({v.opset for v in built} | {o for v in built for o in v.extra_opsets})
        fp32 = c.variants["fp32"]
        fastest = c.fastest(1) if fp32.speed else None
        lines.append(f"| [{name}]({name}.md) | {c.task} | {c.num_params:,} | {metric} | "
                     f"{_size(fp32.size)} | {_fmt(fp32.speed.batch_32.median_ms if fp32.speed else None, 3)} | "
                     + (f"{fastest} ({c.variants[fastest].speed.batch_1.vs_fp32:.2f}x)" if fastest else "–")
                     + f" | {', '.join(map(str, opsets)) or '–'} |")
    timed = [e.card for e in entries.values() if e.card.variants["fp32"].speed]
    if timed:
        cpus = sorted({c.training.cpu.model for c in timed if c.training.cpu})
        threads = sorted({c.variants["fp32"].speed.threads for c in timed})
        lines += ["", f"Accuracy: each card's test split. Latency and speed: onnxruntime in each card's `zoo build`, "
                      f"{'/'.join(map(str, threads))} {'thread' if threads == [1] else 'threads'}, median of 30 runs, "
                      f"on {', '.join(cpus) or 'the build CPU'} "
                      "(ISA flags on each model's page)."]
    if validation:
        lines += ["", "Latest validation ([report](../reference/results/validation.md)): " + summary_line(
            [(r["ok"], r.get("skipped", False)) for r in validation.get("rows", [])], validation.get("seconds", 0))]
    return "\n".join(lines) + "\n"


def _type(annotation) -> str:
    """A schema type for readers: Literal values spelled out, unions joined with "or"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if annotation is type(None):
        return "`null`"
    if origin is not None:
        return f"`{str(annotation).replace('typing.', '')}`"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


def field_comments(model) -> dict[str, str]:
    """What the schema's source says about each field: its trailing comment, else the comment lines above it."""
    notes, above = {}, []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        field = re.match(r"^(\w+)\s*:[^#]*(?:#\s*(.*))?$", stripped)
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
        elif field and not stripped.startswith(("def ", "class ", "return")):
            notes[field[1]] = field[2] or " ".join(above)
            above = []
        else:
            above = []
    return notes


def recipes_reference() -> str:
    lines = ["# Recipe reference", "", "Generated from the recipe schema (`zoo/recipes.py`). Any field can be overridden "
             "on the command line as `key=value` (dotted for sections, e.g. `optimizer.lr=0.01`).", ""]

    def describe(model, prefix: str = "") -> None:
        rows = []
        notes = field_comments(model)
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"):
                describe(field.annotation, f"{prefix}{name}.")
                continue
            default = "required" if field.is_required() else json.dumps(field.get_default(call_default_factory=True), default=str)
            rows.append(f"| `{prefix}{name}` | {_type(field.annotation)} | `{default}` | {_text(notes.get(name, ''))} |")
        if rows:
            lines.extend([f"## `{prefix.rstrip('.') or 'recipe'}`", "", "| field | type (allowed values) | default | meaning |",
                          "| --- | --- | --- | --- |", *rows, ""])

    describe(Recipe)
    recipes = sorted((REPO_ROOT / "recipes").glob("*.yaml"))
    lines += ["## Recipes in this repository", "", "| recipe | description |", "| --- | --- |"]
    for path in recipes:
        data = yaml.safe_load(path.read_text())
        lines.append(f"| `{path.stem}` | {' '.join(str(data.get('description', '')).split())} |")
    return "\n".join(lines) + "\n"


def generate() -> list[Path]:
    entries = catalog.entries()
    validation = _load_json(RESULTS / "validation.json")
    baselines = _load_json(RESULTS / "baselines.json")
    models = DOCS / "models"
    img = models / "img"
    img.mkdir(parents=True, exist_ok=True)
    written = []
    for name, entry in entries.items():
        page = models / f"{name}.md"
        atomic_write_text(page, model_page(entry, _verdicts(validation, name), img, entries, baselines))
        written.append(page)
    atomic_write_text(models / "index.md", index_page(entries, validation))
    atomic_write_text(models / "_preview.md", preview(entries))  # the home page includes it
    atomic_write_text(DOCS / "reference" / "recipes.md", recipes_reference())
    summary, reports = benchmarks_page()
    atomic_write_text(DOCS / "reference" / "benchmarks.md", summary)
    for name, text in reports.items():
        atomic_write_text(DOCS / "reference" / "results" / name, text)
    atomic_write_text(DOCS / "reference" / "variants.md", kinds_reference())
    return [*written, models / "index.md", *(DOCS / "reference" / f"{page}.md" for page in ("recipes", "benchmarks", "variants"))]


def kinds_reference() -> str:
    """The variant kinds table (zoo.variants), as the code reads it."""
    lines = ["# Variant kinds", "", "Generated from the one table of variant kinds (`zoo/variants/__init__.py`): build, export, "
             "fetch, validate, evaluate, the docs and the CLI all read these fields.", "",
             "| kind | file | precision | quantization | made | how | re-measured within | compared with fp32 by |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    made = {"training": "by training (published)", "from-fp32": "from the fp32 file (`zoo fetch` makes it)",
            "retraining": "by a retraining recipe (published)"}
    reference = {"outputs": "logits within {atol}", "labels": "labels agree on {agreement:.0%}",
                 "artifacts": "its untouched export, as fp32", "retrained": "the fp32 sha256 it started from"}
    for k, kind in KINDS.items():
        compared = reference[kind.reference].format(atol=kind.atol, agreement=kind.label_agreement)
        lines.append(f"| `{k}` | `{kind.file}` | {kind.precision} | {kind.quantization} | {made[kind.made]} | "
                     f"{kind.summary} | {kind.tolerance} | {compared} |")
    lines += ["", "int8 kinds also keep their accuracy drop against fp32 within the recipe's "
                  "`quantization.max_accuracy_drop`."]
    return "\n".join(lines) + "\n"


BENCHMARK_PAGES = ["baselines.md", "tokenization.md", "latency.md", "profiles.md", "parallel.md", "training.md",
                   "fetch_throughput.md", "validation.md"]


def _summary(report: list[str]) -> list[str]:
    """A report's first paragraph after its title (its measurement conditions or its headline)."""
    body = [line for line in report[1:]]
    while body and (not body[0].strip() or body[0].startswith("#")):  # blank lines and sub-headings before it
        body.pop(0)
    end = next((i for i, line in enumerate(body) if not line.strip()), len(body))
    return body[:end]


def benchmarks_page() -> tuple[str, dict[str, str]]:
    """The Benchmarks page (each report's title, its first paragraph and a link) and the full reports, one page each
    (`make benchmarks` writes them; each is its own run, apart from the cards' builds)."""
    lines = ["# Benchmarks", "", "Measured by the scripts in `benchmarks/`, each in its own run on the machine it names "
             "(not the runs that built the cards: a card's numbers come from its `zoo build`); ratios are side by side "
             "in one run. `make benchmarks` re-measures. Each model's page has its card's latency.", ""]
    pages: dict[str, str] = {}
    for name in BENCHMARK_PAGES:
        path = RESULTS / name
        if not path.exists():
            continue
        report = path.read_text().splitlines()
        # A heading names the report; what it was measured with (a title's parentheses) goes under it.
        title, _, conditions = report[0].lstrip("# ").strip().partition(" (")
        under = [f"Conditions: {conditions.removesuffix(')')}.", ""] if conditions else []
        pages[name] = "\n".join([f"# {title}", "", *under, *report[1:]]).rstrip() + "\n"
        lines += [f"## {title}", "", *under, *_summary(report), "", f"[Full report](results/{name}) · "
                  f"`benchmarks/results/{name}`", ""]
    gpu = RESULTS / "gpu" / "gpu_check.log"
    if gpu.exists():
        pages["gpu_check.md"] = "# GPU / NCCL check\n\n```\n" + gpu.read_text().strip() + "\n```\n"
        device = gpu.read_text().splitlines()[0].split(" (UUID")[0]  # nvidia-smi -L's first line: "GPU 0: <model>"
        lines += ["## GPU / NCCL check (`benchmarks/gpu_check.sh`)", "", f"Last run on {device.partition(': ')[2]}; "
                  "this project's CI machines have no GPU, so it runs only where one is present.", "",
                  "[Full log](results/gpu_check.md)", ""]
    return "\n".join(lines), pages
