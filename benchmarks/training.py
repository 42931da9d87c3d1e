"""Training and inference side by side, in one run (writes benchmarks/results/training.{json,md}):

- step time of QAT vs fp32 (fake-quantization overhead), from one training run;
- 1 vs 2 DDP processes (gloo) at the same global batch;
- onnxruntime latency of fp32 vs int8-qat vs int8-ptq (vs fp16) at batch 1 and 32.

    python benchmarks/training.py [--model digits-cnn] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.data import load_dataset  # noqa: E402
from zoo.evaluate import latency_ms  # noqa: E402
from zoo.models import model_spec  # noqa: E402
from zoo.fsutil import atomic_write_text  # noqa: E402
from zoo.run_summary import RunSummary  # noqa: E402


def run(out: Path, model: str, steps: int, nproc: int) -> dict:
    launcher = str(ROOT / "launchers" / "ddp.py")
    args = ["--recipe", "qat-int8", "--model", model, "--output-dir", str(out), "--no-tracking",
            f"steps={steps}", f"quantization.qat_steps={steps}", "export.opsets=[17]"]
    if nproc == 1:
        cmd = [sys.executable, launcher, *args]
    else:
        cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone", f"--nproc_per_node={nproc}", launcher, *args]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    return RunSummary.read(out).model_dump(mode="json")  # validated by the schema


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="digits-cnn")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zoo-bench-") as tmp:
        one = run(Path(tmp) / "one", args.model, args.steps, 1)
        two = run(Path(tmp) / "two", args.model, args.steps, 2)
        data = load_dataset(model_spec(args.model).dataset).test.x.numpy()
        latency = {}
        for key, v in one["variants"].items():
            path = Path(tmp) / "one" / v["file"]
            latency[key] = {f"batch{b}": latency_ms(path, data[:b], repeats=50) for b in (1, 32)}
    per_step = lambda s, phase: s["phases"][phase]["seconds"] / s["phases"][phase]["steps"]  # noqa: E731
    result = {
        "model": args.model, "steps_per_phase": args.steps, "global_batch": 64,
        "qat_over_fp32_step_time": per_step(one, "qat") / per_step(one, "fp32"),
        "ddp2_over_1proc_step_time": per_step(two, "fp32") / per_step(one, "fp32"),
        "step_seconds": {"fp32_1proc": per_step(one, "fp32"), "qat_1proc": per_step(one, "qat"),
                         "fp32_2proc": per_step(two, "fp32")},
        "ort_latency_ms": latency,
        "ort_latency_vs_fp32": {k: {b: v[b] / latency["fp32"][b] for b in v} for k, v in latency.items()},
        "accuracy": {k: v["accuracy"] for k, v in one["variants"].items()},
    }
    out = ROOT / "benchmarks" / "results"
    atomic_write_text(out / "training.json", json.dumps(result, indent=2) + "\n")
    lines = [f"# Training and inference, {args.model} (one run, 1 thread per process)", "",
             f"- QAT step time / fp32 step time: {result['qat_over_fp32_step_time']:.2f}x",
             f"- 2 DDP processes / 1 process, same global batch: {result['ddp2_over_1proc_step_time']:.2f}x step time",
             "", "| variant | accuracy | batch 1 ms | vs fp32 | batch 32 ms | vs fp32 |", "| --- | --- | --- | --- | --- | --- |"]
    for k, v in latency.items():
        r = result["ort_latency_vs_fp32"][k]
        lines.append(f"| {k} | {result['accuracy'][k]:.4f} | {v['batch1']:.3f} | {r['batch1']:.2f}x | "
                     f"{v['batch32']:.3f} | {r['batch32']:.2f}x |")
    atomic_write_text(out / "training.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
