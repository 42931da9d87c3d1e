"""`zoo bench`: an entry's variants timed side by side on this machine, each file named by its sha256.

The same measurement as the cards' speed figures and benchmarks/latency.py (zoo.evaluate.timings: sessions warmed
up, files interleaved round by round, median and p90), on the verified files a user fetches; for a transformer the
fp32 file after onnxruntime's transformer optimizer ("fp32-fused") is timed beside them, so int8 is compared with
fp32 at its best.
"""

from __future__ import annotations

import copy
import platform
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.ao.quantization import quantize_dynamic

from zoo import catalog
from zoo.data import load_dataset
from zoo.errors import ZooError
from zoo.evaluate import accuracy, timings
from zoo.ort_quantize import optimize_transformer
from zoo.metrics import label_accuracy
from zoo.models import model_spec
from zoo.provenance import cpu_info, current_versions, int8_peak
from zoo.store.fetch import fetch
from zoo.variants.opsets import Origin, torch_module

FUSED = "fp32-fused"
# What a user would run instead of the zoo's ONNX files, for a transformer: the fp32 file's weights in the family's
# PyTorch module, eager, and after torch.ao's dynamic int8 quantization of its Linear layers.
TORCH_EAGER, TORCH_AO_DYNAMIC = "torch-eager", "torch-ao-dynamic"
# Routes tried for a transformer's int8-qat file, timed beside it by benchmarks/latency.py: the file through
# onnxruntime's transformer optimizer (what makes fp32-fused faster than fp32), and, at 2 or more threads, onnxruntime's
# intra-op threads sleeping instead of spinning while they wait (session.intra_op.allow_spinning=0).
QAT_OPTIMIZED, QAT_NO_SPIN = "int8-qat-optimized", "int8-qat-no-spin"
TRIED = (QAT_OPTIMIZED, QAT_NO_SPIN)


@dataclass
class Timed:
    variant: str
    sha256: str  # of the file timed ("" for fp32-fused and the PyTorch rows: made here from fp32)
    accuracy: float | None  # the card's; for the PyTorch rows, measured here on the test split
    median_ms: dict[int, float] = field(default_factory=dict)  # batch -> median
    p90_ms: dict[int, float] = field(default_factory=dict)
    speed: dict[int, float] = field(default_factory=dict)  # batch -> the faster fp32's median over this one's


def files(name: str, scratch: Path, variants: list[str] | None = None) -> dict[str, tuple[Path, str]]:
    """variant -> (verified file, sha256) of the entry's ONNX inference variants (all built ones, or `variants`),
    with fp32 and, for a transformer, fp32-fused."""
    card = catalog.get_card(name)
    keys = ["fp32", *(k for k in card.inference_variants(variants) if k != "fp32")]
    paths = {k: (fetch(name, k, show_progress=False).path, card.variants[k].sha256) for k in keys}
    if model_spec(card.architecture).transformer:
        fused = scratch / f"{name}.fused.onnx"
        optimize_transformer(paths["fp32"][0], fused)
        paths = {"fp32": paths["fp32"], FUSED: (fused, ""), **paths}
    return paths


def tried_routes(name: str, paths: dict[str, Path], scratch: Path, x: np.ndarray,
                 y: np.ndarray) -> dict[str, tuple[Path, float]]:
    """For a transformer with an int8-qat file: {QAT_OPTIMIZED: (the int8-qat file after onnxruntime's transformer
    optimizer, its accuracy on the test split)}. (QAT_NO_SPIN is the int8-qat file itself in a session that does not
    spin: zoo.evaluate.session_runner(..., spinning=False).)"""
    if "int8-qat" not in paths or FUSED not in paths:  # files() adds fp32-fused for transformers only
        return {}
    optimized = scratch / f"{name}.int8-qat-optimized.onnx"
    optimize_transformer(paths["int8-qat"], optimized)
    return {QAT_OPTIMIZED: (optimized, accuracy(optimized, x, y))}


def torch_runners(name: str, fp32: Path, x: np.ndarray, y: np.ndarray) -> dict[str, tuple[Callable, float]]:
    """For a transformer: {row: (runner, accuracy on the test split)} of the fp32 file's weights in PyTorch, eager and
    after torch.ao's dynamic int8 of its Linear layers (quantize_dynamic, qint8 weights); the caller sets torch's
    threads. The weights map onto the module by name (zoo.variants.opsets.torch_module): eager's accuracy is fp32's."""
    card = catalog.get_card(name)
    eager = torch_module(fp32, Origin.of(card))
    with warnings.catch_warnings():  # torch.ao.quantization announces its deprecation on every call
        warnings.simplefilter("ignore")
        dynamic = quantize_dynamic(copy.deepcopy(eager), {torch.nn.Linear}, dtype=torch.qint8)
    out = {}
    for key, module in ((TORCH_EAGER, eager), (TORCH_AO_DYNAMIC, dynamic)):
        def run(data: np.ndarray, module=module) -> np.ndarray:
            with torch.inference_mode():
                return module(torch.from_numpy(data)).numpy()
        logits = np.concatenate([run(x[i:i + 256]) for i in range(0, len(x), 256)])
        out[key] = (run, label_accuracy(logits, y))
    return out


def bench(name: str, variants: list[str] | None = None, threads: int = 1, batches: tuple[int, ...] = (1, 32),
          runs: int = 30, scratch: Path | None = None) -> dict:
    """Time the entry's variants side by side here; returns the report (machine, libraries, date and each file)."""
    card = catalog.get_card(name)
    if threads < 1 or runs < 1 or not batches or min(batches) < 1:
        raise ZooError("--threads, --runs and --batch take positive numbers")
    test = load_dataset(card.dataset.name).test
    x, y = test.x.numpy(), test.y.numpy()
    if max(batches) > len(x):
        raise ZooError(f"--batch {max(batches)}: the test split of '{name}' has {len(x)} examples")
    with tempfile.TemporaryDirectory(prefix="zoo-bench-", dir=scratch) as tmp:
        paths = files(name, Path(tmp), variants)
        torch.set_num_threads(threads)
        alternatives = torch_runners(name, paths["fp32"][0], x, y) if FUSED in paths else {}
        measured = timings({**{k: p for k, (p, _) in paths.items()}, **{k: r for k, (r, _) in alternatives.items()}},
                           x, batches, threads, runs)
    accuracies = {k: card.metric("fp32" if k == FUSED else k) for k in paths} | {k: a for k, (_, a) in alternatives.items()}
    rows = []
    for key in [*paths, *alternatives]:
        row = Timed(key, paths[key][1] if key in paths else "", accuracies[key])
        for batch in batches:
            best = min(measured[k][batch][0] for k in ("fp32", FUSED) if k in measured)
            row.median_ms[batch], row.p90_ms[batch] = measured[key][batch]
            row.speed[batch] = best / measured[key][batch][0]
        rows.append(row)
    peak, instructions = int8_peak()
    return {"entry": name, "cpu": cpu_info(), "int8_peak": {"ratio": peak, "instructions": instructions},
            "threads": threads, "runs": runs, "batches": list(batches),
            "libraries": current_versions(), "python": platform.python_version(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "files": rows}
