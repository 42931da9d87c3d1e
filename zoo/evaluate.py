"""Measure ONNX files with real onnxruntime sessions: logits, accuracy, kernel types, latency.

The bottom of the measuring stack: it knows ONNX files and arrays, not cards, stores or kinds."""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from zoo.catalog import require_content
from zoo.metrics import label_accuracy
from zoo.onnx_passes import op_types
from zoo.ort import ort


def session(path: Path, threads: int = 1, optimized_to: Path | None = None,
            spinning: bool = True) -> ort.InferenceSession:
    """`spinning=False`: intra-op threads sleep between tasks instead of busy-waiting (onnxruntime's
    session.intra_op.allow_spinning), which frees the cores they share with the caller."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # keep ORT's optimizer chatter off the user's terminal
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_to is not None:
        options.optimized_model_filepath = str(optimized_to)
    return ort.InferenceSession(str(require_content(Path(path))), options, providers=["CPUExecutionProvider"])


# How many rows `predict` runs at once. onnxruntime computes each row the same way whatever else its batch holds (the
# same bytes at 16 as at 256 for every fp32, fp16, int8-qat and int8-ptq file of the catalog), and a small batch keeps
# a transformer's activations in the CPU's caches: fewer CPU-seconds for the same logits (benchmarks/eval_batch.py).
# A dynamically quantized graph is the exception: it quantizes each activation tensor with one scale computed over the
# whole batch, so its outputs depend on the rows beside them; such files are run at DYNAMIC_BATCH, the batch their
# cards' metrics were measured at.
BATCH = 16
DYNAMIC_BATCH = 256
BATCH_DEPENDENT_OPS = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"}


def batch_size_for(path: Path) -> int:
    """`predict`'s batch for a file: DYNAMIC_BATCH where its outputs depend on the batch, else BATCH. Read once per
    version of the file (validation predicts one file several times; a BERT file takes 0.1 s to parse)."""
    stat = Path(path).stat()
    return _batch_size_of(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _batch_size_of(path: str, size: int, mtime_ns: int) -> int:  # size and mtime: a rewritten file is read again
    return DYNAMIC_BATCH if op_types(onnx.load(path)) & BATCH_DEPENDENT_OPS else BATCH


def predict(path: Path, x: np.ndarray, batch_size: int | None = None, threads: int = 1) -> np.ndarray:
    """Logits for `x`, run in batches (default: `batch_size_for` the file)."""
    sess = session(path, threads)  # first: it says so when the file is a Git LFS pointer
    batch_size = batch_size or batch_size_for(path)
    name = sess.get_inputs()[0].name
    outputs = [sess.run(None, {name: x[i:i + batch_size]})[0] for i in range(0, len(x), batch_size)]
    return np.concatenate(outputs).astype(np.float32)


def accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    return label_accuracy(predict(path, x), y)


def kernel_counts(path: Path) -> Counter:
    """Node types (and how many of each) of the graph ORT actually runs, after its fusions."""
    with tempfile.TemporaryDirectory() as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        session(path, optimized_to=optimized)
        return Counter(node.op_type for node in onnx.load(str(optimized)).graph.node)


def kernel_types(path: Path) -> set[str]:
    """Node types of the graph ORT actually runs (after its QDQ fusions)."""
    return set(kernel_counts(path))


# The operators of a fused fp32 transformer graph that are matrix products (Attention counted whole: its projections
# and score products are, its softmax is not, so a bound computed with it is an upper bound).
MATRIX_PRODUCTS = {"MatMul", "Gemm", "FusedMatMul", "Attention"}
QUANTIZERS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
INT8_KERNELS = {"QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
                "MatMulIntegerToFloat", "QAttention"}


SPEED_BATCHES = (1, 32)  # the batch sizes cards and benchmarks report: one request, and a served batch


def session_runner(path: Path, threads: int, spinning: bool = True) -> Callable[[np.ndarray], object]:
    sess = session(path, threads, spinning=spinning)
    feed = sess.get_inputs()[0].name
    return lambda data: sess.run(None, {feed: data})


def timings(paths: dict[str, Path | Callable[[np.ndarray], object]], x: np.ndarray,
            batches: tuple[int, ...] = SPEED_BATCHES, threads: int = 1, runs: int = 30,
            warmup: int = 5) -> dict[str, dict[int, tuple[float, float]]]:
    """{name: {batch: (median ms, p90 ms)}} of one run on the first `batch` rows of `x`, everything measured side by
    side: an ONNX file in an onnxruntime session (made once, `threads` intra-op threads), or a callable that runs a
    batch itself (e.g. a PyTorch module, its threads set by the caller). All are warmed up, then each round runs each
    once in turn, so whatever else the machine does slows all of them alike (a benchmark helper; never asserted in
    tests)."""
    runners = {name: what if callable(what) else session_runner(what, threads) for name, what in paths.items()}
    out: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in paths}
    for batch in batches:
        data = x[:batch]
        samples: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(warmup):
            for run in runners.values():
                run(data)
        for _ in range(runs):
            for name, run in runners.items():
                start = time.perf_counter()
                run(data)
                samples[name].append(time.perf_counter() - start)
        for name, values in samples.items():
            out[name][batch] = (float(np.median(values) * 1000), float(np.percentile(values, 90) * 1000))
    return out


def latency_ms(path: Path, x: np.ndarray, repeats: int = 30, threads: int = 1) -> float:
    """Median ms of one run on `x` (one file alone; `timings` compares files)."""
    return timings({"file": path}, x, (len(x),), threads, repeats)["file"][len(x)][0]


def op_profile(path: Path, x: np.ndarray, threads: int = 1, runs: int = 20) -> dict[str, float]:
    """Microseconds per run spent in each operator type of the graph onnxruntime actually runs (after its fusions),
    from onnxruntime's own profiler over `runs` runs on `x` (a benchmark helper)."""
    with tempfile.TemporaryDirectory(prefix="zoo-profile-") as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        sess = ort.InferenceSession(str(require_content(Path(path))), options, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        sess.run(None, {name: x})  # the first run allocates: kept out of the numbers below
        start = time.perf_counter_ns() // 1000 - sess.get_profiling_start_time_ns() // 1000
        for _ in range(runs):
            sess.run(None, {name: x})
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: Counter = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= start:
            per_op[event["args"]["op_name"]] += event["dur"]
    return {op: us / runs for op, us in per_op.most_common()}


def int8_bound(fp32_profile: dict[str, float], peak: float) -> float:
    """Amdahl's law over an fp32 file's per-operator profile: how much faster than it an int8 file could be if every
    matrix product ran `peak` times faster and everything else as in fp32."""
    total = sum(fp32_profile.values())
    products = sum(us for op, us in fp32_profile.items() if op in MATRIX_PRODUCTS) / total if total else 0.0
    return 1.0 / ((1.0 - products) + products / peak)


def share(profile: dict[str, float], ops: set[str]) -> float:
    """The share of a per-operator profile's time spent in `ops`."""
    total = sum(profile.values())
    return sum(us for op, us in profile.items() if op in ops) / total if total else 0.0


def why(profile: dict[str, float], graph: Counter) -> str:
    """Where an int8 file's time goes, in one sentence (its profile, and the operator counts of its optimized graph)."""
    total = sum(profile.values())
    floats = {op: us for op, us in profile.items() if op not in INT8_KERNELS | QUANTIZERS}
    top = ", ".join(f"{op} {us / total:.0%}" for op, us in sorted(floats.items(), key=lambda kv: -kv[1])[:4])
    unfused = sum(graph[op] for op in ("QuantizeLinear", "DequantizeLinear"))
    return (f"integer kernels {share(profile, INT8_KERNELS):.0%} of its time, (de)quantization "
            f"{share(profile, QUANTIZERS):.0%}, float operators {sum(floats.values()) / total:.0%} ({top}); "
            f"{unfused} QuantizeLinear/DequantizeLinear nodes left unfused")
