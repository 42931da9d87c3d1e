"""What every launcher shares: arguments, recipe loading, process group, clean one-line errors."""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console
from torch.distributed import run as elastic
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record
from rich.table import Table

from zoo.cards import PublishedFile
from zoo.data import load_dataset
from zoo.config import REPO_ROOT
from zoo.errors import ZooError
from zoo.fsutil import atomic_write_text, plural
from zoo.models import model_spec
from zoo.recipes import load_recipe
from zoo.store.history import published_object
from zoo.train.arguments import parse_args
from zoo.train.distributed import init_distributed, resolve_backend, shutdown
from zoo.train.memory import allocator_env
from zoo.layouts import LAUNCHERS, layout, layouts_of, strategy_for
from zoo.train.parallel import unsupported_here
from zoo.run_summary import SUMMARY_FILE, RunSummary
from zoo.train.trainer import run

SWEEP_FILE = "sweep.json"


SWEEP_VALUE = re.compile(r"[A-Za-z0-9.-]+")


def sweep_cells(sweep: list[str], launcher: str) -> list[tuple[str, list[str]]]:
    """The cells of `--sweep KEY=V1,V2 ...`: (folder name, overrides), in order (the last key varies fastest).
    No sweep: one unnamed cell."""
    axes = []
    for item in sweep:
        key, sep, values = item.partition("=")
        names = values.split(",") if sep and key else []
        bad = [v for v in names if not SWEEP_VALUE.fullmatch(Path(v).name if key == "recipe" else v)]
        if not names or bad:
            raise ZooError(f"--sweep {item!r}: expected KEY=V1,V2 with values of letters, digits, '.' and '-' "
                           "(e.g. --sweep precision=fp32,bf16)")
        if key == "parallelism.strategy":
            mine = [lay.name for lay in layouts_of(launcher)]
            if foreign := [v for v in names if v not in mine]:
                raise ZooError(f"--sweep {item}: launchers/{launcher}.py does not run {', '.join(foreign)} "
                               f"(it runs {', '.join(mine)})")
        axes.append([f"{key}={v}" for v in names])
    if len({a[0].partition("=")[0] for a in axes}) != len(axes):
        raise ZooError("--sweep names one key twice; give all its values in one --sweep KEY=V1,V2")
    return [("_".join(_label(o) for o in cell), list(cell)) for cell in itertools.product(*axes)] \
        if axes else [("", [])]


def _label(override: str) -> str:
    key, _, value = override.partition("=")
    return Path(value).stem if key == "recipe" else value  # a recipe given by path: its file name


def prepare(launcher: str, args: argparse.Namespace, extra: list[str] = ()):
    """Everything that can be refused before a process group exists: recipe, model, launcher and backend.
    `extra`: a sweep cell's overrides (`recipe=NAME` picks the recipe itself).

    Workers call it first; `zoo train` calls it before any worker starts, so a bad recipe is one line, once."""
    name = next((o.partition("=")[2] for o in extra if o.startswith("recipe=")), args.recipe)
    overrides = [*args.overrides, *(o for o in extra if not o.startswith("recipe="))]
    if args.no_tracking:
        overrides.append("tracking.enabled=false")
    recipe = load_recipe(name, overrides, model=args.model, backend=args.backend)
    spec = model_spec(recipe.model)  # unknown models fail before any process group exists
    if recipe.federated is not None:
        raise ZooError(f"recipe '{recipe.name}' is federated: python launchers/federated.py run --recipe {recipe.name}")
    resolve_backend(recipe.backend)  # nccl without GPUs, ccl without oneCCL: refused here, writing nothing
    if isinstance(recipe.init_from, PublishedFile):
        published_object(recipe.init_from)  # a published file to continue from that no store has: refused here
    strategy = strategy_for(launcher, recipe.parallelism.strategy)
    if (needs := layout(strategy).model_needs) and not spec.offers(needs, **recipe.model_args):
        raise ZooError(f"recipe '{recipe.name}': parallelism.strategy={strategy} needs a model that declares "
                       f"{needs}() and {recipe.model} does not; pick another layout (zoo.layouts)")
    if recipe.group_by_length:
        if layout(strategy).fixed_shapes:
            raise ZooError(f"recipe '{recipe.name}': group_by_length gives batches of other widths, and "
                           f"parallelism.strategy={strategy}'s pipeline stages exchange one shape; set "
                           "group_by_length=false or pick another layout")
        data = load_dataset(recipe.dataset or spec.dataset)  # cached: the rank's trainer reads the same object
        if data.padding_id is None:
            raise ZooError(f"recipe '{recipe.name}': group_by_length needs text padded at the end, and the "
                           f"{data.name} dataset's inputs have one fixed shape; remove group_by_length")
    if reason := unsupported_here(strategy, recipe.precision):
        raise ZooError(f"recipe '{recipe.name}': {reason}")
    return recipe, strategy


@record  # under torchrun, a rank's uncaught exception lands in its failure report (Root Cause), not only in the log
def launch(launcher: str, args: argparse.Namespace | None = None, init=None) -> None:
    """Run the trainer under `launcher`'s strategy; `args`: the parsed command line (zoo.train.arguments, default
    sys.argv); `init` joins the job (default: torchrun's environment)."""
    args = args if args is not None else parse_args()
    ctx = None
    try:
        # Every cell's recipe is checked before the process group exists: a bad one is refused before any training.
        cells = [(label, extra, *prepare(launcher, args, extra)) for label, extra in sweep_cells(args.sweep, launcher)]
        recipe = cells[0][2]
        ctx = (init or init_distributed)(recipe.backend)
        output_dir = args.output_dir or Path("runs") / f"{recipe.model}-{recipe.name}"
        try:  # every rank, before any training: a bad folder fails at once, not at the first save
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ZooError(f"--output-dir {output_dir}: cannot create it ({exc.strerror or exc})") from None
        if cells[0][3] != recipe.parallelism.strategy != "ddp" and ctx.is_main:
            print(f"note: recipe '{recipe.name}' names parallelism '{recipe.parallelism.strategy}' "
                  f"(launchers/{layout(recipe.parallelism.strategy).launcher}.py); launchers/{launcher}.py runs "
                  f"'{cells[0][3]}'", file=sys.stderr)
        # A rank restarted by torchrun (--max-restarts) continues from the last complete checkpoint.
        resume = args.resume or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
        finished = []
        for index, (label, extra, recipe, strategy) in enumerate(cells):
            if label and ctx.is_main:
                print(f"[sweep] cell {index + 1}/{len(cells)}: {label}", file=sys.stderr, flush=True)
            cell_dir = output_dir / label
            summary = run(recipe, ctx, strategy, cell_dir, resume, args.tracking_uri, launcher,
                          profile_memory=args.profile_memory)
            if summary is None:
                continue
            _report(summary, cell_dir)
            if label:  # after each cell, so an interrupted sweep still says which cells finished
                finished.append({"cell": label, "overrides": dict(o.split("=", 1) for o in extra),
                                 "strategy": strategy, "summary": f"{label}/{SUMMARY_FILE}",
                                 "variants": {k: v.accuracy for k, v in summary.variants.items()}})
                atomic_write_text(output_dir / SWEEP_FILE, json.dumps({"cells": finished}, indent=2) + "\n")
        shutdown(ctx)
    except ZooError as exc:
        # Every rank reads the same recipe and fails the same way: one of them says so.
        if (ctx.rank if ctx is not None else int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))) == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        elif ctx is None:  # torchrun stops the other workers when the first one exits: let rank 0 say why first
            time.sleep(2)
        raise SystemExit(exc.exit_code) from None


def torchrun(launcher_argv: list[str], nproc_per_node: int = 1, nnodes: int = 1, node_rank: int = 0,
             rdzv_endpoint: str | None = None, max_restarts: int = 0, launcher: str | None = None) -> None:
    """`zoo train`: check the recipe here, then start the workers with torchrun's own machinery (in this process).

    The launcher is the one implementing the recipe's parallelism unless `launcher` is given. A failed worker
    is one line (its own error is printed above by rank 0), not torchrun's ChildFailedError report."""
    if launcher is not None and launcher not in LAUNCHERS:
        raise ZooError(f"unknown launcher '{launcher}'; choose one of: {', '.join(LAUNCHERS)}")
    # A bad recipe, model or backend: refused here, before any worker starts.
    args = parse_args(launcher_argv)
    recipe, _ = prepare(launcher or "ddp", args)
    launcher = launcher or layout(recipe.parallelism.strategy).launcher
    for _, extra in sweep_cells(args.sweep, launcher):  # and every cell of a sweep
        prepare(launcher, args, extra)
    if not LAUNCHERS[launcher].torchrun:
        command = LAUNCHERS[launcher].command.format(n=nproc_per_node * nnodes)
        raise ZooError(f"launchers/{launcher}.py jobs start with {command.split()[0]}, not torchrun: "
                       f"{command} {shlex.join(launcher_argv)}")
    if nnodes > 1 and not rdzv_endpoint:
        raise ZooError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")
    rendezvous = (["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", rdzv_endpoint] if rdzv_endpoint else ["--standalone"])
    script = REPO_ROOT / "launchers" / f"{launcher}.py"
    options = elastic.parse_args([*rendezvous, "--nproc-per-node", str(nproc_per_node), "--max-restarts",
                                  str(max_restarts), str(script), *launcher_argv])
    for name in ("torch.distributed.run", "torch.distributed.elastic"):  # its banner and failure report
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.update(allocator_env())  # the workers inherit it
    try:
        elastic.run(options)
    except ChildFailedError as exc:
        rank, failure = root_failure(exc)
        raise ZooError(f"training stopped: rank {rank} exited with code {failure.exitcode} "
                       f"(its output is above); launchers/{launcher}.py {shlex.join(launcher_argv)}") from None


def root_failure(exc: ChildFailedError) -> tuple[int, ProcessFailure]:
    """The worker that stopped the job: a rank that exited on its own before those torchrun then stopped.

    torchrun's `get_first_failure` goes by timestamp, in whole seconds and, without an error file, taken when the
    agent collected the exits: the rank it killed (a signal, negative code) ties with the one that failed and, being
    lower, was named instead (seen in CI: 'rank 0 exited with code -15' for rank 1's fault)."""
    def order(item: tuple[int, ProcessFailure]) -> tuple[bool, int, int]:
        rank, failure = item
        return failure.exitcode < 0, failure.timestamp, rank
    return min(exc.failures.items(), key=order)


def _report(summary: RunSummary, output_dir: Path) -> None:
    table = Table("variant", "file", "opset", "accuracy", "drop vs fp32", "int8 kernels",
                  title=f"{summary.model} / {summary.recipe} ({plural(summary.world_size, 'process')}, {summary.backend})")
    for key, v in summary.variants.items():
        drop = v.accuracy_drop
        table.add_row(key, v.file, str(v.opset), f"{v.accuracy:.4f}", "-" if drop is None else f"{drop:+.4f}",
                      ", ".join(v.int8_kernels or []) or "-")
    Console(stderr=True).print(table)
    print(json.dumps({"summary": str(output_dir / SUMMARY_FILE),
                      "variants": {k: v.accuracy for k, v in summary.variants.items()}}))
