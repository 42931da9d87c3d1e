"""The parallel layouts: one table says which launcher runs each layout, what makes it and what it needs.

A layout is a recipe's `parallelism.strategy`: how the ranks of one job split the work (DDP replicas, FSDP2 shards,
DeepSpeed ZeRO stages, tensor-parallel groups, pipeline stages, and their 2-D mixes). The recipe schema's allowed
values, each launcher's strategies and default, the strategy a rank builds (`zoo.train.parallel.make_strategy`), the
README's launcher matrix, the launchers guide's table and the launch commands on the model pages all read these two
tables: adding a layout is one row here plus the strategy class its `maker` names.

This module is the table only and imports nothing heavy (the recipe schema sits above it, the strategies in
zoo/train/parallel above that).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoo.errors import ZooError

# What a layout needs from the device for a precision, beyond the layout itself (README footnotes; the recipe check).
FP16_DEVICE = "a device with fp16 arithmetic (a GPU, or a CPU with AVX512-FP16): DeepSpeed's own check"


@dataclass(frozen=True)
class Launcher:
    name: str  # launchers/NAME.py
    command: str  # how a user starts {n} processes of it
    default: str  # the layout it runs when the recipe names another launcher's
    torchrun: bool = True  # torchrun (and `zoo train`) can start its processes


@dataclass(frozen=True)
class Layout:
    name: str  # the recipe's parallelism.strategy
    launcher: str  # the launcher that runs it (a key of LAUNCHERS)
    summary: str  # what it does, one line (the launchers guide)
    maker: str  # "module:Class" of the strategy a rank builds (imported by that rank only)
    options: dict = field(default_factory=dict)  # keyword arguments of the maker
    processes: int = 2  # processes it needs at least (the tests run it with this many)
    model_needs: str | None = None  # the model method it uses (e.g. tensor_parallel_plan); None: every model
    device_needs: dict[str, str] = field(default_factory=dict)  # precision -> what the device must have
    example: str = "fp32"  # the recipe its example command trains
    fixed_shapes: bool = False  # its stages exchange tensors of one shape: every batch as wide (no group_by_length)

    def command(self, processes: int | None = None) -> str:
        """The command that trains the example recipe with this layout on `processes` ranks (default: its minimum)."""
        launcher = LAUNCHERS[self.launcher]
        named = launcher.default == self.name or self.example == self.name  # the recipe named after a layout sets it
        strategy = "" if named else f" parallelism.strategy={self.name}"
        return f"{launcher.command.format(n=processes or self.processes)} --recipe {self.example}{strategy}"


_TORCHRUN = "torchrun --nproc_per_node {n} launchers/%s.py"
LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher for launcher in [
    Launcher("ddp", _TORCHRUN % "ddp", "ddp"),
    Launcher("fsdp", _TORCHRUN % "fsdp", "fsdp"),
    Launcher("deepspeed", "deepspeed --num_gpus {n} launchers/deepspeed.py", "zero2"),
    Launcher("horovod", "horovodrun -np {n} -H localhost:{n} --gloo python launchers/horovod.py", "horovod",
             torchrun=False),
    Launcher("tensor_parallel", _TORCHRUN % "tensor_parallel", "tp"),
    Launcher("pipeline", _TORCHRUN % "pipeline", "pp"),
]}

_DS = {"fp16": FP16_DEVICE}
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in [
    Layout("ddp", "ddp", "DistributedDataParallel; micro-batches accumulate under `no_sync`",
           "zoo.train.parallel.ddp:DDPStrategy", example="qat-int8"),
    Layout("fsdp", "fsdp", "FSDP2 `fully_shard` per block then the root; `precision` becomes the MixedPrecisionPolicy "
           "(fp32 gradient reduction)", "zoo.train.parallel.fsdp:FSDPStrategy", example="bf16"),
    *(Layout(f"zero{stage}", "deepspeed", f"ZeRO stage {stage}: {shards} sharded over the ranks (a DeepSpeed engine, "
             "its config generated from the recipe)", "zoo.train.parallel.deepspeed:ZeroStrategy", {"stage": stage},
             device_needs=_DS)
      for stage, shards in [(1, "optimizer states"), (2, "optimizer states and gradients"),
                            (3, "optimizer states, gradients and parameters")]),
    Layout("ds-pp", "deepspeed", "DeepSpeed's PipelineModule over the family's split points (ZeRO-1 across pipeline "
           "replicas)", "zoo.train.parallel.deepspeed:DeepSpeedPipelineStrategy", model_needs="pipeline_blocks",
           device_needs=_DS, fixed_shapes=True),
    Layout("horovod", "horovod", "Horovod's DistributedOptimizer (`backward_passes_per_step` = micro-batches)",
           "zoo.train.parallel.horovod:HorovodStrategy", example="qat-int8"),
    Layout("tp", "tensor_parallel", "DTensor `parallelize_module` with the family's plan over all ranks",
           "zoo.train.parallel.tensor:TensorParallelStrategy", {"two_d": False}, model_needs="tensor_parallel_plan",
           example="fp16"),
    Layout("dp-tp", "tensor_parallel", "tensor-parallel groups of `tensor_parallel_size` ranks, FSDP2 across them",
           "zoo.train.parallel.tensor:TensorParallelStrategy", {"two_d": True}, processes=4,
           model_needs="tensor_parallel_plan", example="dp-tp"),
    Layout("pp", "pipeline", "`torch.distributed.pipelining` stages, one per rank, 1F1B or GPipe",
           "zoo.train.parallel.pipeline:PipelineStrategy", {"two_d": False}, model_needs="pipeline_blocks",
           example="fp16", fixed_shapes=True),
    Layout("pp-dp", "pipeline", "pipelines of `pipeline_stages` stages, each stage in DDP over its replicas",
           "zoo.train.parallel.pipeline:PipelineStrategy", {"two_d": True}, processes=4, model_needs="pipeline_blocks",
           example="pp-dp", fixed_shapes=True),
]}


def layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise ZooError(f"unknown parallelism strategy '{name}'; choose one of: {', '.join(LAYOUTS)}")
    return LAYOUTS[name]


def layouts_of(launcher: str) -> list[Layout]:
    """The layouts a launcher runs, in the table's order."""
    if launcher not in LAUNCHERS:
        raise ZooError(f"unknown launcher '{launcher}'; choose one of: {', '.join(LAUNCHERS)}")
    return [lay for lay in LAYOUTS.values() if lay.launcher == launcher]


def strategy_for(launcher: str, requested: str) -> str:
    """The recipe's strategy when this launcher runs it, else the launcher's own default."""
    return requested if layout(requested).launcher == launcher else LAUNCHERS[launcher].default


def requirement(strategy: str, precision: str) -> str | None:
    """What training `strategy` in `precision` needs from the device, or None when any CPU or GPU will do."""
    return layout(strategy).device_needs.get(precision)


def launchers_table() -> str:
    """The launchers guide's table: one row per layout, grouped by launcher (its default marked), with a command."""
    lines = ["| launcher | `parallelism.strategy` | what it does | command |", "| --- | --- | --- | --- |"]
    for launcher in LAUNCHERS.values():
        mine = layouts_of(launcher.name)
        for lay in mine:
            first = f"`launchers/{launcher.name}.py`" if lay is mine[0] else ""
            default = " (default)" if lay.name == launcher.default and len(mine) > 1 else ""
            lines.append(f"| {first} | `{lay.name}`{default} | {lay.summary} | `{lay.command()}` |")
    return "\n".join(lines)
