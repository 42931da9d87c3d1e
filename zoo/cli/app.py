"""The `zoo` application and what its commands share: the consoles, wrapped text, tables that fit the terminal."""

from __future__ import annotations

import re
import textwrap

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from zoo.fsutil import human_size


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


NBSP = "\u00a0"


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


def human(size: int | None) -> str:
    return "-" if size is None else human_size(size)


def metric_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
