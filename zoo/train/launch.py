"""What every launcher shares: arguments, recipe loading, process group, clean one-line errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zoo.errors import ZooError
from zoo.models import model_spec
from zoo.recipes import load_recipe
from zoo.train.distributed import init_distributed, shutdown
from zoo.train.parallel import launcher_of, strategy_for
from zoo.train.summary import SUMMARY_FILE, RunSummary
from zoo.train.trainer import run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a zoo model with a recipe.",
                                     epilog="Extra key=value arguments override recipe fields, e.g. steps=50 optimizer.lr=0.01")
    parser.add_argument("--recipe", default="qat-int8", help="recipe name (recipes/NAME.yaml) or path")
    parser.add_argument("--model", help="override the recipe's model")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl", "ccl"], help="override the recipe's backend")
    parser.add_argument("--output-dir", type=Path, help="where exports, checkpoints and summary.json go "
                                                        "(default runs/<model>-<recipe>)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under $ZOO_HOME)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    return parser.parse_intermixed_args(argv)  # key=value overrides may come before or after options


def launch(launcher: str, argv: list[str] | None = None, init=None) -> None:
    """Run the trainer under `launcher`'s strategy; `init` joins the job (default: torchrun's environment)."""
    args = parse_args(argv)
    ctx = None
    try:
        overrides = list(args.overrides)
        if args.no_tracking:
            overrides.append("tracking.enabled=false")
        recipe = load_recipe(args.recipe, overrides, model=args.model, backend=args.backend)
        model_spec(recipe.model)  # unknown models fail before any process group exists
        if recipe.federated is not None:
            raise ZooError(f"recipe '{recipe.name}' is federated: python launchers/federated.py run --recipe {recipe.name}")
        strategy = strategy_for(launcher, recipe.parallelism.strategy)
        ctx = (init or init_distributed)(recipe.backend)  # refuses a backend this machine lacks, writing nothing
        output_dir = args.output_dir or Path("runs") / f"{recipe.model}-{recipe.name}"
        try:  # every rank, before any training: a bad folder fails at once, not at the first save
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ZooError(f"--output-dir {output_dir}: cannot create it ({exc.strerror or exc})") from None
        if strategy != recipe.parallelism.strategy != "ddp" and ctx.is_main:
            print(f"note: recipe '{recipe.name}' names parallelism '{recipe.parallelism.strategy}' "
                  f"(launchers/{launcher_of(recipe.parallelism.strategy)}.py); launchers/{launcher}.py runs "
                  f"'{strategy}'", file=sys.stderr)
        # A rank restarted by torchrun (--max-restarts) continues from the last complete checkpoint.
        resume = args.resume or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
        summary = run(recipe, ctx, strategy, output_dir, resume, args.tracking_uri, launcher)
        if summary is not None:
            _report(summary, output_dir)
        shutdown(ctx)
    except ZooError as exc:
        # Every rank reads the same recipe and fails the same way: one of them says so.
        if (ctx.rank if ctx is not None else int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))) == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


def _report(summary: RunSummary, output_dir: Path) -> None:
    table = Table("variant", "file", "opset", "accuracy", "drop vs fp32", "int8 kernels",
                  title=f"{summary.model} / {summary.recipe} ({summary.world_size} process(es), {summary.backend})")
    for key, v in summary.variants.items():
        drop = v.accuracy_drop
        table.add_row(key, v.file, str(v.opset), f"{v.accuracy:.4f}", "-" if drop is None else f"{drop:+.4f}",
                      ", ".join(v.int8_kernels or []) or "-")
    Console(stderr=True).print(table)
    print(json.dumps({"summary": str(output_dir / SUMMARY_FILE),
                      "variants": {k: v.accuracy for k, v in summary.variants.items()}}))
