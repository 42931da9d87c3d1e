"""The launchers' command line (launchers/*.py, `zoo train`): argparse only, so a launcher answers `--help` and a
wrong option before torch loads."""

from __future__ import annotations

import argparse
from pathlib import Path


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
    parser.add_argument("--profile-memory", action="store_true",
                        help="count the last two fp32 steps' tensors by category (parameters, gradients, optimizer "
                             "state, buffers, activations) per rank into summary.json")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                        help="run one cell per combination of these values in this one job (repeatable), each "
                             "into <output-dir>/<values joined by _>/, e.g. --sweep precision=fp32,bf16,fp16 "
                             "--sweep recipe=fp32,qat-int8 (recipe: names or paths); <output-dir>/sweep.json lists "
                             "the cells")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    return parser.parse_intermixed_args(argv)  # key=value overrides may come before or after options
