"""One model's page, from its card: variants, speed, classic tools, on-device training, how to get and train it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from zoo import catalog
from zoo.cards import ModelCard
from zoo.data import load_dataset
from zoo.docs.baselines import baselines_section
from zoo.docs.common import RESULTS, fmt, load_json, md_text, report_runs, shape_text, size_cell, variant_type
from zoo.docs.plots import plots
from zoo.evaluate import int8_bound, why
from zoo.fsutil import human_size, plural
from zoo.metrics import wilson_interval
from zoo.layouts import LAUNCHERS, LAYOUTS
from zoo.models import model_spec
from zoo.registry import model_name, model_uri
from zoo.recipes import command_processes, import_command, load_recipe
from zoo.store.build_on_miss import build_estimate, buildable
from zoo.kinds import kind_of, slower_than_fp32
from zoo.provenance import cpu_kind, int8_peak

def launcher_commands(architecture: str, recipe: str, processes: int = 2) -> list[str]:
    """Each launcher's command with its default layout (zoo.layouts), for the launchers whose layout this
    architecture supports, with `processes` ranks."""
    spec, args = model_spec(architecture), load_recipe(recipe).model_args
    return [f"{launcher.command.format(n=processes)} --recipe {recipe} --model {architecture}   "
            f"# {launcher.name}" + ("" if launcher.default == launcher.name else f" ({launcher.default})")
            for launcher in LAUNCHERS.values()
            if not (needs := LAYOUTS[launcher.default].model_needs) or spec.offers(needs, **args)]


def validation_verdicts(validation: dict, name: str) -> dict[str, str]:
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


def model_page(entry: catalog.Entry, verdicts: dict[str, str], img_dir: Path, others: dict | None = None,
               baselines: dict | None = None) -> str:
    c = entry.card
    lines = ["---", "hide: [toc]", "---", "", f"# {c.name}", "", md_text(c.description), "",
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
        lines.append(f"{import_command(c.name, command_processes(c.training.command))}   # {c.training.imported_from}")
    lines += launcher_commands(c.architecture, c.training.recipe, max(2, command_processes(c.training.command)))
    lines.append(f"zoo build {c.name}   # train, export, measure, rewrite the card")
    lines += ["```", "", ("Planned: " if not built else "Produced by ") + f"`{c.training.command}`"
              + (f", seed {c.training.seed}" if c.training.seed is not None else "")
              + (f", {plural(c.training.threads, 'thread')} per process" if c.training.threads else "")
              + (f", in {c.training.build_time_s:.0f} s" if c.training.build_time_s else "")
              + (f" on {c.training.cpu.model} ({', '.join(c.training.cpu.flags)})" if c.training.cpu else "")
              + (f", at commit `{c.training.git_commit}` (`zoo reproduce {c.name}` rebuilds it)"
                 if c.training.git_commit and c.training.reproducible else "") + "."]
    if (start := c.training.continued_from) is not None:
        lines += ["", f"Training continued from the `{start.variant}` file `{start.entry}` published before (sha256 "
                  f"`{start.sha256}`, {start.size:,} bytes: the recipe's `init_from`), fetched by its sha256 from "
                  "the stores or, once `store/` no longer holds it, from the commits that did."]
    if c.training.library_versions:
        lines += ["", "Library versions: " + ", ".join(f"{k} {v}" for k, v in c.training.library_versions.items()) + "."]
    d = c.dataset
    lines += ["", "## Dataset", "", f"**{d.name}**: {md_text(d.source)}.", "", f"Licence: {md_text(d.license)}.", "",
              "Splits: " + ", ".join(f"{k} {v:,}" for k, v in d.splits.items()) + "."]
    if d.class_balance:
        lines += ["", "Training examples per class: " + ", ".join(f"{k} {v:,}" for k, v in d.class_balance.items()) + "."]
    lines += ["", "## Preprocessing", ""] + [f"{i}. {md_text(step)}" for i, step in enumerate(c.preprocessing, 1)]
    lines += ["", "## Inputs and outputs", "", "| tensor | name | shape | dtype |", "| --- | --- | --- | --- |"]
    lines += [f"| input | `{t.name}` | {shape_text(t.shape)} | {t.dtype} |" for t in c.inputs]
    lines += [f"| output | `{t.name}` | {shape_text(t.shape)} | {t.dtype} |" for t in c.outputs]
    labels = next((t.labels for t in c.outputs if t.labels), None)
    if labels:
        lines += ["", "Labels: " + ", ".join(f"`{label}`" for label in labels) + "."]
    images = plots(c, entry.dir, img_dir)
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
             + (f" or import {imports} with `{import_command(c.name)}`" if imports else "")
             + (f"; {estimate}" if estimate else "") + ".", "",
             "## Planned variants", "",
             f"The fp32 file will be about {human_size(4 * c.num_params)}: 4 bytes for each of the {c.num_params:,} "
             "parameters of the architecture.", "",
             "| variant | type | made by |", "| --- | --- | --- |"]
    lines += [f"| {key} | {variant_type(v)} | "
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
        lines.append(f"| {label} | {variant_type(v)} | {v.opset} | "
                     f"<span class=\"metric\" data-variant=\"{key}\">{fmt(metric)}</span>{interval} | "
                     f"{verdicts.get(key, verdicts.get('*', 'not run')) if v.built else 'not built'} | {latency} | "
                     f"{speed} | {size_cell(v.size)} |")
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
    lines += [f"- {who} here: {reason}." for who, reason in slower_than_fp32(c)]
    return lines + int8_time(c)


def int8_time(c: ModelCard, profiles: dict | None = None) -> list[str]:
    """For a transformer whose int8-qat file the committed profiles measured (the same sha256): where its time goes,
    and the most int8 could gain on that CPU (its int8 peak, Amdahl's law over the fused fp32 profile); one sentence
    per CPU kind that measured it."""
    profiles = load_json(RESULTS / "profiles.json") if profiles is None else profiles
    # The int8 file made by training (int8-qat): the kinds table says which, not its name.
    trained = [k for k, v in c.variants.items() if kind_of(k, v).int8 and kind_of(k, v).made == "training"]
    key = trained[0] if trained else None
    lines = []
    for run in report_runs(profiles):
        measured = run.get("entries", {}).get(c.name, {})
        qat, fused = measured.get(key), measured.get("fp32-fused")
        if not qat or not fused or qat.get("sha256") != c.variants[key].sha256:
            continue
        peak, instructions = int8_peak(run["cpu"]["flags"])
        lines += ["", f"Where {key}'s time goes on {cpu_kind(run['cpu'])} (onnxruntime's profiler, batch {run['batch']}, "
                      f"{plural(run['threads'], 'thread')}): {why(qat['per_op_us'], Counter(qat['graph']))}. Integer "
                      f"arithmetic speeds up only the matrix products, by at most {peak:.2f}x on that CPU "
                      f"({instructions}); with every other operator as in fp32, the most int8 could gain over the fused "
                      f"fp32 file is {int8_bound(fused['per_op_us'], peak):.2f}x (the latency report's goal table, on "
                      "the Benchmarks page, has each measured speed next to it, and what was tried to close the gap: "
                      "onnxruntime's transformer optimizer on this file, threads that do not spin, the fused int8 "
                      "attention int8-dynamic runs)."]
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
                      "that recipe's evaluation data" + (f": {fmt(m.get('initial_accuracy'))} before the first round, "
                                                         f"{fmt(m.get(c.primary_metric))} after {m.get('rounds', 0):.0f} "
                                                         f"rounds, {fmt(m.get('central_accuracy'))} trained centrally on "
                                                         "the same data" if "initial_accuracy" in m else "") + "."]
    if not c.variants["fp32"].built:  # nothing to fine-tune or remake until the fp32 file exists
        return lines + ["", f"Once `zoo build {c.name}` has made the fp32 file, `zoo finetune {c.name} --onnx` trains "
                            "it on a device and `zoo export` remakes these variants from it."]
    image = len(c.inputs[0].shape) == 4  # the built-in shifts (rot90, flip, invert) are for images
    lines += ["", "```bash", f"zoo finetune {c.name} --onnx " + ("--shift rot90   # or --data your.npz" if image else
                                                                  "--data your.npz   # x_train, y_train, x_test, y_test")]
    lines += [f"zoo export {c.name} --variant {k}   # remake it from the fetched fp32 file" for k in [*artifacts, *retrained]]
    return lines + ["```"]
