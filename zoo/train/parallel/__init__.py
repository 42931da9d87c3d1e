"""Parallel strategies: how the one trainer's step runs on this rank (torchtitan's `parallelize_*` idea).

A strategy owns the wrapping of the model (DDP, FSDP2, DTensor tensor parallel, pipeline stages,
a DeepSpeed engine, Horovod's optimizer), the optimizer step, which slice of the global batch
this rank reads (its data-parallel rank), and how to gather the trained weights back into a
plain module for export. The loop itself stays in `zoo.train.trainer`.

Every strategy keeps the recipe's global batch: a rank reads its data-parallel slice in
micro-batches, and losses are scaled so that mean-reduced gradients equal the 1-process gradient.
"""

from __future__ import annotations

from typing import get_args

import torch

from zoo.errors import ZooError
from zoo.recipes import Quantization, Recipe
from zoo.train.parallel.base import Strategy
from zoo.train.parallel.ddp import DDPStrategy

# Which launcher implements which strategies, and its default when the recipe names another.
LAUNCHERS: dict[str, tuple[str, ...]] = {
    "ddp": ("ddp",),
    "fsdp": ("fsdp",),
    "deepspeed": ("zero1", "zero2", "zero3", "ds-pp"),
    "horovod": ("horovod",),
    "tensor_parallel": ("tp", "dp-tp"),
    "pipeline": ("pp", "pp-dp"),
}
DEFAULTS = {"ddp": "ddp", "fsdp": "fsdp", "deepspeed": "zero2", "horovod": "horovod", "tensor_parallel": "tp",
            "pipeline": "pp"}


# Processes a layout needs at least (two for every other): dp-tp and pp-dp split the ranks two ways.
MIN_PROCESSES = {"dp-tp": 4, "pp-dp": 4}


def support_matrix() -> list[tuple[str, str, int, tuple[str, ...], tuple[str, ...]]]:
    """(launcher, strategy, processes, precisions, quantization schemes): every combination is supported and
    tests/test_parallel.py runs each one (it trains, exports the recipe's variants, and in fp32 trains the same model
    as one process). The README's launcher matrix is rendered from it (`matrix_markdown`)."""
    precisions = get_args(Recipe.model_fields["precision"].annotation)
    schemes = get_args(Quantization.model_fields["scheme"].annotation)
    return [(launcher, strategy, MIN_PROCESSES.get(strategy, 2), precisions, schemes)
            for launcher, strategies in LAUNCHERS.items() for strategy in strategies]


# What a combination needs from the machine beyond the layout itself (README footnotes; `unsupported_here`).
FP16_DEVICE = "a device with fp16 arithmetic (a GPU, or a CPU with AVX512-FP16): DeepSpeed's own check"


def requirement(strategy: str, precision: str) -> str | None:
    """What training `strategy` in `precision` needs from the device, or None when any CPU or GPU will do."""
    if precision == "fp16" and strategy in LAUNCHERS["deepspeed"]:
        return FP16_DEVICE
    return None


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
        working = [s for names in LAUNCHERS.values() for s in names if requirement(s, "fp16") is None]
        return (f"{strategy} (DeepSpeed) trains fp16 only on a GPU or a CPU with AVX512-FP16, and this machine has "
                f"neither; use precision=bf16 with {strategy}, or fp16 with {', '.join(working)}")
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


def strategy_for(launcher: str, requested: str) -> str:
    """The recipe's strategy when this launcher implements it, else the launcher's own default."""
    return requested if requested in LAUNCHERS[launcher] else DEFAULTS[launcher]


def launcher_of(strategy: str) -> str:
    for launcher, names in LAUNCHERS.items():
        if strategy in names:
            return launcher
    raise ZooError(f"unknown parallelism strategy '{strategy}'")


def qat_strategy(strategy: Strategy) -> Strategy:
    """The strategy that fine-tunes the QAT graph: the strategy's own choice, else DDP on the same group."""
    return strategy.for_qat() or DDPStrategy(strategy.ctx, strategy.recipe, strategy.build_model)


def _strategy_class(name: str) -> type[Strategy]:
    """A rank imports only its own strategy's module: DTensor, pipelining and DeepSpeed cost ~2 s of CPU to import,
    in every rank of every run that does not use them."""
    if name == "ddp":
        return DDPStrategy
    if name == "fsdp":
        from zoo.train.parallel.fsdp import FSDPStrategy  # lazy: FSDP2 ranks only
        return FSDPStrategy
    if name in ("tp", "dp-tp"):
        from zoo.train.parallel.tensor import TensorParallelStrategy  # lazy: DTensor, tensor-parallel ranks only
        return TensorParallelStrategy
    if name in ("pp", "pp-dp"):
        from zoo.train.parallel.pipeline import PipelineStrategy  # lazy: torch.distributed.pipelining ranks only
        return PipelineStrategy
    if name in ("zero1", "zero2", "zero3"):
        from zoo.train.parallel.deepspeed import ZeroStrategy  # lazy: DeepSpeed ranks only
        return ZeroStrategy
    if name == "ds-pp":
        from zoo.train.parallel.deepspeed import DeepSpeedPipelineStrategy  # lazy: DeepSpeed ranks only
        return DeepSpeedPipelineStrategy
    if name == "horovod":
        from zoo.train.parallel.horovod import HorovodStrategy  # lazy: Horovod ranks only
        return HorovodStrategy
    raise ZooError(f"unknown parallelism strategy '{name}'")


def make_strategy(name: str, ctx, recipe, build_model) -> Strategy:
    """`build_model()` returns a fresh plain model (used to gather sharded weights for export)."""
    cls = _strategy_class(name)
    options = {"tp": {"two_d": False}, "dp-tp": {"two_d": True}, "pp": {"two_d": False}, "pp-dp": {"two_d": True},
               **{f"zero{stage}": {"stage": stage} for stage in (1, 2, 3)}}
    return cls(ctx, recipe, build_model, **options.get(name, {}))


__all__ = ["LAUNCHERS", "DEFAULTS", "MIN_PROCESSES", "support_matrix", "matrix_markdown", "requirement", "unsupported_here",
           "Strategy", "make_strategy", "qat_strategy", "strategy_for", "launcher_of"]
