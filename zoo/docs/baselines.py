"""A model page's rows from benchmarks/baselines.py: the entry next to the classic tools, this build's files only."""

from __future__ import annotations

from zoo.cards import ModelCard


def baselines_section(c: ModelCard, results: dict) -> list[str]:
    """The entry next to the classic tool for its task, from benchmarks/baselines.py: the same examples, accuracy and
    speed side by side, from the one run that measured this build's files (the classic tools were measured in the
    same run, on the same machine); only files whose sha256 is the card's (an older build's numbers are not shown as
    this one's)."""
    for record in baseline_runs(results):
        if lines := _baselines_run(c, record):
            return lines
    return []


def baseline_runs(results: dict) -> list[dict]:
    """The runs of benchmarks/baselines.json, each measured on one machine (results written before runs were kept
    apart hold one run at the top level)."""
    return results.get("runs", [results] if "tasks" in results else [])


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
    lines += ["", "Accuracy (%) on the fortunes test set, the second-domain set (GNOME user guide, never trained on) "
              "and copies of the fortunes test texts the way users type them.", "",
              "| tool | " + " | ".join(sets) + " | ms per text |", "| --- |" + " ---: |" * (len(sets) + 1)]
    lines += [f"| {label(r)} | " + " | ".join(f"{100 * r['sets'][s]['accuracy']:.1f}" for s in sets)
              + f" | {r['ms_per_text']:.2f} |" for r in shown]
    fp32 = [r for r in mine if r["variant"] == "fp32"]
    for s in ("fortunes", "second-domain"):
        compared = [r for r in rows if r["kind"] == "baseline"] + fp32
        lengths = list(compared[0]["sets"][s]["by_length"])
        lines += ["", f"By language and by text length (characters), {s}:", "",
                  "| tool | " + " | ".join(task["labels"]) + " | " + " | ".join(lengths) + " |",
                  "| --- |" + " ---: |" * (len(task["labels"]) + len(lengths))]
        lines += [f"| {label(r)} | " + " | ".join(f"{100 * v:.1f}" for v in r["sets"][s]["by_language"].values())
                  + " | " + " | ".join(f"{100 * v:.1f}" for v in r["sets"][s]["by_length"].values()) + " |"
                  for r in compared]
    return lines
