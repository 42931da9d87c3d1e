"""Generate the docs site's model pages from the same cards the CLI reads (so the site cannot drift).

`zoo docs` writes docs/models/*.md, docs/reference/*.md and the plots under docs/models/img/, one module per kind of
page: model_page (and its plots, baselines), catalog_pages (the Models table, the home page's preview), reference
(recipe fields, variant kinds, benchmark reports), on the formatters in common;
`make docs` then runs `mkdocs build --strict`. Latency is the cards' (`zoo build` measures it); the validation
verdicts come from benchmarks/results/validation.json when that measurement exists.
"""

from __future__ import annotations

from pathlib import Path

from zoo import catalog
from zoo.docs.baselines import baselines_section
from zoo.docs.catalog_pages import index_page, preview
from zoo.docs.common import DOCS, RESULTS, load_json, report_runs
from zoo.docs.model_page import model_page, validation_verdicts
from zoo.docs.reference import benchmarks_page, kinds_reference, recipes_reference
from zoo.fsutil import atomic_write_text

__all__ = ["generate", "model_page", "index_page", "kinds_reference", "validation_verdicts", "report_runs", "baselines_section",
           "RESULTS"]


def generate() -> list[Path]:
    entries = catalog.entries()
    validation = load_json(RESULTS / "validation.json")
    baselines = load_json(RESULTS / "baselines.json")
    models = DOCS / "models"
    img = models / "img"
    img.mkdir(parents=True, exist_ok=True)
    written = []
    for name, entry in entries.items():
        page = models / f"{name}.md"
        atomic_write_text(page, model_page(entry, validation_verdicts(validation, name), img, entries, baselines))
        written.append(page)
    atomic_write_text(models / "index.md", index_page(entries, validation))
    atomic_write_text(models / "_preview.md", preview(entries))  # the home page includes it
    atomic_write_text(DOCS / "reference" / "recipes.md", recipes_reference())
    summary, reports = benchmarks_page()
    atomic_write_text(DOCS / "reference" / "benchmarks.md", summary)
    for name, text in reports.items():
        atomic_write_text(DOCS / "reference" / "results" / name, text)
    atomic_write_text(DOCS / "reference" / "variants.md", kinds_reference())
    return [*written, models / "index.md",
            *(DOCS / "reference" / f"{page}.md" for page in ("recipes", "benchmarks", "variants"))]
