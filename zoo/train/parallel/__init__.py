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


__all__ = ["LAUNCHERS", "DEFAULTS", "Strategy", "make_strategy", "qat_strategy", "strategy_for", "launcher_of"]
