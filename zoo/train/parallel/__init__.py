"""Parallel strategies: how the one trainer's step runs on this rank (torchtitan's `parallelize_*` idea).

A strategy owns the wrapping of the model (DDP, FSDP2, DTensor tensor parallel, pipeline stages,
a DeepSpeed engine, Horovod's optimizer), the optimizer step, which slice of the global batch
this rank reads (its data-parallel rank), and how to gather the trained weights back into a
plain module for export. The loop itself stays in `zoo.train.trainer`.

Every strategy keeps the recipe's global batch: a rank reads its data-parallel slice in
micro-batches, and losses are scaled so that mean-reduced gradients equal the 1-process gradient.
"""

from __future__ import annotations

import importlib
from typing import get_args

import torch

from zoo.layouts import FP16_DEVICE, LAYOUTS, layout, requirement
from zoo.kinds import quantization_schemes
from zoo.recipes import Recipe
from zoo.train.parallel.base import Strategy
from zoo.train.parallel.ddp import DDPStrategy


def support_matrix() -> list[tuple[str, str, int, tuple[str, ...], tuple[str, ...]]]:
    """(launcher, strategy, processes, precisions, quantization schemes) for every layout of zoo.layouts: every
    combination is supported and tests/test_parallel.py runs each one (it trains, exports the recipe's variants, and
    in fp32 trains the same model as one process). The README's launcher matrix is rendered from it."""
    precisions = get_args(Recipe.model_fields["precision"].annotation)
    schemes = tuple(quantization_schemes())
    return [(lay.launcher, lay.name, lay.processes, precisions, schemes) for lay in LAYOUTS.values()]


def device_has_fp16() -> bool:
    """Whether this machine's training device computes in fp16 (DeepSpeed's own test: CUDA, or oneDNN fp16 on CPU)."""
    if torch.cuda.is_available():
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


def unsupported_here(strategy: str, precision: str) -> str | None:
    """Why `strategy` cannot train in `precision` on this machine, with what works instead (None: it can)."""
    if requirement(strategy, precision) == FP16_DEVICE and not device_has_fp16():
        working = [name for name in LAYOUTS if requirement(name, "fp16") is None]
        return (f"{strategy} ({layout(strategy).launcher}) trains fp16 only on a GPU or a CPU with AVX512-FP16, and "
                f"this machine has neither; use precision=bf16 with {strategy}, or fp16 with {', '.join(working)}")
    return None


def matrix_markdown() -> str:
    rows = support_matrix()
    cells = [(p, q) for p in rows[0][3] for q in rows[0][4]]
    head = " | ".join(p if q == "none" else f"{p} + {q}" for p, q in cells)
    lines = [f"| launcher | strategy | processes tested | {head} |", "| --- | --- | ---: |" + " :-: |" * len(cells)]
    notes: list[str] = []
    for launcher, strategy, processes, precisions, schemes in rows:
        marks = []
        for p, q in cells:
            needs = requirement(strategy, p)
            if needs and needs not in notes:
                notes.append(needs)
            marks.append("–" if p not in precisions or q not in schemes else
                         f"✓{'¹²³'[notes.index(needs)]}" if needs else "✓")
        lines.append(f"| `{launcher}.py` | `{strategy}` | {processes} | {' | '.join(marks)} |")
    lines += ["", *(f"{'¹²³'[i]} Needs {note}; elsewhere the recipe check refuses it in one line, naming what works "
                    "(the test checks whichever applies to the machine it runs on)." for i, note in enumerate(notes))]
    return "\n".join(lines)


def qat_strategy(strategy: Strategy) -> Strategy:
    """The strategy that fine-tunes the QAT graph: the strategy's own choice, else DDP on the same group."""
    return strategy.for_qat() or DDPStrategy(strategy.ctx, strategy.recipe, strategy.build_model)


def strategy_class(name: str) -> type[Strategy]:
    """The class the layout's `maker` names. A rank imports only its own strategy's module: DTensor, pipelining and
    DeepSpeed cost ~2 s of CPU to import, in every rank of every run that does not use them."""
    module, _, cls = layout(name).maker.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_strategy(name: str, ctx, recipe, build_model) -> Strategy:
    """`build_model()` returns a fresh plain model (used to gather sharded weights for export)."""
    strategy = strategy_class(name)(ctx, recipe, build_model, **layout(name).options)
    strategy.name = name
    return strategy


__all__ = ["support_matrix", "matrix_markdown", "unsupported_here", "Strategy", "make_strategy", "qat_strategy",
           "strategy_class"]
