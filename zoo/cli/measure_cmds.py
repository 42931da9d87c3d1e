"""Measuring and using entries: evaluate, validate, bench, register, finetune."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Column, Table

from zoo import catalog
from zoo.errors import ZooError
from zoo.fsutil import atomic_write_text, plural
from zoo.kinds import kind_of
from zoo.cli.app import app, out, err, say, short_hash, fitted_table, metric_text


@app.command()
def evaluate(name: str, variant: list[str] = typer.Option(None, help="Variants (default: all built ones)."),
             split: str = typer.Option("test", help="Dataset split."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Measure a model's variants next to its card.

    Fetch them and measure their accuracy with onnxruntime, next to the card's numbers."""
    from zoo.validate import evaluate_variant  # lazy: torch + onnxruntime (~5 s)

    card = catalog.get_card(name)
    keys = variant or [k for k, v in card.variants.items() if v.built]
    rows = [evaluate_variant(name, k, split, show_progress=not as_json) for k in keys]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("variant", f"accuracy ({split})", "card", "delta", "from", title=name)
    for r in rows:
        table.add_row(r["variant"], metric_text(r["accuracy"]), metric_text(r["card"]),
                      "-" if r["delta"] is None else f"{r['delta']:+.4f}", r["source"])
    out.print(table)


@app.command()
def validate(names: list[str] = typer.Argument(None, help="Entries (default: all)."),
             all_entries: bool = typer.Option(False, "--all", help="Every entry (the default)."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON."),
             report: Optional[Path] = typer.Option(None, help="Also write a markdown report here (and .json beside it)."),
             rebuild_budget: Optional[float] = typer.Option(None, help="Seconds of rebuilding for the whole run (cards' "
                                                            "build times, cheapest entry first) for entries no store has; "
                                                            "the rest are skipped and reported."),
             reproduce_budget: float = typer.Option(0.0, help="Also rebuild from scratch (recipe reproducibility) "
                                                    "entries a store had, when their build takes at most this long."),
             jobs: int = typer.Option(1, min=1, help="Entries validated side by side, one process each (each "
                                      "onnxruntime session uses one thread).")) -> None:
    """Re-measure every variant of every entry against its card.

    The exit is non-zero on any failure."""
    from zoo.validate import markdown_report, rows_json, validate as run_validation  # lazy: torch + onnxruntime (~5 s)

    rows, seconds = run_validation(None if all_entries else names or None, log=lambda m: err.print(m, markup=False),
                                   rebuild_budget=rebuild_budget, reproduce_budget=reproduce_budget, jobs=jobs)
    if report is not None:  # markdown for people and the docs, JSON beside it for the docs generator
        atomic_write_text(report, markdown_report(rows, seconds))
        atomic_write_text(report.with_suffix(".json"), rows_json(rows, seconds) + "\n")
    if as_json:
        print(rows_json(rows, seconds))
    else:
        table = Table("entry", "variant", "check", "verdict", "measured", "card", "delta", "detail",
                      title=f"zoo validate ({seconds:.0f} s)")
        fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
        for r in sorted(rows, key=lambda r: r.ok):
            table.add_row(r.entry, r.variant, r.check, r.verdict.replace("FAIL", "[red]FAIL[/red]"), fmt(r.measured),
                          fmt(r.card), "" if r.delta is None else f"{r.delta:+.4f}", r.detail)
        out.print(table)
    failed = [r for r in rows if not r.ok]
    if failed:
        raise ZooError(f"{plural(len(failed), 'validation check')} failed, first: {failed[0].entry} {failed[0].variant} "
                       f"{failed[0].check}: {failed[0].detail}")


@app.command()
def bench(name: str,
          variant: list[str] = typer.Option(None, help="Only these variants (fp32 is always timed beside them)."),
          threads: int = typer.Option(1, help="onnxruntime intra-op threads."),
          batch: list[int] = typer.Option(None, help="Batch sizes (default: 1 and 32)."),
          runs: int = typer.Option(30, help="Timed runs per file and batch, after a warm-up."),
          full: bool = typer.Option(False, "--full", help="Whole sha256 values."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Time an entry's variants side by side on this machine.

    The card's files (fetched, verified) in onnxruntime, interleaved round by round: median and p90 latency and the
    speed over the faster fp32 (for transformers fp32 after onnxruntime's optimizer too), with the CPU named."""
    from zoo.bench import TORCH_AO_DYNAMIC, TORCH_EAGER, bench as run_bench  # lazy: torch + onnxruntime (~5 s)

    report = run_bench(name, variant or None, threads, tuple(batch or (1, 32)), runs)
    if as_json:
        print(json.dumps({**report, "files": [r.__dict__ for r in report["files"]]}, indent=2))
        return
    cpu = report["cpu"]
    say(f"{cpu['model']} ({' '.join(cpu['flags'])}), onnxruntime {report['libraries'].get('onnxruntime', '?')}, "
        f"{plural(threads, 'thread')}, median of {runs} runs, {report['date']}", label=f"{name} on ")
    columns = [("variant", 0), ("sha256", 4), ("accuracy", 3)]
    for b in report["batches"]:
        columns += [(f"b{b} ms", 1), (f"b{b} p90", 5), (f"b{b} speed", 2)]
    made_here = {TORCH_EAGER: "(PyTorch)", TORCH_AO_DYNAMIC: "(PyTorch)"}
    rows = [[r.variant, short_hash(r.sha256, full) if r.sha256 else made_here.get(r.variant, "(made here)"),
             metric_text(r.accuracy),
             *(cell for b in report["batches"] for cell in (f"{r.median_ms[b]:.3f}", f"{r.p90_ms[b]:.3f}",
                                                             f"{r.speed[b]:.2f}x"))] for r in report["files"]]
    out.print(fitted_table(columns, rows))
    say("speed: the faster fp32's median over the variant's (above 1x: faster); accuracy: the card's"
        + (f"; {TORCH_EAGER} and {TORCH_AO_DYNAMIC}: the fp32 file's weights in PyTorch, eager and after torch.ao's "
           "dynamic int8 of its Linear layers, accuracy measured here" if any(r.variant == TORCH_EAGER
                                                                              for r in report["files"]) else ""))
    peak = report["int8_peak"]
    say(f"int8 can be at most {peak['ratio']:.2f}x fp32 in the matrix products on this CPU: {peak['instructions']}")


@app.command()
def register(names: list[str] = typer.Argument(None, help="Entries to register."),
             all_entries: bool = typer.Option(False, "--all", help="Every built entry."),
             tracking_uri: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: sqlite under "
                                                        "$ZOO_HOME, the one training runs log to)."),
             variant: list[str] = typer.Option(None, help="Only these variants (default: every built ONNX one)."),
             move_aliases: bool = typer.Option(False, "--move-aliases", help="Move an alias that points at a version "
                                               "holding another file (default: report it and leave it)."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Register entries in MLflow's model registry.

    Each built ONNX variant becomes a version of zoo.NAME (ONNX flavor,
    the card as tags, aliases fp32, int8-qat, ..., fastest); load one with
    mlflow.pyfunc.load_model("models:/zoo.NAME@int8-qat"). Registering twice adds nothing."""
    targets = [n for n in catalog.list_models() if catalog.get_card(n).inference_variants()] if all_entries \
        else (names or [])
    if not targets:
        raise ZooError("name an entry to register, or pass --all")
    for name in targets:  # an unknown entry or variant is refused before MLflow loads (~5 s)
        catalog.get_card(name).registrable_variants(variant or None)
    from zoo.registry import model_uri, register as register_entry  # lazy: mlflow + onnx; `zoo list` must not wait
    results = {name: register_entry(name, tracking_uri, variant or None, move_aliases=move_aliases,
                                    log=lambda line: err.print(line, markup=False, highlight=False))
               for name in targets}
    if as_json:
        print(json.dumps({name: [{**r.__dict__, "uri": model_uri(name, r.variant)} for r in rows]
                          for name, rows in results.items()}, indent=2))
    else:
        table = Table("entry", "variant", "version", Column("status"), "aliases", title="MLflow model registry")
        for name, rows in results.items():
            for r in rows:
                table.add_row(name, r.variant, str(r.version), "new" if r.new else "already there",
                              ", ".join(r.aliases) or "-")
        out.print(table)
        first = next(iter(results))
        out.print(f'load one: mlflow.pyfunc.load_model("{model_uri(first, results[first][0].variant)}")',
                  markup=False, highlight=False)
    conflicts = [c for rows in results.values() for r in rows for c in r.conflicts]
    if conflicts:
        raise ZooError(f"{len(conflicts)} alias(es) left on versions holding other files, e.g. {conflicts[0]}; "
                       "pass --move-aliases to move them")


@app.command()
def finetune(name: str,
             onnx_only: bool = typer.Option(False, "--onnx", help="Train the fetched fp32 ONNX with onnxruntime-training "
                                            "(required: the PyTorch route is `torchrun launchers/...`)."),
             data: Optional[Path] = typer.Option(None, help=".npz with x_train, y_train, x_test, y_test (your data)."),
             shift: Optional[str] = typer.Option(None, help="Instead of --data: the entry's dataset seen through a "
                                                 "shift (rot90, flip, invert), train split to train, test to measure."),
             output: Path = typer.Option(Path("model.finetuned.onnx"), help="Where the fine-tuned ONNX goes."),
             steps: int = typer.Option(200, min=1), lr: float = typer.Option(1e-3, min=0.0),
             batch_size: int = typer.Option(32, min=1), seed: int = typer.Option(0),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Fine-tune an entry on a device, without PyTorch.

    From its fp32 ONNX alone (onnxruntime-training); the new model is measured."""
    from zoo.data.shifts import load_npz, shifted_split  # lazy: torch + onnxruntime (~5 s)
    from zoo.ondevice.finetune import finetune as run_finetune  # lazy: torch + onnxruntime (~5 s)
    from zoo.store.fetch import fetch  # lazy: torch + onnxruntime (~5 s)

    if not onnx_only:
        raise ZooError("zoo finetune trains the ONNX file: pass --onnx (PyTorch fine-tuning: torchrun launchers/ddp.py "
                       "--recipe R init_from=...)")
    if (data is None) == (shift is None):
        raise ZooError("give exactly one of --data FILE.npz and --shift NAME")
    card = catalog.get_card(name)
    if data is not None:
        train, test = load_npz(data)
    else:
        train, test = shifted_split(card.dataset.name, shift, "train"), shifted_split(card.dataset.name, shift, "test")
    fp32 = fetch(name, "fp32", show_progress=not as_json).path
    # The entry's published training artifacts when it has them (what a device downloads), else made here.
    published = next((fetch(name, k, show_progress=not as_json).path for k, v in card.variants.items()
                      if kind_of(k, v).reference == "artifacts" and v.built), None)
    result = run_finetune(fp32, train, test, output, steps, lr, batch_size, seed, show_progress=not as_json,
                          published=published)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    table = Table("", "accuracy on the new data", title=f"{name}: on-device fine-tuning ({steps} steps, {result['trainable']} "
                                                          "trainable initializers)")
    table.add_row("before (fetched fp32)", metric_text(result["accuracy_before"]))
    table.add_row("after", metric_text(result["accuracy_after"]))
    out.print(table)
    out.print(f"loss {result['first_loss']:.4f} -> {result['final_loss']:.4f}; wrote {output} "
              f"(sha256 {result['output_sha256'][:16]}…); artifacts: {result['artifacts']}")
