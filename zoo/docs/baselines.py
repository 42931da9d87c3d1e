"""A model page's rows from benchmarks/baselines.py: the entry next to the classic tools, this build's files only."""

from __future__ import annotations

from zoo.cards import ModelCard
from zoo.docs.common import report_runs


def baselines_section(c: ModelCard, results: dict) -> list[str]:
    """The entry next to the classic tool for its task, from benchmarks/baselines.py: the same examples, accuracy and
    speed side by side, from the one run that measured this build's files (the classic tools were measured in the
    same run, on the same machine); only files whose sha256 is the card's (an older build's numbers are not shown as
    this one's)."""
    for record in report_runs(results):
        if lines := _baselines_run(c, record):
            return lines
    return []


def _baselines_run(c: ModelCard, record: dict) -> list[str]:
    task = record.get("tasks", {}).get("language-identification" if c.task == "language-identification" else
                                       c.dataset.name, {})
    rows = task.get("rows", [])

    def this_build(r: dict) -> bool:
        return r["tool"] == c.name and c.variants.get(r["variant"]) and c.variants[r["variant"]].sha256 == r.get("sha256")

    mine = [r for r in rows if r["kind"] == "entry" and this_build(r)]
    if not mine:
        missed = [r for r in task.get("not_measured", []) if this_build(r)]
        return ["", "## Against the classic tools", "", "Not measured on this build by `python benchmarks/baselines.py`"
                f": {missed[0]['reason']}"] if missed else []
    shown = [r for r in rows if r["kind"] == "baseline"] + mine
    cpu = record.get("cpu", {}).get("model", "an unrecorded CPU")
    lines = ["", "## Against the classic tools", "",
             f"Measured side by side on the same examples by `python benchmarks/baselines.py` ({cpu}, "
             f"{record.get('threads', 1)} thread; speed: one example at a time"
             + (", tokenizing included" if c.task == "language-identification" else "") + ")."]

    def label(r: dict) -> str:
        return f"**{c.name} {r['variant']}**" if r["kind"] == "entry" else f"{r['tool']} {r.get('version', '')}".strip()

    if "test_sets" not in task:  # one test split, one accuracy
        lines += ["", "| tool | accuracy (test) | ms per example |", "| --- | ---: | ---: |"]
        lines += [f"| {label(r)} | {100 * r['accuracy']:.1f} | {r['ms_per_text']:.3f} |" for r in shown]
        return lines
    sets = list(task["test_sets"])
    domains = task.get("domains", ["fortunes", "second-domain"])
    lines += ["", "Accuracy (%) on the fortunes test set, the held-out domains never trained on (second-domain: the "
              "GNOME user guide" + ("; software messages: coreutils, GNU C library and tar messages" if
                                    "software messages" in domains else "")
              + ") and copies of the fortunes test texts the way users type them.", "",
              "| tool | " + " | ".join(sets) + " | ms per text |", "| --- |" + " ---: |" * (len(sets) + 1)]
    lines += [f"| {label(r)} | " + " | ".join(f"{100 * r['sets'][s]['accuracy']:.1f}" for s in sets)
              + f" | {r['ms_per_text']:.2f} |" for r in shown]
    lines += _choice(c, [r for r in rows if r["kind"] == "baseline"], mine, domains)
    fp32 = [r for r in mine if r["variant"] == "fp32"]
    for s in domains:
        compared = [r for r in rows if r["kind"] == "baseline"] + fp32
        lengths = list(compared[0]["sets"][s]["by_length"])
        lines += ["", f"By language and by text length (characters), {s}:", "",
                  "| tool | " + " | ".join(task["labels"]) + " | " + " | ".join(lengths) + " |",
                  "| --- |" + " ---: |" * (len(task["labels"]) + len(lengths))]
        lines += [f"| {label(r)} | " + " | ".join(f"{100 * v:.1f}" for v in r["sets"][s]["by_language"].values())
                  + " | " + " | ".join(f"{100 * v:.1f}" for v in r["sets"][s]["by_length"].values()) + " |"
                  for r in compared]
    return lines


def _choice(c: ModelCard, baselines: list[dict], mine: list[dict], domains: list[str]) -> list[str]:
    """When to pick this entry and when the classic tool, from the numbers above: accuracy on the test set and the
    held-out domains of its most accurate variant against each classic tool, and speed of its fastest variant."""
    def mean(r: dict) -> float:
        return sum(r["sets"][s]["accuracy"] for s in domains) / len(domains)

    best, fastest = max(mine, key=mean), min(mine, key=lambda r: r["ms_per_text"])
    lines = [""]
    for tool in baselines:
        ahead = [s for s in domains if best["sets"][s]["accuracy"] >= tool["sets"][s]["accuracy"]]
        behind = [s for s in domains if s not in ahead]
        ratio = tool["ms_per_text"] / fastest["ms_per_text"]
        speed = (f"{1 / ratio:.1f}x slower than {tool['tool']} ({fastest['variant']}, its fastest: "
                 f"{fastest['ms_per_text']:.2f} vs {tool['ms_per_text']:.2f} ms per text)" if ratio < 1 else
                 f"{ratio:.1f}x faster than {tool['tool']} ({fastest['variant']}: {fastest['ms_per_text']:.2f} vs "
                 f"{tool['ms_per_text']:.2f} ms per text)")
        if not behind:
            verdict = (f"**Against {tool['tool']}:** {c.name} {best['variant']} is at least as accurate on every test set "
                       f"({', '.join(domains)}) and {speed}. Prefer {c.name} where accuracy on unfamiliar text counts"
                       + (f"; prefer {tool['tool']} where throughput counts more than the remaining errors." if ratio < 1
                          else "."))
        else:
            verdict = (f"**Against {tool['tool']}:** {tool['tool']} is more accurate on {', '.join(behind)}"
                       + (f" (while {c.name} {best['variant']} leads on {', '.join(ahead)})" if ahead else "")
                       + f", and {c.name} is {speed}. Prefer {tool['tool']} "
                       + ("unless you need this entry's ONNX files (one runtime for every model, on-device training)."
                          if ratio < 1 else "where those domains matter; this entry where speed does."))
        lines += [verdict, ""]
    return lines[:-1]
