"""onnxruntime latency of every built variant of every entry, side by side in one run, and where the time goes.

For each entry: every ONNX variant the card lists (fetched and sha256-checked), plus, for transformers, fp32 after
onnxruntime's offline transformer optimizer ("fp32-fused": Attention, SkipLayerNormalization, BiasGelu), so int8 is
compared with fp32 at its best. Batch 1 and 32, 1 and 2 intra-op threads, a warm-up then 30 timed runs per file
interleaved round by round (zoo.evaluate.timings), median and p90. Then, for the transformer entries, onnxruntime's
profiler per operator type (batch 32, 1 thread): which operators still run in float, how much time goes to
(de)quantization, which QuantizeLinear/DequantizeLinear nodes onnxruntime did not fuse into an integer kernel.

Writes benchmarks/results/latency.{json,md} and profiles.{json,md}; the docs show both. The reports hold one run per
CPU kind (model and ISA flags): a run on this machine replaces this CPU's run and keeps the other CPUs' runs, as long
as every file they name is still the card's (a run that measured an older build is dropped, and says so).

    python benchmarks/latency.py [--runs 30] [--threads 1 2] [NAME ...]
    python benchmarks/latency.py --render     # rewrite the .md reports from the committed .json, measuring nothing

With names, only those entries are measured and this CPU's run keeps the other entries' rows, provided it was
measured with these library versions and settings; otherwise it refuses, and every entry is re-measured by running it
without names. Each entry records the date it was measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo import catalog  # noqa: E402
from zoo.data import load_dataset  # noqa: E402
from zoo.errors import ZooError  # noqa: E402
from zoo.evaluate import (  # noqa: E402
    INT8_KERNELS, QUANTIZERS, SPEED_BATCHES, int8_bound, kernel_counts, op_profile, session_runner, share, timings, why,
)
from zoo.fsutil import atomic_write_text  # noqa: E402
from zoo.docs.common import load_json, report_runs  # noqa: E402
from zoo.provenance import cpu_info, cpu_kind, current_versions, int8_peak  # noqa: E402
from zoo.bench import (  # noqa: E402
    FUSED, QAT_NO_SPIN, QAT_OPTIMIZED, TORCH_AO_DYNAMIC, TORCH_EAGER, TRIED, files, torch_runners, tried_routes,
)

GOAL = 2.0  # issue 16: int8-qat at least twice as fast as the faster fp32, at batch 1 and 32, 1 and 2 threads
MAX_DROP = 0.005  # ... losing at most half a point of accuracy
TORCH_ROWS = (TORCH_EAGER, TORCH_AO_DYNAMIC)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*", help="entries (default: every built one)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--render", action="store_true", help="rewrite the .md reports from the .json, measure nothing")
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "results"
    if args.render:
        return write(out, *committed(out))
    cpu = cpu_info()
    results: dict = {"cpu": cpu, "runs": args.runs, "batches": list(SPEED_BATCHES), "libraries": current_versions(),
                     "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "entries": {}}
    profiles: dict = {"cpu": cpu, "batch": 32, "threads": 1, "libraries": results["libraries"], "date": results["date"],
                      "entries": {}}
    if args.names:
        results, profiles = kept(out, results, profiles)
    with tempfile.TemporaryDirectory(prefix="zoo-latency-") as tmp:
        for name in args.names or list(catalog.entries()):
            card = catalog.get_card(name)
            try:  # the card's files, fetched and verified; fp32-fused beside fp32 for transformers
                named = files(name, Path(tmp))
            except ZooError as exc:
                print(f"skip {name}: {exc}", file=sys.stderr)
                continue
            paths = {k: path for k, (path, _) in named.items()}
            test = load_dataset(card.dataset.name).test
            x = test.x.numpy()
            # What a user would run instead, in the same rounds: the fp32 weights in PyTorch, eager and torch.ao int8.
            alternatives = torch_runners(name, paths["fp32"], x, test.y.numpy()) if FUSED in paths else {}
            # Routes tried to make int8-qat faster, timed in the same rounds (zoo.bench.TRIED).
            tried = tried_routes(name, paths, Path(tmp), x, test.y.numpy())
            measured = {}
            for t in args.threads:
                torch.set_num_threads(t)
                no_spin = {QAT_NO_SPIN: session_runner(paths["int8-qat"], t, spinning=False)} if tried and t > 1 else {}
                measured[t] = timings({**paths, **{k: path for k, (path, _) in tried.items()}, **no_spin,
                                       **{k: run for k, (run, _) in alternatives.items()}}, x, SPEED_BATCHES,
                                      t, args.runs)
            measured_here = {k: acc for k, (_, acc) in (alternatives | tried).items()}
            if tried and max(args.threads) > 1:  # the int8-qat file itself, in a session that does not spin
                measured_here[QAT_NO_SPIN] = card.metric("int8-qat")
            accuracy = {k: card.metric(k if k != FUSED else "fp32") for k in paths} | measured_here
            results["entries"][name] = {"family": card.family, "date": results["date"], "accuracy": accuracy,
                                        "sha256": {k: sha for k, (_, sha) in named.items()}, "threads": {
                str(t): {k: {str(b): {"median_ms": m[b][0], "p90_ms": m[b][1]} for b in SPEED_BATCHES}
                         for k, m in per.items()} for t, per in measured.items()}}
            if card.family == "bert":
                profiled = {**{k: (p, named[k][1]) for k, p in paths.items()}, **{k: (p, "") for k, (p, _) in tried.items()}}
                profiles["entries"][name] = {k: {"per_op_us": op_profile(p, x[:32], 1, 10), "graph": kernel_counts(p),
                                                 "sha256": sha} for k, (p, sha) in profiled.items()}
            print(f"measured {name}", file=sys.stderr)
    latency_runs, profile_runs, dropped = merged(*committed(out), results, profiles)
    for line in dropped:
        print(line, file=sys.stderr)
    write(out, latency_runs, profile_runs)


def merged(latency_runs: list[dict], profile_runs: list[dict], results: dict, profiles: dict):
    """The reports' runs after this machine's (`results`, `profiles`): it replaces its CPU's earlier run; the other
    CPUs' runs stay while every file they measured is still the card's, and are dropped (said in `dropped`) when not.
    Sorted by CPU kind. Returns (latency runs, profile runs, dropped)."""
    pairs, dropped = [(results, profiles)], []
    for run in latency_runs:
        if same_cpu(run, results):
            continue
        if stale := stale_files(run):
            dropped.append(f"dropped the run on {cpu_kind(run['cpu'])} ({run['date']}): it measured {stale[0]}, no "
                           "longer the card's file; re-run this script on that CPU")
            continue
        pairs.append((run, on_cpu(profile_runs, run)))
    pairs.sort(key=lambda pair: (cpu_kind(pair[0]["cpu"]), pair[0]["cpu"]["flags"]))
    return [run for run, _ in pairs], [prof for _, prof in pairs if prof], dropped


def same_cpu(a: dict, b: dict) -> bool:
    return (a["cpu"]["model"], a["cpu"]["flags"]) == (b["cpu"]["model"], b["cpu"]["flags"])


def on_cpu(runs: list[dict], run: dict, default=None):
    """The run of `runs` measured on `run`'s CPU (model and flags), else `default`."""
    return next((other for other in runs if same_cpu(other, run)), default)


def committed(out: Path) -> tuple[list[dict], list[dict]]:
    """The committed reports' runs (latency, profiles), one per CPU kind."""
    return report_runs(load_json(out / "latency.json")), report_runs(load_json(out / "profiles.json"))


def stale_files(run: dict) -> list[str]:
    """The files a latency run measured that are no longer the card's (fp32-fused, made at measurement time, has none)."""
    stale, names = [], set(catalog.list_models())
    for name, entry in run["entries"].items():
        variants = catalog.get_card(name).variants if name in names else {}
        stale += [f"{name} {k} {sha[:12]}" for k, sha in entry.get("sha256", {}).items()
                  if sha and (k not in variants or variants[k].sha256 != sha)]
    return stale


def write(out: Path, latency_runs: list[dict], profile_runs: list[dict]) -> None:
    atomic_write_text(out / "latency.json", json.dumps({"runs": latency_runs}, indent=2) + "\n")
    atomic_write_text(out / "profiles.json", json.dumps({"runs": profile_runs}, indent=2) + "\n")
    latency_md = "\n".join(["# onnxruntime latency, every variant side by side", "",
                            "One run per CPU kind, each measured side by side on that machine by "
                            "`python benchmarks/latency.py` (a run on another kind adds its own section; int8 gains "
                            "depend on the instructions a CPU has, so a run never mixes machines).", ""]
                           + [report(run, on_cpu(profile_runs, run, {"entries": {}}))
                              for run in latency_runs])
    profiles_md = "\n".join(["# Where the time goes: onnxruntime profiles of the BERT entries", "",
                             "One run per CPU kind; onnxruntime's profiler per operator type of the graph onnxruntime "
                             "runs after its fusions (microseconds per run). Integer kernels: "
                             + ", ".join(sorted(INT8_KERNELS)) + ".", ""] + [profile_report(p) for p in profile_runs])
    atomic_write_text(out / "latency.md", latency_md)
    atomic_write_text(out / "profiles.md", profiles_md)
    print(latency_md + "\n" + profiles_md)


def kept(out: Path, results: dict, profiles: dict) -> tuple[dict, dict]:
    """This CPU's committed run, to be updated entry by entry: only when it was measured as this run measures (the
    same library versions, runs and batches), so one run never mixes settings."""
    latency_runs, profile_runs = committed(out)
    old_results = on_cpu(latency_runs, results)
    if old_results is None:
        raise SystemExit(f"error: latency.json has no run on this CPU ({cpu_kind(results['cpu'])}): run "
                         "`python benchmarks/latency.py` without names to measure every entry on this machine")
    old_profiles = on_cpu(profile_runs, results, {"entries": {}})
    differs = [k for k in ("libraries", "runs", "batches") if old_results.get(k) != results[k]]
    if differs:
        raise SystemExit(f"error: this CPU's run in latency.json was measured with other {', '.join(differs)} "
                         f"({old_results.get('date')}): run `python benchmarks/latency.py` without names to measure "
                         "every entry on this machine")
    for name, entry in old_results["entries"].items():
        entry.setdefault("date", old_results["date"])
    return ({**results, "entries": old_results["entries"]}, {**profiles, "entries": old_profiles["entries"]})


def _best_fp32(per: dict, batch: str) -> tuple[str, float]:
    candidates = {k: per[k][batch]["median_ms"] for k in ("fp32", FUSED) if k in per}
    best = min(candidates, key=candidates.get)
    return best, candidates[best]


def report(results: dict, profiles: dict) -> str:
    """One CPU's run: every entry's table per thread count, the int8 goal against that CPU's bound, PyTorch rows."""
    cpu = results["cpu"]
    label = f"{cpu['model']} ({', '.join(cpu['flags'])})"
    lines = [f"## On {cpu_kind(cpu)}", "",
             f"Measured on {label} on {results.get('date', 'an unrecorded date')} (each entry's own date in its "
             "heading) with "
             + ", ".join(f"{k} {v}" for k, v in results.get("libraries", {}).items())
             + f"; each file is named by its sha256 (the card's). Median and p90 of {results['runs']} runs after a "
             "warm-up, files interleaved round by "
             f"round; speed = the faster fp32's median over the variant's (above 1x: faster). `{FUSED}` is fp32 after "
             "onnxruntime's transformer optimizer (Attention, SkipLayerNormalization and BiasGelu fused).", ""]
    goal_rows = []
    for name, entry in results["entries"].items():
        for threads, per in entry["threads"].items():
            lines += [f"### {name}, {threads} {'thread' if threads == '1' else 'threads'} ({entry.get('date', results['date'])})",
                      "",
                      "| variant | sha256 | accuracy | b1 median (ms) | b1 p90 | b1 speed | b32 median (ms) | b32 p90 | "
                      "b32 speed |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for key, timing in per.items():
                cells = []
                for b in ("1", "32"):
                    _, best = _best_fp32(per, b)
                    cells += [f"{timing[b]['median_ms']:.3f}", f"{timing[b]['p90_ms']:.3f}",
                              f"{best / timing[b]['median_ms']:.2f}x"]
                acc = entry["accuracy"][key]
                sha = entry.get("sha256", {}).get(key)
                file = f"`{sha[:12]}`" if sha else ("PyTorch, the fp32 file's weights" if key in TORCH_ROWS
                                                    else "tried: int8-qat's file" if key in TRIED
                                                    else "made from fp32 here")
                lines.append(f"| {key} | {file} | {'-' if acc is None else f'{acc:.4f}'} | " + " | ".join(cells) + " |")
            lines.append("")
            if entry["family"] == "bert" and "int8-qat" in per:
                for b in ("1", "32"):
                    base, best = _best_fp32(per, b)
                    speed = best / per["int8-qat"][b]["median_ms"]
                    vs_ptq = per["int8-ptq"][b]["median_ms"] / per["int8-qat"][b]["median_ms"] if "int8-ptq" in per else None
                    goal_rows.append((name, threads, b, base, speed, vs_ptq))
    drops = {n: (e["accuracy"]["fp32"] - e["accuracy"]["int8-qat"]) for n, e in results["entries"].items()
             if e["family"] == "bert" and e["accuracy"].get("int8-qat") is not None}
    peak, instructions = int8_peak(results["cpu"]["flags"])
    bounds = {name: int8_bound(p[FUSED]["per_op_us"], peak) for name, p in profiles["entries"].items() if FUSED in p}
    lines += ["### Goal: BERT int8-qat at least 2.0x the faster fp32, at least as fast as int8-ptq, within 0.5 points",
              "", f"This CPU's int8 peak is **{peak:.2f}x** fp32's multiply-accumulate throughput ({instructions}). "
              "The bound is the most int8 could gain over the fused fp32 file if every matrix product ran at that "
              "peak and every other operator as in fp32 (Amdahl's law over its profile, batch 32, 1 thread: "
              "profiles.md); the last column is the share of that bound int8-qat reaches.", "",
              "| entry | threads | batch | faster fp32 | int8-qat speed | vs goal | int8-qat / int8-ptq speed | "
              "accuracy drop (points) | bound | of bound |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, threads, b, base, speed, vs_ptq in goal_rows:
        gap = "met" if speed >= GOAL else f"short by {GOAL - speed:.2f}x"
        bound = bounds.get(name)
        lines.append(f"| {name} | {threads} | {b} | {base} | {speed:.2f}x | {gap} | "
                     f"{'-' if vs_ptq is None else f'{vs_ptq:.2f}x'} | {drops.get(name, 0) * 100:+.2f} | "
                     + ("- | - |" if bound is None else f"{bound:.2f}x | {speed / bound:.0%} |"))
    missed = [r for r in goal_rows if r[4] < GOAL]
    if out_of_reach := sorted(name for name, bound in bounds.items() if bound < GOAL):
        lines += ["", f"On this CPU the bound itself is below {GOAL:.1f}x for {', '.join(out_of_reach)}: no int8 file of "
                  "these models can meet the goal here, so what counts is the share of the bound reached."]
    lines += ["", f"{len(goal_rows) - len(missed)} of {len(goal_rows)} cells meet the 2.0x goal"
              + (f"; accuracy drops within {MAX_DROP * 100:.1f} points: "
                 f"{all(d <= MAX_DROP + 1e-12 for d in drops.values())}." if drops else ".")
              + " Where it is missed, the int8-qat file's time (onnxruntime profiler, batch 32, 1 thread; "
              "profiles.md has every variant):", ""]
    for name in sorted({r[0] for r in missed}):
        prof = profiles["entries"].get(name, {}).get("int8-qat")
        if prof:
            lines.append(f"- {name}: {why(prof['per_op_us'], Counter(prof['graph']))}. Integer arithmetic speeds up "
                         "only the matrix products; the float operators and the conversions run at fp32's speed, so "
                         "the narrower the model, the larger the share int8 cannot shrink.")
    if any(r[1] != "1" for r in missed):
        lines.append("- 2 threads on a machine with as many cores as threads: the timing thread and onnxruntime's "
                     "worker share the cores with everything else, and batch-1 runs are dominated by thread hand-offs "
                     "(see the p90 columns).")
    lines.append("")
    return "\n".join(lines + tried_report(results, profiles) + against_pytorch(results))


def tried_report(results: dict, profiles: dict) -> list[str]:
    """What was tried to make int8-qat faster, each route timed in the same rounds as the file itself (runs measured
    before these rows existed have none)."""
    rows = []
    for name, entry in results["entries"].items():
        for threads, per in entry["threads"].items():
            if "int8-qat" in per and any(k in per for k in TRIED):
                for b in ("1", "32"):
                    qat = per["int8-qat"][b]["median_ms"]
                    cells = [f"{per[k][b]['median_ms']:.3f} ({qat / per[k][b]['median_ms']:.2f}x)" if k in per else "-"
                             for k in TRIED]
                    rows.append(f"| {name} | {threads} | {b} | {qat:.3f} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    attention = []
    for name, variants in profiles["entries"].items():
        qat, dynamic = variants.get("int8-qat"), variants.get("int8-dynamic")
        if qat and dynamic:
            float_products = share(qat["per_op_us"], {"FusedMatMul", "MatMul"})
            attention.append(f"{name} {float_products:.0%} (int8-dynamic's QAttention: "
                             f"{share(dynamic['per_op_us'], {'QAttention'}):.0%} of its time)")
    return ["### What was tried for int8-qat", "",
            "Each route timed in the same rounds as the int8-qat file (median ms; in brackets, int8-qat's time over "
            f"the route's: above 1x the route is faster). `{QAT_OPTIMIZED}`: the int8-qat file through onnxruntime's "
            f"transformer optimizer, the pass that makes `{FUSED}` faster (its accuracy, measured, is in the tables "
            f"above). `{QAT_NO_SPIN}`: the same file in a session whose intra-op threads sleep instead of spinning "
            "while they wait (2 threads only).", "",
            "| entry | threads | batch | int8-qat (ms) | " + " | ".join(TRIED) + " |",
            "| --- " * (4 + len(TRIED)) + "|", *rows, "",
            "Fused int8 attention (QAttention) is what int8-dynamic runs; int8-qat's graph comes from QAT of the "
            "Linear layers (torchao's X86InductorQuantizer annotates those), so attention's two activation x activation "
            "products stay float matrix products, the share of int8-qat's time (batch 32, 1 thread): "
            + "; ".join(attention) + ". The int8 matrix kernels are chosen by onnxruntime (MLAS) from the CPU's instructions "
            "when a session starts, with no session option to pick them: the int8 peak above names the ones this CPU "
            "has (AVX2's vpmaddubsw, AVX-512 VNNI, or AMX tiles).", ""]


def against_pytorch(results: dict) -> list[str]:
    """The zoo's int8-qat file next to what a user would run instead, timed in the same rounds: the fp32 weights in
    PyTorch eager and after torch.ao's dynamic int8 (entries measured before these rows existed have none)."""
    rows = []
    for name, entry in results["entries"].items():
        for threads, per in entry["threads"].items():
            if TORCH_AO_DYNAMIC in per and "int8-qat" in per:
                for b in ("1", "32"):
                    ms = {k: per[k][b]["median_ms"] for k in (TORCH_EAGER, TORCH_AO_DYNAMIC, "int8-qat")}
                    acc = entry["accuracy"]
                    rows.append(f"| {name} | {threads} | {b} | {ms[TORCH_EAGER]:.3f} | {ms[TORCH_AO_DYNAMIC]:.3f} | "
                                f"{ms['int8-qat']:.3f} | {ms[TORCH_AO_DYNAMIC] / ms['int8-qat']:.2f}x | "
                                f"{acc[TORCH_AO_DYNAMIC]:.4f} / {acc['int8-qat']:.4f} |")
    if not rows:
        return []
    return ["### Against PyTorch: the same weights, eager and torch.ao dynamic int8", "",
            "What a user would run without the zoo's ONNX files, timed in the same rounds as the files above: the fp32 "
            "file's weights in the family's PyTorch module (torch-eager), and after `torch.ao.quantization."
            "quantize_dynamic` of its Linear layers (torch-ao-dynamic, qint8 weights), each with torch's intra-op "
            "threads set to the row's count. Above 1x, the zoo's int8-qat file is faster; accuracy on the test split. "
            "Hugging Face Optimum's onnxruntime quantization is not measured: it now lives in optimum-onnx, whose only "
            "release (0.1.0) requires transformers<4.58 and the `onnxruntime` distribution (the zoo runs transformers "
            "5 for `zoo import`'s parity check and onnxruntime-training, which owns the same module); its quantizer is "
            "onnxruntime.quantization, which the int8-dynamic and int8-ptq files above already run.",
            "", "| entry | threads | batch | torch-eager (ms) | torch-ao-dynamic (ms) | int8-qat (ms) | int8-qat vs "
            "torch-ao-dynamic | accuracy torch-ao-dynamic / int8-qat |", "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows, ""]


def profile_report(profiles: dict) -> str:
    """One CPU's profiles: per BERT entry, where each variant's time goes."""
    cpu = profiles["cpu"]
    lines = [f"## On {cpu_kind(cpu)}", "",
             f"onnxruntime's profiler on {cpu['model']} ({', '.join(cpu['flags'])}) on {profiles.get('date')}, batch "
             f"{profiles['batch']}, {profiles['threads']} thread.", ""]
    for name, variants in profiles["entries"].items():
        lines += [f"### {name}", "", "| variant | total (ms) | integer kernels | (de)quantization | float operators | "
                  "unfused Q/DQ nodes | top operators |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for key, data in variants.items():
            prof, graph = data["per_op_us"], Counter(data["graph"])
            total = sum(prof.values())
            top = ", ".join(f"{op} {us / total:.0%}" for op, us in list(prof.items())[:5])
            floats = 1 - share(prof, INT8_KERNELS) - share(prof, QUANTIZERS)
            lines.append(f"| {key} | {total / 1000:.2f} | {share(prof, INT8_KERNELS):.0%} | {share(prof, QUANTIZERS):.0%} "
                         f"| {floats:.0%} | {graph['QuantizeLinear'] + graph['DequantizeLinear']} | {top} |")
        lines.append("")
        for key in ("int8-qat", "int8-ptq", "int8-dynamic"):
            if key in variants:
                lines.append(f"- {key}: {why(variants[key]['per_op_us'], Counter(variants[key]['graph']))}.")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
