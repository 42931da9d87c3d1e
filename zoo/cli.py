"""The `zoo` command line. Every command mirrors a function of the Python API."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from zoo import catalog
from zoo.config import REPO_STORE, lfs_remote_urls, repo_store
from zoo.errors import ZooError
from zoo.fsutil import atomic_write_text, human_size, plural
from zoo.metrics import wilson_interval
from zoo.provenance import tree_state
from zoo.reproduce import reproduce as run_reproduce
from zoo.store.cache import ObjectCache, lfs_objects, object_relpath
from zoo.pointer import read_pointer
from zoo.store.publish import check_store as run_check
from zoo.store.publish import publish as publish_entry
from zoo.store.publish import store_size
from zoo.store.serve import (DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BATCH_BODY, DEFAULT_MAX_HEAD, DEFAULT_MAX_OBJECT,
                             ServeLimits, exposure_warning, load_secret)
from zoo.store.serve import issue_token as issue_token_for
from zoo.store.serve import serve as run_server
from zoo.kinds import KINDS, kind_of, slower_than_fp32

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,  # plain help: no <bool> on flags
                  help="zoo: a model zoo whose every number is measured.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version  # lazy: only for --version

        try:
            print(f"zoo {version('zoo')}")
        except PackageNotFoundError:  # run from a checkout without `pip install -e .`
            print("zoo (not installed: run from a checkout)")
        raise typer.Exit()


@app.callback()
def _root(show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                            help="Print the version and exit.")) -> None:
    """zoo: a model zoo whose every number is measured."""
out = Console()
err = Console(stderr=True)


def say(text: str, label: str = "", indent: str = "", console: Console = out) -> None:
    """Print `label` (bold) and `text` wrapped at word boundaries for the console's width: never inside a `command`
    in backticks, a hash, a path or a hyphenated name (a token longer than the line keeps a line of its own)."""
    protected = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", NBSP), text)  # textwrap breaks on ASCII spaces only
    lines = textwrap.wrap(f"{label}{protected}", width=max(20, console.width), initial_indent=indent,
                          subsequent_indent=indent + "  ", break_long_words=False, break_on_hyphens=False) or [""]
    body = Text("\n".join(lines).replace(NBSP, " "))
    if label:
        body.stylize("bold", len(indent), len(indent) + len(label))
    console.print(body, soft_wrap=True, highlight=False)


NBSP = "\u00a0"


def short_hash(sha256: str | None, full: bool = False) -> str:
    """A sha256 as tables show it: its first 12 hex digits (`--full` and `--json` give all 64)."""
    return "-" if not sha256 else sha256 if full else sha256[:12]


def fitted_table(columns: list[tuple[str, int]], rows: list[list[str]], console: Console = out, **options) -> Table:
    """A table of the columns that fit the console's width, taken by priority (0 first) and shown in their order:
    a cell never wraps or is cut; a column that does not fit is left out whole (wider terminals show more)."""
    def build(keep: set[int]) -> Table:
        table = Table(*(Column(header, no_wrap=True) for i, (header, _) in enumerate(columns) if i in keep),
                      box=None, padding=(0, 2, 0, 0), pad_edge=False, **options)
        for row in rows:
            table.add_row(*(cell for i, cell in enumerate(row) if i in keep))
        return table

    keep: set[int] = set()
    for index in sorted(range(len(columns)), key=lambda i: columns[i][1]):
        wider = build(keep | {index})
        unbounded = console.options.update_width(10**6)  # its natural width, not clamped to the console's
        if not keep or Measurement.get(console, unbounded, wider).maximum <= console.width:
            keep.add(index)
    return build(keep)


def _human(size: int | None) -> str:
    return "-" if size is None else human_size(size)


def _metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


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
        rows.append([name, card.task, card.family, f"{card.num_params:,}", _metric(card.metric("fp32")),
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
                     _metric(metric) + ("*" if own_data else ""), interval, f"±{v.tolerance:g}",
                     _human(v.size) if v.sha256 else "not built",
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
    say(f"{card.primary_metric} {_metric(result.metrics.get(card.primary_metric))} (as measured {measured})", indent="  ")


@app.command()
def publish(names: list[str] = typer.Argument(None, help="Entries to publish."),
            all_entries: bool = typer.Option(False, "--all", help="Every built entry."),
            to: Optional[str] = typer.Option(None, help="A mirror: LFS Batch API URL or bare repo path (default: "
                                             "the repository's store, store/)."),
            derived: bool = typer.Option(False, "--derived", help="With --to: also the variants `zoo fetch` can make "
                                         "from fp32 (int8-dynamic, fp16, ort-training, other opsets).")) -> None:
    """Publish entries into the repository's store or a mirror.

    The primaries (fp32, int8-qat, int8-ptq, retrained) and test data go into the repository's store
    (or a mirror) and replace them with pointers in the checkout; prints the store's total size. Then commit the
    card, pointers and store together."""
    targets = catalog.list_models() if all_entries else (names or [])
    if not targets:
        raise ZooError("name an entry to publish, or pass --all")
    if all_entries and to is None:  # the repository's store takes the builds of the checked-out commit
        head = tree_state().commit
        skipped = [n for n in targets if catalog.get_card(n).training.git_commit != head]
        targets = [n for n in targets if n not in skipped]
        if skipped:
            err.print(f"not built at {str(head)[:12]} (left as they are): {', '.join(skipped)}", highlight=False)
    for name in targets:
        for p in publish_entry(name, to, derived=derived):
            out.print(f"{'uploaded' if p.uploaded else 'present '} {name}/{p.path.relative_to(catalog.get_entry(name).dir)} "
                      f"{p.sha256[:12]}… {_human(p.size)}")
    to = to or str(REPO_STORE)
    size = store_size(to)
    out.print(f"store {to}: " + (f"{size:,} bytes ({size / 2**20:.1f} MiB) in all" if size is not None else
                                 "total size unknown (an HTTP store does not list its objects)"))


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
    from zoo.registry import model_uri, register as register_entry  # lazy: mlflow + onnx; `zoo list` must not wait

    targets = [n for n in catalog.list_models() if catalog.get_card(n).inference_variants()] if all_entries \
        else (names or [])
    if not targets:
        raise ZooError("name an entry to register, or pass --all")
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
    from zoo.bench import bench as run_bench  # lazy: torch + onnxruntime; `zoo list` and `--help` must not wait

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
    rows = [[r.variant, short_hash(r.sha256, full) if r.sha256 else "(made here)", _metric(r.accuracy),
             *(cell for b in report["batches"] for cell in (f"{r.median_ms[b]:.3f}", f"{r.p90_ms[b]:.3f}",
                                                             f"{r.speed[b]:.2f}x"))] for r in report["files"]]
    out.print(fitted_table(columns, rows))
    say("speed: the faster fp32's median over the variant's (above 1x: faster); accuracy: the card's")


@app.command("check-store")
def check_store(store: Optional[str] = typer.Argument(None, help="LFS URL or bare repo (default: the configured stores)."),
                derived: bool = typer.Option(False, "--derived", help="Also expect the derived variants."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Check a store: the card objects it lacks or holds corrupt.

    Every byte is hashed; the exit is non-zero if any is missing or corrupt."""
    stores = [store] if store else [str(s) for s in [repo_store()] if s] + lfs_remote_urls()
    if not stores:
        raise ZooError("no store configured: name one, or set ZOO_LFS_URL")
    bad = 0
    for url in stores:
        problems, total = run_check(url, derived=derived)
        bad += len(problems)
        if as_json:
            print(json.dumps({"store": url, "objects": total, "problems": [p.__dict__ for p in problems]}, indent=2))
            continue
        out.print(f"{url}: {total} card objects, {len(problems)} missing or corrupt")
        for p in problems:
            out.print(f"  {p.status:8} {p.entry} {p.label} ({p.path}) sha256 {p.sha256}")
    if bad:
        raise ZooError(f"{plural(bad, 'card object')} missing or corrupt in the stores: publish them with "
                       "`zoo publish NAME [--to STORE]` from a build of the card's commit")


@app.command()
def manifest(check: bool = typer.Option(False, help="Fail if the committed manifest differs from the cards.")) -> None:
    """Regenerate the manifest and the README's generated tables.

    entries/MANIFEST.json from the cards, and the README's catalog and launcher tables (or check them)."""
    from zoo.train.parallel import matrix_markdown  # lazy: torch; only this command renders the launcher matrix

    path = catalog.manifest_path()
    readme = catalog.README.read_text() if catalog.README.exists() else ""
    matrix = catalog.replace_block(readme, *catalog.LAUNCHER_MATRIX, matrix_markdown())
    if check:
        if not path.exists() or path.read_text() != catalog.manifest_text():
            raise ZooError(f"{path} is out of date with the cards; run `zoo manifest` and commit it")
        if matrix != readme:
            raise ZooError(f"{catalog.README}: the launcher matrix is out of date; run `zoo manifest` and commit it")
        out.print(f"{path}: up to date")
        return
    if matrix != readme:
        atomic_write_text(catalog.README, matrix)
    out.print(f"wrote {catalog.write_manifest()}")


@app.command()
def build(names: list[str] = typer.Argument(None, help="Entries to build."),
          all_entries: bool = typer.Option(False, "--all", help="Build every entry that has a recipe."),
          nproc: int = typer.Option(2, help="Training processes (torchrun --nproc_per_node)."),
          threads: int = typer.Option(1, help="Threads per process (fixed for reproducible bytes)."),
          no_train: bool = typer.Option(False, "--no-train", help="Only write the card's static fields "
                                        "(dataset, parameter count, inputs/outputs, planned variants)."),
          allow_dirty: bool = typer.Option(False, "--allow-dirty", help="Build from a tree with uncommitted changes "
                                           "(recorded on the card as not reproducible).")) -> None:
    """Build entries from their recipes and write their cards.

    Train, export, measure and write the cards' measured fields, from a clean, committed tree."""
    from zoo.build import build as build_entry, describe  # lazy: torch + onnxruntime (~5 s)

    targets = catalog.list_models() if all_entries else (names or [])
    if all_entries:
        targets = [n for n in targets if catalog.get_card(n).training.recipe]
    if not targets:
        raise ZooError("name an entry to build, or pass --all")
    for name in targets:
        if no_train:
            out.print(f"described {name}: {describe(name)}")
            continue
        path = build_entry(name, nproc=nproc, threads=threads, log=lambda m: err.print(m, markup=False),
                           allow_dirty=allow_dirty, writes=targets)
        out.print(f"built {name}: {path}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(ctx: typer.Context,
          nproc_per_node: int = typer.Option(1, "--nproc-per-node", help="Training processes on this node."),
          nnodes: int = typer.Option(1, help="Nodes in the job (each runs this command)."),
          node_rank: int = typer.Option(0, "--node-rank", help="This node's rank (0 .. nnodes-1)."),
          rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT every node meets at "
                                                      "(needed with --nnodes > 1)."),
          max_restarts: int = typer.Option(0, "--max-restarts", help="Restart failed workers this many times "
                                           "(they resume from the newest checkpoint)."),
          launcher: Optional[str] = typer.Option(None, help="ddp, fsdp, deepspeed, tensor_parallel or pipeline "
                                                 "(default: the one implementing the recipe's parallelism).")) -> None:
    """Train with a recipe under torchrun, checking it first.

    E.g. `zoo train --recipe qat-int8 --nproc-per-node 2
    steps=50`. Other options (--recipe, --model, --backend, --output-dir, --resume, --no-tracking, key=value) go to
    the launcher, as with `torchrun launchers/NAME.py`."""
    from zoo.train.launch import torchrun  # lazy: torch loads in seconds; `zoo list` and `--help` must not wait for it

    torchrun(list(ctx.args), nproc_per_node, nnodes, node_rank, rdzv_endpoint, max_restarts, launcher)


@app.command()
def reproduce(name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Rebuild an entry at its card's commit and compare sha256s.

    The build runs in a temporary git worktree; every file's sha256 is compared with the card."""
    r = run_reproduce(catalog.get_entry(name), log=lambda m: err.print(m, markup=False))
    if as_json:
        print(json.dumps({"entry": r.entry, "commit": r.commit, "identical": r.identical, "comparable": r.comparable,
                          "differences": r.differences,
                          "files": [{**f.__dict__, "same": f.same} for f in r.files]}, indent=2))
    else:
        out.print(f"{name} at commit {r.commit}:")
        for f in r.files:
            out.print(f"  {'same     ' if f.same else 'DIFFERENT'} {f.file}\n    card    {f.card_sha256}\n"
                      f"    rebuilt {f.rebuilt_sha256 or '(not produced)'}")
        if r.differences:
            out.print("this machine differs from the card's build: " + "; ".join(r.differences))
    if not r.identical:
        raise ZooError(f"{sum(not f.same for f in r.files)} of {plural(len(r.files), 'file')} of '{name}' did not reproduce"
                       + ("" if r.comparable else " (expected: " + "; ".join(r.differences) + ")"))


_FROM_FP32 = ", ".join(k for k, kind in KINDS.items() if kind.made == "from-fp32")


@app.command("export")
def export_cmd(name: str, variant: list[str] = typer.Option(..., help=f"Variants to make from the fp32 file ({_FROM_FP32}) "
                                                            "that the entry's recipe does not make, or one the card "
                                                            "declares with `recipe:` (federated retraining).")) -> None:
    """Make variants from an entry's fp32 file (no retraining).

    The fp32 file is fetched; the variants are written into the entry and its card."""
    from zoo.build import export_variant  # lazy: torch + onnxruntime (~5 s)

    for key in variant:
        path = export_variant(name, key, log=lambda m: err.print(m, markup=False))
        v = catalog.get_card(name).variants[key]
        out.print(f"exported {name} {key}: {path} ({_human(v.size)}, sha256 {v.sha256[:12]}…, "
                  f"accuracy {_metric(v.metrics.get('accuracy'))})")


@app.command("import")
def import_cmd(name: str, source: str = typer.Option(..., "--from", help="Checkpoint folder (config.json + "
                                                    "model.safetensors), or hf:<repo id> from the local Hugging Face "
                                                    "cache (offline), e.g. hf:bert-base-uncased."),
               nproc: int = typer.Option(2, help="Fine-tuning processes."),
               threads: int = typer.Option(1, help="Threads per process."),
               allow_dirty: bool = typer.Option(False, "--allow-dirty", help="Build from a tree with uncommitted "
                                                "changes (recorded as not reproducible).")) -> None:
    """Import an upstream BERT checkpoint as a zoo entry.

    Parity check against transformers, then fine-tune a task head and make every variant."""
    from zoo.build import import_entry  # lazy: torch + onnxruntime (~5 s)

    from zoo.importer import resolve_source  # lazy: with the build

    path = import_entry(name, resolve_source(source), nproc, threads, log=lambda m: err.print(m, markup=False),
                        allow_dirty=allow_dirty)
    out.print(f"imported {name}: {path}")


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
        table.add_row(r["variant"], _metric(r["accuracy"]), _metric(r["card"]),
                      "-" if r["delta"] is None else f"{r['delta']:+.4f}", r["source"])
    out.print(table)


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
    table.add_row("before (fetched fp32)", _metric(result["accuracy_before"]))
    table.add_row("after", _metric(result["accuracy_after"]))
    out.print(table)
    out.print(f"loss {result['first_loss']:.4f} -> {result['final_loss']:.4f}; wrote {output} "
              f"(sha256 {result['output_sha256'][:16]}…); artifacts: {result['artifacts']}")


@app.command()
def validate(names: list[str] = typer.Argument(None, help="Entries (default: all)."),
             all_entries: bool = typer.Option(False, "--all", help="Every entry (the default)."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON."),
             report: Optional[Path] = typer.Option(None, help="Also write a markdown report here (and .json beside it)."),
             rebuild_budget: Optional[float] = typer.Option(None, help="Seconds of rebuilding for the whole run (cards' "
                                                            "build times, cheapest entry first) for entries no store has; "
                                                            "the rest are skipped and reported."),
             reproduce_budget: float = typer.Option(0.0, help="Also rebuild from scratch (recipe reproducibility) "
                                                    "entries a store had, when their build takes at most this long.")) -> None:
    """Re-measure every variant of every entry against its card.

    The exit is non-zero on any failure."""
    from zoo.validate import markdown_report, rows_json, validate as run_validation  # lazy: torch + onnxruntime (~5 s)

    rows, seconds = run_validation(None if all_entries else names or None, log=lambda m: err.print(m, markup=False),
                                   rebuild_budget=rebuild_budget, reproduce_budget=reproduce_budget)
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
def vocabulary() -> None:
    """Train the langid-16k WordPiece vocabulary anew.

    On the training split's sample; it is written into the checkout
    (zoo/data/vocab/): a deliberate change, after which every entry trained on it is rebuilt."""
    from zoo.data.langid import write_vocabulary  # lazy: torch loads with the datasets; `zoo --help` must not wait

    out.print(f"wrote {write_vocabulary()}; rebuild every entry on this dataset (zoo build NAME)")


@app.command()
def docs() -> None:
    """Generate the docs site's pages from the cards.

    Model pages and references (then `mkdocs build`)."""
    from zoo.docs import generate  # lazy: torch + onnxruntime (~5 s)

    for path in generate():
        out.print(f"wrote {path}")


@app.command()
def serve(storage: Path = typer.Option(None, help="Folder for the objects."),
          host: str = typer.Option("127.0.0.1", help="Address to listen on; for a public mirror put a TLS proxy in "
                                                      "front (docs/guides/stores.md: Run a public mirror)."),
          port: int = typer.Option(8080),
          secret_file: Path = typer.Option(None, help="File holding the signing secret (else $ZOO_SERVE_SECRET): "
                                                      "upload tokens and action links are signed with it."),
          anonymous_writes: bool = typer.Option(False, help="Let anyone upload (tests, loopback-only use)."),
          issue_token: bool = typer.Option(False, help="Print an upload token signed with the secret, then exit."),
          expires: int = typer.Option(3600, help="Lifetime of an issued token, seconds."),
          subject: str = typer.Option("publisher", help="Who an issued token is for (shown in the request log)."),
          max_object_size: int = typer.Option(DEFAULT_MAX_OBJECT, help="Largest object accepted, bytes."),
          max_batch_body: int = typer.Option(DEFAULT_MAX_BATCH_BODY, help="Largest batch request body, bytes."),
          max_head: int = typer.Option(DEFAULT_MAX_HEAD, help="Largest request line and headers, bytes."),
          body_timeout: int = typer.Option(DEFAULT_BODY_TIMEOUT, help="Seconds a client may send nothing of an "
                                                                       "unfinished request before it is closed."),
          access_log: str = typer.Option("-", help="Request log: a file, or - for standard error."),
          no_ranges: bool = typer.Option(False, help="Answer without HTTP Range support (plain giftless).")) -> None:
    """Serve an LFS mirror (giftless) on this machine.

    Anonymous read, uploads with a token (`--issue-token` mints one)."""
    secret = load_secret(secret_file)
    if issue_token:
        if secret is None:
            raise ZooError("--issue-token needs the server's secret: set ZOO_SERVE_SECRET or pass --secret-file")
        if expires <= 0:
            raise ZooError(f"--expires {expires}: a token's lifetime must be a positive number of seconds")
        print(issue_token_for(secret, expires, subject))
        return
    if storage is None:
        raise ZooError("--storage FOLDER is required to serve (the folder objects are kept in)")
    limits = ServeLimits(max_object_size, max_batch_body, max_head, body_timeout)
    warning = exposure_warning(host, anonymous_writes)
    if warning:
        err.print(warning)
    mode = "anonymous read-write" if anonymous_writes else (
        "anonymous read, uploads with a token" if secret else "read-only (no secret: uploads are refused)")
    err.print(f"LFS endpoint: http://{host}:{port}/zoo/models.git/info/lfs ({mode})")
    run_server(storage, host, port, ranges=not no_ranges, secret=secret, anonymous_writes=anonymous_writes,
               limits=limits, access_log=None if access_log == "" else access_log)


class _Watched:
    """stdout, remembering whether a command wrote to it (a JSON report already printed is the answer)."""

    def __init__(self, stream):
        self.stream, self.used = stream, False

    def write(self, text: str) -> int:
        self.used = self.used or bool(text)
        return self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def main() -> None:
    sys.stdout = watched = _Watched(sys.stdout)
    try:
        app(standalone_mode=True)
    except ZooError as exc:
        if "--json" in sys.argv[1:] and not watched.used:  # a caller reading JSON gets JSON, failures included
            print(json.dumps({"error": str(exc), "kind": type(exc).__name__}))
        if err.is_terminal:  # a person reads it: wrapped at word boundaries, never inside a command
            say(str(exc), label="error: ", console=err)
        else:  # a log or a script: one line, whole
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
