"""The catalog's pages: the Models table and the home page's preview."""

from __future__ import annotations

from zoo.docs.common import fmt, size_cell
from zoo.kinds import KINDS
from zoo.variants.checks import Row, summary_line


def columns() -> list[str]:
    """The models index shows one accuracy column per kind that asks for one."""
    return [k for k, kind in KINDS.items() if kind.docs_column]


def preview(entries: dict) -> str:
    """The home page's catalog: what each entry is, its fp32 accuracy and the quickest variant, from the cards."""
    lines = ["| model | task | parameters | fp32 accuracy | fastest at batch 1 (CPU) |", "| --- | --- | --- | --- | --- |"]
    for name, entry in entries.items():
        c = entry.card
        fp32 = c.variants["fp32"]
        fastest = c.fastest(1) if fp32.speed else None
        lines.append(f"| [{name}](models/{name}.md) | {c.task} | {c.num_params:,} | "
                     + (fmt(c.metric("fp32")) if fp32.built else "not built") + " | "
                     + (f"{fastest}, {c.variants[fastest].speed.batch_1.vs_fp32:.2f}x fp32" if fastest else "–") + " |")
    return "\n".join(lines) + "\n"


def index_page(entries: dict, validation: dict) -> str:
    shown = columns()
    lines = ["---", "hide: [toc]", "---", "", "# Models", "",
             "Every number below is measured by `zoo build` / `zoo validate` and read from the cards. "
             "Click a column header to sort.", "",
             f"| model | task | params | {' | '.join(f'{k} accuracy' for k in shown)} | size (fp32) | "
             "fp32 latency b32 (ms) | fastest at batch 1 | opsets |",
             "| --- | --- | --- |" + " --- |" * len(shown) + " --- | --- | --- | --- |"]
    for name, entry in entries.items():
        c = entry.card
        metric = " | ".join(fmt(c.metric(k)) if k in c.variants else "–" for k in shown)
        built = [v for v in c.variants.values() if v.built]  # a planned entry has no opsets yet
        opsets = sorted({v.opset for v in built} | {o for v in built for o in v.extra_opsets})
        fp32 = c.variants["fp32"]
        fastest = c.fastest(1) if fp32.speed else None
        lines.append(f"| [{name}]({name}.md) | {c.task} | {c.num_params:,} | {metric} | "
                     f"{size_cell(fp32.size)} | {fmt(fp32.speed.batch_32.median_ms if fp32.speed else None, 3)} | "
                     + (f"{fastest} ({c.variants[fastest].speed.batch_1.vs_fp32:.2f}x)" if fastest else "–")
                     + f" | {', '.join(map(str, opsets)) or '–'} |")
    timed = [e.card for e in entries.values() if e.card.variants["fp32"].speed]
    if timed:
        cpus = sorted({c.training.cpu.model for c in timed if c.training.cpu})
        threads = sorted({c.variants["fp32"].speed.threads for c in timed})
        lines += ["", f"Accuracy: each card's test split. Latency and speed: onnxruntime in each card's `zoo build`, "
                      f"{'/'.join(map(str, threads))} {'thread' if threads == [1] else 'threads'}, median of 30 runs, "
                      f"on {', '.join(cpus) or 'the build CPU'} "
                      "(ISA flags on each model's page)."]
    if validation:
        lines += ["", "Latest validation ([report](../reference/results/validation.md)): " + summary_line(
            [Row(r["entry"], r["variant"], r["check"], r["ok"], skipped=r.get("skipped", False),
                 planned=r.get("planned", False)) for r in validation.get("rows", [])], validation.get("seconds", 0))]
    return "\n".join(lines) + "\n"
