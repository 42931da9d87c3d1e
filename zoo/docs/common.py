"""Paths and the small formatters every generated page uses."""

from __future__ import annotations

import html
import json
from pathlib import Path

from zoo.config import REPO_ROOT
from zoo.fsutil import human_size

DOCS = REPO_ROOT / "docs"


RESULTS = REPO_ROOT / "benchmarks" / "results"


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def report_runs(results: dict) -> list[dict]:
    """The runs of a benchmark report (benchmarks/results/*.json), each measured on one machine; reports written
    before runs were kept apart hold their one run at the top level."""
    runs = results.get("runs")  # a list of runs; inside a latency run, "runs" counts its timed repetitions
    return runs if isinstance(runs, list) else [results] if results else []


def fmt(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def md_text(text: str) -> str:
    """Card prose as text, not HTML: `<pkg>` in a licence path stays visible."""
    return html.escape(text, quote=False)


def shape_text(shape: list) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def size_cell(n: int | None) -> str:
    """A size for tables: read in KiB/MiB, sorted by bytes (docs/js/sortable.js reads data-sort)."""
    return "–" if n is None else f'<span data-sort="{n}">{human_size(n)}</span>'


def variant_type(v) -> str:
    return " ".join(p for p in (v.precision, v.quantization) if p != "none")
