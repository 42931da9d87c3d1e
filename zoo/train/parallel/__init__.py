"""Parallel strategies: how the one trainer's step runs on this rank (torchtitan's `parallelize_*` idea).

A strategy owns the wrapping of the model (DDP, FSDP2, DTensor tensor parallel, pipeline stages,
a DeepSpeed engine, Horovod's optimizer), the optimizer step, which slice of the global batch
this rank reads (its data-parallel rank), and how to gather the trained weights back into a
plain module for export. The loop itself stays in `zoo.train.trainer`.

Every strategy keeps the recipe's global batch: a rank reads its data-parallel slice in
micro-batches, and losses are scaled so that mean-reduced gradients equal the 1-process gradient.
"""

from __future__ import annotations

from zoo.errors import ZooError
from zoo.train.parallel.base import Strategy
from zoo.train.parallel.ddp import DDPStrategy
from zoo.train.parallel.deepspeed import DeepSpeedPipelineStrategy, ZeroStrategy
from zoo.train.parallel.fsdp import FSDPStrategy
from zoo.train.parallel.horovod import HorovodStrategy
from zoo.train.parallel.pipeline import PipelineStrategy
from zoo.train.parallel.tensor import TensorParallelStrategy

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


def make_strategy(name: str, ctx, recipe, build_model) -> Strategy:
    """`build_model()` returns a fresh plain model (used to gather sharded weights for export)."""
    makers = {
        "ddp": lambda: DDPStrategy(ctx, recipe, build_model),
        "fsdp": lambda: FSDPStrategy(ctx, recipe, build_model),
        "tp": lambda: TensorParallelStrategy(ctx, recipe, build_model, two_d=False),
        "dp-tp": lambda: TensorParallelStrategy(ctx, recipe, build_model, two_d=True),
        "pp": lambda: PipelineStrategy(ctx, recipe, build_model, two_d=False),
        "pp-dp": lambda: PipelineStrategy(ctx, recipe, build_model, two_d=True),
        **{f"zero{stage}": (lambda stage=stage: ZeroStrategy(ctx, recipe, build_model, stage=stage)) for stage in (1, 2, 3)},
        "ds-pp": lambda: DeepSpeedPipelineStrategy(ctx, recipe, build_model),
        "horovod": lambda: HorovodStrategy(ctx, recipe, build_model),
    }
    if name not in makers:
        raise ZooError(f"unknown parallelism strategy '{name}'")
    return makers[name]()


__all__ = ["LAUNCHERS", "DEFAULTS", "Strategy", "make_strategy", "qat_strategy", "strategy_for", "launcher_of"]
