"""Per-rank memory and step time of every launcher, side by side in one run (benchmarks/results/parallel.{json,md}).

A ~54M-parameter BERT (12 layers, hidden 512) on the langid data, fp32 + AdamW, fixed global batch,
2 processes (gloo) for each layout and 1 process as the baseline. Peak memory is each rank's peak
resident set at the end of training minus its resident set before the model existed (imports and data),
so it counts parameters, gradients, optimizer state, communication buffers and activations.

Next to it: the ZeRO paper's model-state accounting (Rajbhandari et al. 2020) for N ranks with
fp32 Adam: DDP 16 bytes/param (4 weights + 4 grads + 8 Adam moments); ZeRO-1 partitions the
optimizer state (4 + 4 + 8/N), ZeRO-2 also gradients (4 + 12/N), ZeRO-3 everything (16/N).
The paper's 4x / 8x / Nx figures are these reductions for mixed precision and large N.

    python benchmarks/parallel.py [--steps 8] [--layouts ddp,fsdp,zero1,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.fsutil import atomic_write_text  # noqa: E402
from zoo.train.summary import RunSummary  # noqa: E402

BIN = Path(sys.executable).parent
RESULTS = ROOT / "benchmarks" / "results"
MODEL = ["--model", "bert", "model_args.num_hidden_layers=12", "model_args.hidden_size=512",
         "model_args.num_attention_heads=8", "model_args.intermediate_size=2048"]
# ZeRO-3 with DeepSpeed's buffer defaults, and with buffers sized for this model (see the notes in the report).
SMALL_BUFFERS = ("parallelism.deepspeed={zero_optimization: {reduce_bucket_size: 2000000, "
                 "stage3_prefetch_bucket_size: 2000000, stage3_max_live_parameters: 4000000, "
                 "stage3_param_persistence_threshold: 10000, allgather_bucket_size: 2000000}}")
LAYOUTS = {
    "1 process": ("ddp.py", 1, []),
    "ddp": ("ddp.py", 2, []),
    "fsdp": ("fsdp.py", 2, []),
    "zero1": ("deepspeed.py", 2, ["parallelism.strategy=zero1"]),
    "zero2": ("deepspeed.py", 2, ["parallelism.strategy=zero2"]),
    "zero3": ("deepspeed.py", 2, ["parallelism.strategy=zero3"]),
    "zero3 small buffers": ("deepspeed.py", 2, ["parallelism.strategy=zero3", SMALL_BUFFERS]),
    "horovod": ("horovod.py", 2, []),
    "tp": ("tensor_parallel.py", 2, []),
    "pp": ("pipeline.py", 2, []),
    "ds-pp": ("deepspeed.py", 2, ["parallelism.strategy=ds-pp"]),
}
THEORY_BYTES_PER_PARAM = {"ddp": lambda n: 16, "zero1": lambda n: 8 + 8 / n, "zero2": lambda n: 4 + 12 / n,
                          "zero3": lambda n: 16 / n, "fsdp": lambda n: 16 / n}


def run_layout(tmp: Path, name: str, steps: int, batch: int) -> dict:
    launcher, nproc, extra = LAYOUTS[name]
    out = tmp / name.replace(" ", "_").replace(",", "")
    args = ["--recipe", "fp32", *MODEL, "--output-dir", str(out), "--no-tracking", f"steps={steps}",
            f"global_batch_size={batch}", "quantization.scheme=none", "export.variants=[]",
            "schedule.warmup_steps=0", *extra]
    script = str(ROOT / "launchers" / launcher)
    if launcher == "horovod.py":
        cmd = [str(BIN / "horovodrun"), "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", sys.executable, script]
    elif nproc == 1:
        cmd = [sys.executable, script]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", script]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOROVOD_GLOO_IFACE": "lo"}
    print(f"[{name}] {' '.join(cmd[-1:])} ...", file=sys.stderr, flush=True)
    done = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, cwd=tmp)
    if done.returncode != 0:  # one failing layout is reported, the others still measured
        errors = [line for line in (done.stdout + done.stderr).splitlines() if "Error" in line and "Warning" not in line]
        return {"processes": nproc, "error": (errors or ["exit status %d" % done.returncode])[-1][:300]}
    summary = RunSummary.read(out).model_dump(mode="json")  # validated by the schema
    phase = summary["phases"]["fp32"]
    model_mib = [p - b for p, b in zip(phase["peak_rss_mib"], summary["baseline_rss_mib"])]
    return {"processes": nproc, "strategy": summary["strategy"], "num_params": summary["num_params"],
            "step_seconds": statistics.median(phase["step_seconds"][2:]),  # the first steps warm up
            "peak_rss_mib": phase["peak_rss_mib"], "baseline_rss_mib": summary["baseline_rss_mib"],
            "model_state_mib_per_rank": model_mib, "final_loss": phase["final_loss"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--render", action="store_true", help="only rewrite parallel.md from parallel.json")
    args = parser.parse_args()
    if args.render:
        return render(json.loads((RESULTS / "parallel.json").read_text()))
    names = args.layouts.split(",")
    with tempfile.TemporaryDirectory(prefix="zoo-bench-parallel-") as tmp:
        results = {name: run_layout(Path(tmp), name, args.steps, args.global_batch) for name in names}
    base = results.get("1 process")
    n_params = next(r["num_params"] for r in results.values() if "num_params" in r)
    for name, r in results.items():
        if "error" in r:
            continue
        if base:
            r["step_time_vs_1_process"] = r["step_seconds"] / base["step_seconds"]
        theory = THEORY_BYTES_PER_PARAM.get(r["strategy"])
        if theory and r["processes"] > 1:
            r["theory_model_state_mib"] = theory(r["processes"]) * n_params / 2**20
    report = {"model": "bert (12 layers, hidden 512)", "num_params": n_params, "global_batch": args.global_batch,
              "steps": args.steps, "threads_per_process": 1, "layouts": results}
    atomic_write_text(RESULTS / "parallel.json", json.dumps(report, indent=2) + "\n")
    render(report)


def render(report: dict) -> None:
    """parallel.md from the measured report: the table, then what the numbers say about ZeRO on this machine."""
    results, n_params = report["layouts"], report["num_params"]
    lines = [f"# Parallel layouts: per-rank memory and step time ({n_params / 1e6:.1f}M-parameter BERT, fp32 AdamW, "
             f"global batch {report['global_batch']}, 1 thread per process, one run)", "",
             "Memory: each rank's peak resident set at the end of training minus its resident set before the model "
             "existed. Model states (ZeRO paper, fp32 Adam, N ranks): DDP 16 bytes/parameter, ZeRO-1 8 + 8/N, "
             "ZeRO-2 4 + 12/N, ZeRO-3 and FSDP 16/N; activations and buffers come on top.", "",
             "| layout | processes | memory per rank, MiB (max) | ZeRO-paper model states, MiB | step time vs 1 process |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | {r['processes']} | failed: {r['error']} | | |")
            continue
        theory = r.get("theory_model_state_mib")
        ratio = r.get("step_time_vs_1_process")
        lines.append(f"| {name} | {r['processes']} | {max(r['model_state_mib_per_rank']):.0f} | "
                     f"{'-' if theory is None else f'{theory:.0f}'} | {'-' if ratio is None else f'{ratio:.2f}x'} |")
    memory = {name: max(r["model_state_mib_per_rank"]) for name, r in results.items() if "error" not in r}
    if {"ddp", "zero3", "zero3 small buffers"} <= set(memory):
        ddp, z3, small = memory["ddp"], memory["zero3"], memory["zero3 small buffers"]
        lines += ["", "## Why ZeRO-3 used more memory than DDP here", "",
                  f"With DeepSpeed's default settings ZeRO-3 used {z3:.0f} MiB per rank, {z3 / ddp:.2f}x DDP's "
                  f"{ddp:.0f} MiB, although its model states should be half of DDP's. The same run with the "
                  "communication buffers sized for this model (`reduce_bucket_size`, `allgather_bucket_size`, "
                  "`stage3_prefetch_bucket_size` 2e6 elements, `stage3_max_live_parameters` 4e6, "
                  "`stage3_param_persistence_threshold` 1e4) used "
                  f"{small:.0f} MiB ({z3 - small:.0f} MiB less). The defaults are sized for billion-parameter GPU "
                  "models: 5e8-element (2 GB in fp32) reduce and all-gather buckets, 5e7-element prefetch and up to "
                  f"1e9 live gathered parameters (and 1e9 elements of reuse distance), so for a {n_params / 1e6:.0f}M-parameter "
                  "model gathered layers can stay resident between forward and backward and the buckets exceed the "
                  "model states that ZeRO partitions. On CPU they are ordinary "
                  "fp32 host memory, counted in the resident set. What remains above the model-state line is "
                  "activations (outside the ZeRO accounting), the flat fp32 gradient partition and the per-layer "
                  "all-gathers. ZeRO-1 and ZeRO-2 run with the same 5e8-element default buckets, which fits their "
                  "numbers above DDP too (not isolated in this run). Set them through `parallelism.deepspeed` in a "
                  "recipe."]
    atomic_write_text(RESULTS / "parallel.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
