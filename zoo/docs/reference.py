"""Reference pages generated from the code's own tables: recipe fields, variant kinds, the benchmark reports."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing

import yaml

from zoo.config import REPO_ROOT
from zoo.docs.common import RESULTS, md_text
from zoo.recipes import Recipe
from zoo.strict import OneOf
from zoo.kinds import KINDS


def _type(annotation, metadata: list = ()) -> str:
    """A schema type for readers: Literal values and a table's keys (zoo.strict.OneOf) spelled out, unions joined
    with "or"."""
    if tables := [m.func for m in metadata if isinstance(getattr(m, "func", None), OneOf)]:
        return " \\| ".join(f"`{key}`" for key in tables[0].keys())
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
            kind = _type(field.annotation, field.metadata)
            rows.append(f"| `{prefix}{name}` | {kind} | `{default}` | {md_text(notes.get(name, ''))} |")
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


def kinds_reference() -> str:
    """The variant kinds table (zoo.kinds), as the code reads it."""
    lines = ["# Variant kinds", "", "Generated from the one table of variant kinds (`zoo/kinds.py`): build, export, "
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
                   "length_grouping.md", "eval_batch.md", "fetch_throughput.md", "validation.md"]


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
