"""Reading the catalog: list, card, info, fetch, predict."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from zoo import catalog
from zoo.config import lfs_remote_urls, repo_store
from zoo.errors import ZooError
from zoo.fsutil import plural
from zoo.store.cache import ObjectCache, lfs_objects, object_relpath
from zoo.pointer import read_pointer
from zoo.kinds import KINDS, kind_of, slower_than_fp32
from zoo.cli.app import app, out, err, say, short_hash, fitted_table, human, metric_text


@app.command("list")
def list_cmd(task: Optional[str] = typer.Option(None, help="Only models for this task."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the catalog's models."""
    names = catalog.list_models(task)
    broken = catalog.broken() if task is None else {}
    if as_json:
        print(json.dumps([catalog.get_card(n).model_dump(mode="json", exclude_none=True) for n in names]
                         + [{"name": n, "error": e} for n, e in broken.items()], indent=2))
        return
    rows = []
    for name in names:
        card = catalog.get_card(name)
        others = [k if v.built else f"{k}*" for k, v in card.variants.items() if k != "fp32"]
        rows.append([name, card.task, card.family, f"{card.num_params:,}", metric_text(card.metric("fp32")),
                     " ".join(others)])
    # Columns in the order shown, with the priority they keep at narrow widths (0 first): one line per entry.
    columns = [("name", 0), ("task", 3), ("family", 5), ("params", 4), ("fp32", 1), ("other variants", 2)]
    out.print(fitted_table(columns, rows))
    say("fp32: the fp32 file's test accuracy (`zoo card NAME`: every variant's)")
    if any(not v.built for n in names for v in catalog.get_card(n).variants.values()):
        say("* not built yet: `zoo build NAME`")
    for name, error in broken.items():
        say(f"{name}: {error}", label="broken: ")


@app.command()
def card(name: str, full: bool = typer.Option(False, "--full", help="Every column, whatever the width.")) -> None:
    """Render a model's card."""
    c = catalog.get_card(name)
    # Card text is data, not markup: say() prints it as written ("[batch, 64]", "<pkg>").
    say(f"{c.task} ({c.family}), {c.num_params:,} parameters, licence {c.license}", label=f"{c.name} — ")
    say(c.description)
    out.print()
    say(f"{c.dataset.name}: {c.dataset.source} (licence {c.dataset.license}); "
        + ", ".join(f"{k} {v:,}" for k, v in c.dataset.splits.items()), label="Dataset ")
    say("", label="Preprocessing")
    for i, step in enumerate(c.preprocessing, 1):
        say(step, indent="  ", label=f"{i}. ")
    for title, tensors in (("Inputs ", c.inputs), ("Outputs ", c.outputs)):
        say("; ".join(f"{t.name} {t.dtype} [{', '.join(map(str, t.shape))}]" for t in tensors), label=title)
    from zoo.metrics import wilson_interval  # lazy: numpy (~0.13-0.3 s), which most commands never need

    tested = c.dataset.splits.get("test")
    rows = []
    for key, v in c.variants.items():
        kind = " ".join(p for p in (v.precision, "" if v.quantization == "none" else v.quantization,
                                    "" if kind_of(key, v).inference else v.format) if p)
        metric = v.metrics.get(c.primary_metric)
        own_data = kind_of(key, v).reference == "retrained"  # measured on its recipe's data, not the card's split
        interval = ("[{:.4f}, {:.4f}]".format(*wilson_interval(metric, tested))
                    if metric is not None and tested and not own_data else "-")
        rows.append([key, kind + (f" (recipe {v.recipe})" if v.recipe else ""), str(v.opset),
                     metric_text(metric) + ("*" if own_data else ""), interval, f"±{v.tolerance:g}",
                     human(v.size) if v.sha256 else "not built",
                     *(f"{v.speed.at(b).vs_fp32:.2f}x" if v.speed else "-" for b in (1, 32))])
    columns = [("variant", 0), ("type", 5), ("opset", 7), (c.primary_metric, 1), ("95% interval", 4),
               ("tolerance", 6), ("size", 3), ("speed b1", 2), ("speed b32", 2)]
    out.print(fitted_table(columns if not full else [(h, 0) for h, _ in columns], rows, title="Variants"))
    say(f"{c.primary_metric} on the {tested:,} test examples; 95% interval: Wilson; tolerance: how far a "
        "re-measurement may fall below it (other CPU kernels)" if tested else "")
    if any(kind_of(k, v).reference == "retrained" for k, v in c.variants.items()):
        say("* measured on the data of the recipe that retrained it, not the card's test split")
    timed = [v.speed for v in c.variants.values() if v.speed]
    if timed:
        cpu = c.training.cpu
        threads = timed[0].threads
        say(f"fp32's latency over the variant's (above 1x: faster), onnxruntime, {threads} "
            f"{'thread' if threads == 1 else 'threads'}, median of {timed[0].runs} runs"
            + (f", on {cpu.model} ({' '.join(cpu.flags)})" if cpu else ""), label="speed: ", indent="  ")
        for who, why in slower_than_fp32(c):  # one sentence per reason, naming every variant it applies to
            say(f"{who} on this CPU: {why}", indent="  ")
        say(f"batch 1 {c.fastest(1)}, batch 32 {c.fastest(32)} (`zoo fetch {c.name} --fastest [--batch 32]`)",
            label="fastest within tolerance: ", indent="  ")
    summaries: dict[str, list[str]] = {}
    for key, v in c.variants.items():
        summaries.setdefault(kind_of(key, v).summary, []).append(key)
    for summary, keys in summaries.items():
        say(summary, label=f"{', '.join(keys)}: ", indent="  ")
    say("every parameter" if c.trainable == ["*"] else ", ".join(c.trainable), label="Trainable on a device ")
    t = c.training
    say(f"`{t.command}`" + (f" (recipe {t.recipe}, seed {t.seed})" if t.recipe else ""), label="Produced by ")
    if t.library_versions:
        say(", ".join(f"{k} {v}" for k, v in t.library_versions.items()), indent="  ")
    if t.git_commit:
        say(f"commit {t.git_commit}" + (f" (reproducible: `zoo reproduce {c.name}`)" if t.reproducible
                                        else " (built from uncommitted changes: not reproducible)"), indent="  ")
    if t.cpu:
        say(f"on {t.cpu.model} ({' '.join(t.cpu.flags)}); {t.cpu.kernels or 'native kernels'}", indent="  ")
    fp32 = c.variants["fp32"]
    if fp32.opset_range:
        say(f"opsets {fp32.opset_range[0]}-{fp32.opset_range[1]}: `zoo fetch {c.name} --opset N`", indent="  ")


@app.command()
def info(name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON."),
         full: bool = typer.Option(False, "--full", help="Whole sha256 values.")) -> None:
    """A model's card data and where its files are."""
    entry = catalog.get_entry(name)
    data = entry.card.model_dump(mode="json", exclude_none=True)
    data["entry_dir"] = str(entry.dir)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    c = entry.card
    say(f"{c.task}, {c.family}, {c.num_params:,} parameters", label=f"{c.name}: ")
    say(str(entry.dir / "card.yaml"), label="card: ")
    cache, store, mirrors = ObjectCache(), repo_store(), lfs_remote_urls()
    for key, v in c.variants.items():
        path = entry.dir / v.file
        pointer = read_pointer(path) if path.is_file() else None
        if not v.built:
            where = "not built"
        elif path.is_file() and pointer is None:
            where = f"{path} (in the checkout)"
        elif pointer is not None and cache.get(pointer, verify=False) is not None:
            where = f"{cache.path(pointer.oid)} (cached)"
        elif pointer is not None and store is not None and (lfs_objects(store) / object_relpath(pointer.oid)).is_file():
            where = f"{lfs_objects(store) / object_relpath(pointer.oid)} (the repository's store)"
        elif mirrors:
            where = (f"not on this machine{'' if store is None else ' nor in the repository store'}; `zoo fetch "
                     f"{c.name} --variant {key}` asks the {len(mirrors)} "
                     f"{'mirror' if len(mirrors) == 1 else 'mirrors'} configured")
        else:
            where = (f"not on this machine{'' if store is None else ' nor in the repository store'}, and no mirror is "
                     f"configured (ZOO_LFS_URL, git's lfs.url): `zoo fetch {c.name} --variant {key}` can only derive "
                     "it from fp32 or build it")
        say(f"sha256 {short_hash(v.sha256, full)}", label=f"{key}: ")
        say(where, indent="  ")
    say(f"(the whole card as JSON: `zoo info {c.name} --json`)")


@app.command()
def fetch(
    name: str,
    variant: str = typer.Option("fp32", help=f"Variant to fetch (the card's keys: {', '.join(KINDS)}, …)."),
    dest: Optional[Path] = typer.Option(None, help="Also copy the file into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    limit_rate: Optional[float] = typer.Option(None, help="Cap the download rate (bytes per second)."),
    opset: Optional[int] = typer.Option(None, help="The fp32 weights at this opset (any in the card's opset_range; "
                                        "re-exported from fp32 when no store has it)."),
    fastest: bool = typer.Option(False, "--fastest", help="The variant with the lowest latency on the card (CPU and "
                                 "threads it names) whose accuracy is within its tolerance of fp32."),
    batch: int = typer.Option(1, help="With --fastest: the batch size you will run, 1 or 32."),
    build: Optional[bool] = typer.Option(None, "--build/--no-build", help="When no store has a file only training "
                                         "makes (fp32, int8-qat): build it from the recipe at the card's commit, or "
                                         "never (default: ZOO_BUILD_ON_MISS = ask | always | never; ask asks on a "
                                         "terminal and refuses elsewhere)."),
) -> None:
    """Get a model's weights, verified by sha256.

    From the checkout, cache, the configured LFS stores; derived variants
    (int8-ptq, fp16, ort-training, other opsets) no store has are made from the fp32 file and checked; with --build,
    files no store has are built from the entry's recipe and verified the same way."""
    from zoo.store.fetch import fetch as fetch_variant  # lazy: torch + onnxruntime (~5 s)

    if fastest:
        if batch not in (1, 32):
            raise ZooError(f"--batch {batch}: cards record latency at batch 1 and 32; pick one of them")
        c = catalog.get_card(name)
        variant = c.fastest(batch)
        timing = c.variants[variant].speed.at(batch)
        err.print(f"fastest at batch {batch}: {variant} ({timing.median_ms:.3g} ms, {timing.vs_fp32:.2f}x fp32's speed "
                  f"with {plural(c.variants[variant].speed.threads, 'thread')} on "
                  f"{c.training.cpu.model if c.training.cpu else 'the build CPU'})",
                  markup=False, highlight=False)
    result = fetch_variant(name, variant, dest=dest, rate_limit=limit_rate, show_progress=not as_json or sys.stderr.isatty(),
                           opset=opset, build=build)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    card = catalog.get_card(name)
    print(result.path)  # alone on its line: what scripts read
    say(f"size {result.size:,} bytes, sha256 {result.sha256}, source: {result.source}", indent="  ")
    measured = "by the local build" if result.source.startswith("rebuilt locally") else "for the card"
    say(f"{card.primary_metric} {metric_text(result.metrics.get(card.primary_metric))} (as measured {measured})", indent="  ")


@app.command()
def predict(name: str, texts: list[str] = typer.Argument(..., help="Texts to classify."),
            variant: str = typer.Option("fp32", help="The ONNX variant to run (e.g. int8-qat)."),
            top: int = typer.Option(3, min=1, help="How many of the most probable labels to show per text."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Classify texts with an entry's ONNX file (no PyTorch).

    The file is fetched and verified like `zoo fetch`; its tokenizer travels inside it, the labels come from the card."""
    from zoo.predict import classify  # lazy: onnxruntime (~1 s); `zoo list` and `--help` must not wait

    answers = classify(name, texts, variant, top)
    if as_json:
        print(json.dumps(answers, indent=2, ensure_ascii=False))
        return
    rows = [[a["label"], f"{a['probability']:.3f}", ", ".join(f"{t['label']} {t['probability']:.3f}" for t in a["top"][1:]),
             a["text"] if len(a["text"]) <= 50 else a["text"][:49] + "…"] for a in answers]
    out.print(fitted_table([("label", 0), ("p", 1), ("next", 3), ("text", 2)], rows))
