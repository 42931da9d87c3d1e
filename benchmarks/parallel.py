"""Per-rank memory and step time of every launcher, side by side in one run (benchmarks/results/parallel.{json,md}).

A ~54M-parameter BERT (12 layers, hidden 512) on the langid data, fp32 + AdamW, fixed global batch,
2 processes (gloo) for each layout and 1 process as the baseline. Two memory measures per rank:

- live tensor bytes by category (zoo.train.memory, `--profile-memory`): parameters, master weights,
  gradients, optimizer state, other buffers (communication buckets, flat partitions) counted at the
  optimizer step, and the activations autograd saved in a step; what the layout holds, free of allocator history;
- the peak resident set at the end of training minus the resident set before the model existed (what the
  operating system sees, including memory glibc keeps from earlier steps).

Next to it: the ZeRO paper's model-state accounting (Rajbhandari et al. 2020) for N ranks with
fp32 Adam: DDP 16 bytes/param (4 weights + 4 grads + 8 Adam moments); ZeRO-1 partitions the
optimizer state (4 + 4 + 8/N), ZeRO-2 also gradients (4 + 12/N), ZeRO-3 and FSDP everything (16/N).
Then a model of step time at 8, 64 and 512 GPUs (`scaling`), from the model's per-layer FLOPs and each
layout's communication volume, with its assumptions stated in the report.

    python benchmarks/parallel.py [--steps 8] [--layouts ddp,fsdp,zero1,...] [--render]
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
from zoo.provenance import cpu_info  # noqa: E402
from zoo.train.memory import allocator_env  # noqa: E402
from zoo.run_summary import RunSummary  # noqa: E402

BIN = Path(sys.executable).parent
SEQUENCE = 64  # the langid data's token length
RESULTS = ROOT / "benchmarks" / "results"
MODEL = ["--model", "bert", "model_args.num_hidden_layers=12", "model_args.hidden_size=512",
         "model_args.num_attention_heads=8", "model_args.intermediate_size=2048"]
# ZeRO-3 with DeepSpeed's own buffer defaults, next to the sizes the zoo derives from the model (deepspeed.buffer_sizes).
DEEPSPEED_DEFAULTS = ("parallelism.deepspeed={zero_optimization: {reduce_bucket_size: 500000000, "
                      "allgather_bucket_size: 500000000, stage3_prefetch_bucket_size: 50000000, "
                      "stage3_max_live_parameters: 1000000000, stage3_max_reuse_distance: 1000000000, "
                      "stage3_param_persistence_threshold: 100000}}")
LAYOUTS = {
    "1 process": ("ddp.py", 1, []),
    # Half the global batch in one process: the step time of perfect 2-way data parallelism (compute only).
    "1 process at half batch": ("ddp.py", 1, ["global_batch_size=8"]),
    "ddp": ("ddp.py", 2, []),
    "fsdp": ("fsdp.py", 2, []),  # the recipe's default: every block but the last resharded after forward
    "fsdp resharding every block": ("fsdp.py", 2, ["parallelism.fsdp_reshard_after_forward=all"]),
    "fsdp without resharding": ("fsdp.py", 2, ["parallelism.fsdp_reshard_after_forward=none"]),
    "zero1": ("deepspeed.py", 2, ["parallelism.strategy=zero1"]),
    "zero2": ("deepspeed.py", 2, ["parallelism.strategy=zero2"]),
    "zero3": ("deepspeed.py", 2, ["parallelism.strategy=zero3"]),
    "zero3 DeepSpeed default buffers": ("deepspeed.py", 2, ["parallelism.strategy=zero3", DEEPSPEED_DEFAULTS]),
    "horovod": ("horovod.py", 2, []),
    "tp": ("tensor_parallel.py", 2, []),
    "pp": ("pipeline.py", 2, []),
    "ds-pp": ("deepspeed.py", 2, ["parallelism.strategy=ds-pp"]),
    # The same layouts on the system allocator (glibc), to show what jemalloc changes.
    "1 process (system malloc)": ("ddp.py", 1, [], {"ZOO_ALLOCATOR": "system"}),
    "ddp (system malloc)": ("ddp.py", 2, [], {"ZOO_ALLOCATOR": "system"}),
    "fsdp (system malloc)": ("fsdp.py", 2, [], {"ZOO_ALLOCATOR": "system"}),
}
SHARDED = ("fsdp", "zero1", "zero2", "zero3")
THEORY_BYTES_PER_PARAM = {"ddp": lambda n: 16, "zero1": lambda n: 8 + 8 / n, "zero2": lambda n: 4 + 12 / n,
                          "zero3": lambda n: 16 / n, "fsdp": lambda n: 16 / n}


def run_layout(tmp: Path, name: str, steps: int, batch: int) -> dict:
    launcher, nproc, extra, *overrides = LAYOUTS[name]
    allocator = {} if overrides and overrides[0].get("ZOO_ALLOCATOR") == "system" else allocator_env()
    out = tmp / name.replace(" ", "_").replace(",", "")
    args = ["--recipe", "fp32", *MODEL, "--output-dir", str(out), "--no-tracking", "--profile-memory", f"steps={steps}",
            f"global_batch_size={batch}", "quantization.scheme=none", "export.variants=[]",
            "schedule.warmup_steps=0", *extra]
    script = str(ROOT / "launchers" / launcher)
    if launcher == "horovod.py":
        cmd = [str(BIN / "horovodrun"), "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", sys.executable, script]
    elif nproc == 1:
        cmd = [sys.executable, script]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", script]
    env = {**os.environ, **allocator, "OMP_NUM_THREADS": "1", "HOROVOD_GLOO_IFACE": "lo",  # as `zoo train` runs them
           **(overrides[0] if overrides else {})}
    print(f"[{name}] {' '.join(cmd[-1:])} ...", file=sys.stderr, flush=True)
    done = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, cwd=tmp)
    if done.returncode != 0:  # one failing layout is reported, the others still measured
        errors = [line for line in (done.stdout + done.stderr).splitlines() if "Error" in line and "Warning" not in line]
        return {"processes": nproc, "error": (errors or ["exit status %d" % done.returncode])[-1][:300]}
    summary = RunSummary.read(out).model_dump(mode="json")  # validated by the schema
    phase = summary["phases"]["fp32"]
    model_mib = [p - b for p, b in zip(phase["peak_rss_mib"], summary["baseline_rss_mib"])]
    return {"processes": nproc, "strategy": summary["strategy"], "num_params": summary["num_params"],
            # The first two steps warm up; the last two are counted (zoo.train.memory), which costs time.
            "step_seconds": statistics.median(phase["step_seconds"][2:-2]),
            "memory_mib": phase["memory_mib"], "cpu_seconds_per_step": phase["cpu_seconds_per_step"],
            "peak_rss_mib": phase["peak_rss_mib"], "baseline_rss_mib": summary["baseline_rss_mib"],
            "model_state_mib_per_rank": model_mib, "final_loss": phase["final_loss"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--render", action="store_true", help="only rewrite parallel.md from parallel.json")
    args = parser.parse_args()
    if args.render:
        return render(json.loads((RESULTS / "parallel.json").read_text()))
    names = args.layouts.split(",")
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {', '.join(LAYOUTS)}")
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
        if theory:
            r["theory_model_state_mib"] = theory(r["processes"]) * n_params / 2**20
    report = {"model": "bert (12 layers, hidden 512)", "allocator": allocator_env().get("LD_PRELOAD", "system malloc"),
              "num_params": n_params, "global_batch": args.global_batch,
              "cpu": cpu_label(), "cores": os.cpu_count(), "sequence_length": SEQUENCE, "layers": 12, "hidden": 512,
              "steps": args.steps, "threads_per_process": 1, "layouts": results}
    atomic_write_text(RESULTS / "parallel.json", json.dumps(report, indent=2) + "\n")
    render(report)


def render(report: dict) -> None:
    """parallel.md from the measured report: memory by category, the goals, and the scaling model."""
    results, n_params = report["layouts"], report["num_params"]
    lines = [f"# Parallel layouts: per-rank memory and step time ({n_params / 1e6:.1f}M-parameter BERT, fp32 AdamW, "
             f"global batch {report['global_batch']}, 1 thread per process, {report.get('cpu', 'CPU not recorded')}; "
             f"allocator {report.get('allocator', 'system malloc')})",
             "",
             "Live tensor MiB per rank (the larger rank), counted at the optimizer step by `zoo.train.memory` "
             "(`--profile-memory`): parameters, master weights (parameters the optimizer steps that are not the "
             "model's: DeepSpeed's fp32 partition), gradients, optimizer state, other buffers (communication buckets, "
             "flat partitions; buffers held only in C++, like DDP's reducer buckets, are not visible), activations "
             "(what autograd saved in one step). Model states = the first four; the ZeRO paper's accounting for fp32 "
             "Adam on N ranks: DDP 16 bytes/parameter, ZeRO-1 8 + 8/N, ZeRO-2 4 + 12/N, ZeRO-3 and FSDP 16/N. "
             "RSS: peak resident set minus the resident set before the model existed.", "",
             "| layout | N | params | master | grads | optimizer | buffers | activations | model states | accounting "
             "| vs accounting | RSS | step time vs 1 process |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | {r['processes']} | failed: {r['error']} |" + " |" * 11)
            continue
        memory = r.get("memory_mib") or {}
        worst = {k: max(v) for k, v in memory.items()}
        theory = r.get("theory_model_state_mib")
        ratio = r.get("step_time_vs_1_process")
        cells = [f"{worst[k]:.0f}" if k in worst else "-" for k in
                 ("parameters", "master_weights", "gradients", "optimizer_state", "buffers", "activations",
                  "model_states")]
        versus = f"{worst['model_states'] / theory:.2f}x" if theory and "model_states" in worst else "-"
        lines.append(f"| {name} | {r['processes']} | {' | '.join(cells)} | {'-' if theory is None else f'{theory:.0f}'} "
                     f"| {versus} | {max(r['model_state_mib_per_rank']):.0f} | {'-' if ratio is None else f'{ratio:.2f}x'} |")
    lines += goals(results)
    lines += explain(results, n_params)
    lines += cpu_clock_section(results, report.get("cores"))
    lines += scaling_section(report)
    atomic_write_text(RESULTS / "parallel.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def goals(results: dict) -> list[str]:
    """The issue's goals, checked against this run (2 ranks)."""
    ok = {name: r for name, r in results.items() if "error" not in r}
    rows = ["", "## Goals (2 ranks, this run)", "", "| goal | measured | met |", "| --- | --- | --- |"]

    def row(goal, measured, met):
        rows.append(f"| {goal} | {measured} | {'yes' if met else '**no**'} |")

    for name in SHARDED:
        r = ok.get(name)
        if r and r.get("theory_model_state_mib") and r.get("memory_mib"):
            factor = max(r["memory_mib"]["model_states"]) / r["theory_model_state_mib"]
            row(f"{name} model states within 20% of the ZeRO accounting", f"{factor:.2f}x", 0.8 <= factor <= 1.2)
    ddp_rss = max(ok["ddp"]["model_state_mib_per_rank"]) if "ddp" in ok else None
    for name in SHARDED:
        if name in ok and ddp_rss:
            rss = max(ok[name]["model_state_mib_per_rank"])
            row(f"{name} peak RSS below DDP's ({ddp_rss:.0f} MiB)", f"{rss:.0f} MiB", rss < ddp_rss)
    ideal = ok.get("1 process at half batch", {}).get("step_time_vs_1_process")
    if ideal is not None:
        rows.append(f"| (compute alone: one process, half the global batch) | {ideal:.2f}x | - |")
    for name, r in ok.items():
        if r["processes"] > 1 and r.get("step_time_vs_1_process") is not None and name in ("ddp", *SHARDED):
            limit = 0.6 if name == "ddp" else 0.8
            row(f"{name} step time at most {limit}x one process", f"{r['step_time_vs_1_process']:.2f}x",
                r["step_time_vs_1_process"] <= limit)
    return rows


def explain(results: dict, n_params: int) -> list[str]:
    """What the numbers say, from the numbers."""
    lines = ["", "## What the categories show", ""]
    master = {name: max(r["memory_mib"]["master_weights"]) for name, r in results.items()
              if "error" not in r and r.get("memory_mib") and name in SHARDED}
    if master:
        lines.append("- **No fp32 master copy of an fp32 model**: " + ", ".join(
            f"{name} {mib:.0f} MiB" for name, mib in master.items()) + " of master weights per rank. DeepSpeed's ZeRO "
            "optimizers are written for mixed precision and clone each rank's partition into an fp32 master even when "
            f"the model is fp32 (4 bytes per parameter / N = {4 * n_params / 2 / 2**20:.0f} MiB at N = 2: ZeRO-3 would "
            "hold 20/N bytes per parameter, not 16/N); `zoo.train.parallel.deepspeed.share_fp32_master` points the "
            "master at the model's own "
            "partition instead, so the optimizer steps the weights in place.")
    default = results.get("zero3 DeepSpeed default buffers", {})
    derived = results.get("zero3", {})
    if "error" not in default and "error" not in derived and default and derived:
        lines.append(f"- **Buffers sized from the model** (`zoo.train.parallel.deepspeed.buffer_sizes`): ZeRO-3 peak RSS "
                     f"{max(derived['model_state_mib_per_rank']):.0f} MiB vs {max(default['model_state_mib_per_rank']):.0f} "
                     "MiB with DeepSpeed's defaults (5e8-element buckets, 2 GB each in fp32, sized for billion-parameter "
                     "GPU models). Recipe keys under `parallelism.deepspeed.zero_optimization` still override.")
    for name in ("1 process", "ddp", "fsdp"):
        je, system = results.get(name, {}), results.get(f"{name} (system malloc)", {})
        if je and system and "error" not in je and "error" not in system:
            lines.append(f"- **{name}, jemalloc vs the system allocator**: peak RSS {max(je['model_state_mib_per_rank']):.0f} "
                         f"vs {max(system['model_state_mib_per_rank']):.0f} MiB, step {je['step_seconds']:.2f} vs "
                         f"{system['step_seconds']:.2f} s. glibc strands freed blocks in per-thread arenas and heap gaps "
                         "(its mmap threshold grows after large frees), so its resident set keeps allocator history; "
                         "`zoo train` and this benchmark start workers on jemalloc (`zoo.train.memory.allocator_env`).")
    lines.append("- **RSS vs live tensors**: the resident set also holds the Python runtime and the libraries' own "
                 "allocations; the live-tensor columns are what the layout needs.")
    return lines


VOLUME = {"ddp": 2.0, "horovod": 2.0, "zero1": 2.0, "zero2": 2.0, "fsdp": 3.0, "zero3": 3.0}  # x params/N bytes


def cpu_clock_section(results: dict, cores: int | None) -> list[str]:
    """Where each layout's step time goes, from every rank's CPU clocks (zoo.train.measure.cpu_profile)."""
    rows = [r for r in results.values() if "error" not in r and r.get("cpu_seconds_per_step")]
    if not rows or not cores:
        return []
    lines = ["", "## Where the step time goes (CPU clocks of every rank, median step)", "",
             "Training thread: the thread running forward, backward and the optimizer step (1 intra-op thread per "
             "process): the compute plus Python. Other threads: the communication libraries' workers (gloo, Horovod, "
             "DeepSpeed) doing the copies and reductions of collectives. Waiting: wall time the training thread spent "
             f"blocked on them. Machine busy: all ranks' CPU seconds over wall time x {cores} cores.", "",
             "| layout | wall s | training thread s | other threads s | waiting s | machine busy | moved per rank |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    n_params = next(r["num_params"] for r in rows)
    for name, r in results.items():
        cpu = r.get("cpu_seconds_per_step")
        if "error" in r or not cpu:
            continue
        main, other = max(cpu["main_thread"]), max(cpu["other_threads"])
        busy = sum(cpu["main_thread"]) + sum(cpu["other_threads"])
        wall = r["step_seconds"]
        moved = VOLUME.get(r["strategy"])
        moved_text = f"{moved * 4 * n_params / r['processes'] / 2**20:.0f} MiB" if moved and r["processes"] > 1 else "-"
        lines.append(f"| {name} | {wall:.2f} | {main:.2f} | {other:.2f} | {max(0.0, wall - main):.2f} | "
                     f"{min(busy / (wall * cores), 9.99):.0%} | {moved_text} |")
    ideal = results.get("1 process at half batch", {})
    if "step_time_vs_1_process" in ideal:
        lines += ["", f"- One process with half the global batch — one rank's compute under perfect 2-way data "
                  f"parallelism — takes {ideal['step_time_vs_1_process']:.2f}x the full-batch step: DDP's 0.6x goal "
                  "leaves almost nothing for moving the gradients. Ring collectives move 2(N-1)/N of the gradients "
                  "per rank for DDP, Horovod and ZeRO-1/2 (reduce-scatter + all-gather), 3(N-1)/N for ZeRO-3 and FSDP "
                  "(parameters gathered for forward and again for backward, gradients reduce-scattered).",
                  f"- With as many ranks as cores ({cores}), the training threads alone keep the machine busy; the "
                  "communication threads' copies and reductions then run on the same cores and add to the step "
                  "instead of hiding behind backward: overlap hides latency, not work. On GPUs, NCCL's transfers run "
                  "on copy engines and NVLink beside the kernels, which is what the scaling model below assumes."]
    return lines


# -- a model of step time at scale ---------------------------------------------------------------------------------
# Assumptions, printed with the table. Bandwidths are per GPU and per direction.
GPU_TFLOPS = 400.0  # sustained bf16 matmul rate per GPU (about 40% of an H100 SXM's dense peak)
NVLINK_GBPS = 450.0  # inside a node of 8 GPUs (NVLink 4)
NETWORK_GBPS = 50.0  # between nodes (one 400 Gb/s InfiniBand port per GPU)
LATENCY_US = 5.0  # per ring step
GPUS_PER_NODE = 8
SEQUENCES_PER_GPU = 32  # weak scaling: the global batch grows with the GPU count
BYTES = 2  # bf16 parameters, gradients and activations on the wire


def layer_flops(hidden: int, seq: int) -> float:
    """Forward FLOPs of one BERT encoder layer for one sequence: q, k, v, output and two FFN (4h) matmuls + attention."""
    return 2 * seq * (4 * hidden * hidden + 2 * hidden * 4 * hidden) + 2 * 2 * seq * seq * hidden


def ring_seconds(volume_bytes: float, ranks: int, collectives: int) -> float:
    """A ring collective moving `volume_bytes` per rank; the slowest link is the network once it leaves a node."""
    if ranks <= 1:
        return 0.0
    bandwidth = (NVLINK_GBPS if ranks <= GPUS_PER_NODE else NETWORK_GBPS) * 1e9
    return volume_bytes / bandwidth + collectives * (ranks - 1) * LATENCY_US * 1e-6


def predict(report: dict, gpus: int) -> dict[str, float]:
    """Predicted seconds per step for each layout at `gpus` GPUs (see the assumptions in the report)."""
    layers, hidden, seq, params = report["layers"], report["hidden"], report["sequence_length"], report["num_params"]
    compute = 3 * layers * layer_flops(hidden, seq) * SEQUENCES_PER_GPU / (GPU_TFLOPS * 1e12)  # forward + backward
    backward = compute * 2 / 3  # the window in which gradient communication can overlap
    grads = params * BYTES
    buckets = max(1, grads // (25 * 2**20))  # DDP's 25 MiB buckets
    factor = 2 * (gpus - 1) / gpus  # ring all-reduce moves 2(N-1)/N of the data per rank
    allreduce = ring_seconds(factor * grads, gpus, 2 * buckets)
    half = ring_seconds(factor / 2 * grads, gpus, buckets)  # one reduce-scatter or one all-gather
    out = {"ddp": compute + max(0.0, allreduce - backward)}
    out["zero1/zero2"] = compute + max(0.0, half - backward) + half  # the parameter all-gather follows the step
    # ZeRO-3/FSDP: all-gather parameters for forward and again for backward, reduce-scatter gradients; prefetch hides
    # the gathers behind the previous layer's compute where they are shorter.
    out["zero3/fsdp"] = compute + max(0.0, 3 * half - compute)
    tp = min(gpus, GPUS_PER_NODE)  # tensor parallel inside a node, data parallel across nodes
    activations = SEQUENCES_PER_GPU * seq * hidden * BYTES
    tp_comm = 4 * layers * ring_seconds(2 * (tp - 1) / tp * activations, tp, 1)  # 2 all-reduces forward, 2 backward
    dp = gpus // tp
    dp_grads = ring_seconds(2 * (dp - 1) / max(dp, 1) * grads / tp, dp, 2 * buckets)
    out["tp (up to 8, inside a node) x dp across"] = compute + tp_comm + max(0.0, dp_grads - backward)
    stages = min(gpus, layers, 4)
    micro = 8
    bubble = (stages - 1) / (micro + stages - 1)
    pp_dp = gpus // stages
    pp_grads = ring_seconds(2 * (pp_dp - 1) / max(pp_dp, 1) * grads / stages, pp_dp, 2 * buckets)
    out[f"pp ({stages} stages, 1F1B, {micro} micro-batches) x dp"] = compute / (1 - bubble) + max(0.0, pp_grads - backward)
    out["compute alone"] = compute
    return out


def scaling_section(report: dict) -> list[str]:
    if not {"layers", "hidden", "sequence_length"} <= set(report):
        return []
    columns = (8, 64, 512)
    predictions = {g: predict(report, g) for g in columns}
    layer_gflop = 3 * layer_flops(report["hidden"], report["sequence_length"]) / 1e9
    lines = ["", "## Predicted step time at scale (a model, not a measurement)", "",
             f"Per GPU: {SEQUENCES_PER_GPU} sequences of {report['sequence_length']} tokens (weak scaling); "
             f"{layer_gflop:.2f} GFLOP per layer per sequence forward + backward, {report['layers']} layers; "
             f"{GPU_TFLOPS:.0f} TFLOP/s sustained per GPU; bf16 on the wire; {GPUS_PER_NODE} GPUs per node joined by "
             f"{NVLINK_GBPS:.0f} GB/s NVLink, nodes by {NETWORK_GBPS:.0f} GB/s per GPU; ring collectives "
             f"({LATENCY_US:.0f} µs per ring step, DDP's 25 MiB buckets); gradient communication overlaps the backward "
             "pass, ZeRO-3/FSDP parameter gathers overlap compute, tensor-parallel all-reduces do not; pipelines "
             "pay the 1F1B bubble (p - 1)/(m + p - 1). Embedding and classifier compute left out. Use it to rank "
             "layouts before renting a cluster, then measure.", "",
             *measured_rate(report, layer_gflop),
             "| layout | " + " | ".join(f"{g} GPUs, ms/step" for g in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for name in predictions[columns[0]]:
        lines.append(f"| {name} | " + " | ".join(f"{predictions[g][name] * 1e3:.1f}" for g in columns) + " |")
    lines.append("")
    for g in columns:
        layouts = {k: v for k, v in predictions[g].items() if k != "compute alone"}
        best = min(layouts, key=layouts.get)
        lines.append(f"- {g} GPUs: fastest predicted layout {best} ({layouts[best] * 1e3:.1f} ms); compute is "
                     f"{predictions[g]['compute alone'] / layouts['ddp']:.0%} of DDP's predicted step, the rest is "
                     "communication the backward pass cannot hide.")
    return lines


def measured_rate(report: dict, layer_gflop: float) -> list[str]:
    """The same FLOP count against the 1-process step measured above: the rate this CPU sustained."""
    one = report["layouts"].get("1 process", {}) if "layouts" in report else {}
    if "step_seconds" not in one:
        return []
    gflop = layer_gflop * report["layers"] * report["global_batch"]
    return [f"Calibration: the 1-process step above ({report['global_batch']} sequences, {gflop:.0f} GFLOP in the "
            f"encoder layers) took {one['step_seconds']:.2f} s on this CPU, {gflop / one['step_seconds']:.0f} GFLOP/s "
            "with 1 thread; the GPU rate assumed here is that count divided by the table's compute time.", ""]


def cpu_label() -> str:
    cpu = cpu_info()
    return f"{cpu['model']}, {os.cpu_count()} CPUs ({', '.join(cpu['flags'])})"


if __name__ == "__main__":
    main()
