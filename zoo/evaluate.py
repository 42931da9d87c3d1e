"""Measure ONNX files with real onnxruntime sessions: logits, accuracy, kernel types, latency.

The bottom of the measuring stack: it knows ONNX files and arrays, not cards, stores or kinds."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from zoo.catalog import require_content
from zoo.metrics import label_accuracy


def session(path: Path, threads: int = 1, optimized_to: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # keep ORT's optimizer chatter off the user's terminal
    if optimized_to is not None:
        options.optimized_model_filepath = str(optimized_to)
    return ort.InferenceSession(str(require_content(Path(path))), options, providers=["CPUExecutionProvider"])


def predict(path: Path, x: np.ndarray, batch_size: int = 256, threads: int = 1) -> np.ndarray:
    """Logits for `x`, run in batches."""
    sess = session(path, threads)
    name = sess.get_inputs()[0].name
    outputs = [sess.run(None, {name: x[i:i + batch_size]})[0] for i in range(0, len(x), batch_size)]
    return np.concatenate(outputs).astype(np.float32)


def accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    return label_accuracy(predict(path, x), y)


def kernel_types(path: Path) -> set[str]:
    """Node types of the graph ORT actually runs (after its QDQ fusions)."""
    with tempfile.TemporaryDirectory() as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        session(path, optimized_to=optimized)
        return {node.op_type for node in onnx.load(str(optimized)).graph.node}


INT8_KERNELS = {"QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
                "MatMulIntegerToFloat", "QAttention"}


def latency_ms(path: Path, x: np.ndarray, repeats: int = 20, threads: int = 1) -> float:
    """Median wall time of one run on `x` (a benchmark helper; never asserted in tests)."""
    sess = session(path, threads)
    name = sess.get_inputs()[0].name
    sess.run(None, {name: x})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run(None, {name: x})
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)
