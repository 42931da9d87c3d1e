"""onnxruntime latency of every built variant of every entry, side by side in one run, at batch 1 and 32
(1 intra-op thread). Writes benchmarks/results/latency.{json,md}; the docs read the JSON.

    python benchmarks/latency.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo import catalog  # noqa: E402
from zoo.data import load_dataset  # noqa: E402
from zoo.errors import ZooError  # noqa: E402
from zoo.evaluate import latency_ms  # noqa: E402
from zoo.fsutil import atomic_write_text  # noqa: E402
from zoo.store.fetch import fetch  # noqa: E402


def main() -> None:
    results, lines = {}, ["# onnxruntime latency (ms, median of 30, 1 thread)", "",
                          "| model | variant | batch 1 | vs fp32 | batch 32 | vs fp32 |", "| --- | --- | --- | --- | --- | --- |"]
    for name, entry in catalog.entries().items():
        card = entry.card
        x = load_dataset(card.dataset.name).test.x.numpy()
        measured = {}
        for key, variant in card.variants.items():
            if not variant.built or variant.format != "onnx":  # training artifacts are not an inference model
                continue
            try:
                path = fetch(name, key, show_progress=False).path
            except ZooError as exc:
                print(f"skip {name} {key}: {exc}", file=sys.stderr)
                continue
            measured[key] = {f"batch{b}": latency_ms(path, x[:b], repeats=30) for b in (1, 32)}
        for key, v in measured.items():
            base = measured.get("fp32", v)
            lines.append(f"| {name} | {key} | {v['batch1']:.3f} | {v['batch1'] / base['batch1']:.2f}x | "
                         f"{v['batch32']:.3f} | {v['batch32'] / base['batch32']:.2f}x |")
        if measured:
            results[name] = measured
    out = ROOT / "benchmarks" / "results"
    atomic_write_text(out / "latency.json", json.dumps({"entries": results}, indent=2) + "\n")
    atomic_write_text(out / "latency.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
