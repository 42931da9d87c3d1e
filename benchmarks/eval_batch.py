"""How many rows `zoo.evaluate.predict` runs at once, side by side in one run (writes
benchmarks/results/eval_batch.{json,md}):

each published entry's files that validation measures on its whole test split, from the repository's store (fetched
and verified), predicted at the batch cards were first measured at (zoo.evaluate.DYNAMIC_BATCH) and at the batch
`predict` now uses (zoo.evaluate.BATCH), alternating, `--rounds` times each, one onnxruntime thread. Reported per file:
the median CPU-seconds of a pass over the test split at each batch, their ratio, and whether the logits were the same
bytes (they must be: a dynamically quantized file, whose outputs depend on the batch, keeps DYNAMIC_BATCH and is
not measured here).

    python benchmarks/eval_batch.py [--entries bert-mini,minilm-l6] [--rounds 3] [--render]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo import catalog  # noqa: E402
from zoo.evaluate import BATCH, DYNAMIC_BATCH, batch_size_for, predict  # noqa: E402
from zoo.fsutil import atomic_write_text  # noqa: E402
from zoo.provenance import cpu_info, cpu_kind  # noqa: E402
from zoo.store.fetch import fetch  # noqa: E402
from zoo.variants.make import evaluation_data  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def cpu_seconds(path: Path, x, batch: int):
    started = time.process_time()
    logits = predict(path, x, batch_size=batch)
    return time.process_time() - started, logits


def measure(name: str, rounds: int) -> list[dict]:
    card = catalog.get_card(name)
    rows = []
    for key, spec in card.variants.items():
        if not spec.built or not spec.file.endswith(".onnx") or spec.recipe is not None:
            continue
        path = fetch(name, key, show_progress=False).path
        if batch_size_for(path) != BATCH:
            continue
        x, _ = evaluation_data(card, spec)
        times = {DYNAMIC_BATCH: [], BATCH: []}
        outputs = {}
        for _ in range(rounds):
            for batch in (DYNAMIC_BATCH, BATCH):
                seconds, outputs[batch] = cpu_seconds(path, x, batch)
                times[batch].append(seconds)
        before, after = statistics.median(times[DYNAMIC_BATCH]), statistics.median(times[BATCH])
        rows.append({"entry": name, "variant": key, "examples": len(x), "cpu_s_before": before, "cpu_s_after": after,
                     "ratio": before / after,
                     "same_bytes": outputs[DYNAMIC_BATCH].tobytes() == outputs[BATCH].tobytes()})
    return rows


def render(result: dict) -> str:
    passes = f"the median of {result['rounds']} passes each" if result["rounds"] > 1 else "one pass each"
    lines = [f"# Rows a prediction batch, zoo.evaluate.predict ({cpu_kind(result['cpu'])}, 1 onnxruntime thread)", "",
             f"Each file's whole test split predicted at {result['before']} rows a batch and at {result['after']}, "
             f"alternating, {passes}: CPU-seconds of one pass.", "",
             f"| entry | variant | examples | CPU s at {result['before']} | CPU s at {result['after']} | ratio | same logits |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['entry']} | {r['variant']} | {r['examples']:,} | {r['cpu_s_before']:.2f} | "
                     f"{r['cpu_s_after']:.2f} | {r['ratio']:.2f}x | {'yes' if r['same_bytes'] else 'NO'} |")
    total_before = sum(r["cpu_s_before"] for r in result["rows"])
    total_after = sum(r["cpu_s_after"] for r in result["rows"])
    lines += ["", f"All files: {total_before:.1f} -> {total_after:.1f} CPU-seconds ({total_before / total_after:.2f}x)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default="bert-tiny,bert-mini,minilm-l6", help="comma-separated published entries")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--render", action="store_true", help="rewrite the .md report from the .json, measure nothing")
    args = parser.parse_args()
    if args.render:
        result = json.loads((RESULTS / "eval_batch.json").read_text())
    else:
        rows = [row for name in args.entries.split(",") for row in measure(name, args.rounds)]
        result = {"cpu": cpu_info(), "threads": 1, "rounds": args.rounds, "before": DYNAMIC_BATCH, "after": BATCH,
                  "rows": rows}
        atomic_write_text(RESULTS / "eval_batch.json", json.dumps(result, indent=2) + "\n")
    report = render(result)
    atomic_write_text(RESULTS / "eval_batch.md", report)
    print(report)


if __name__ == "__main__":
    main()
