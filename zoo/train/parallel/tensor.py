"""Tensor parallelism with DTensor (`parallelize_module`), and DP x TP with FSDP2 over the data dimension.

Each model family declares its plan (`tensor_parallel_plan()` on the model): for BERT, attention
q/k/v and the FFN's first linear are column-wise, the projections back to the hidden size row-wise,
so each block needs one all-reduce forward and one backward. Ranks of one tensor-parallel group
read the same data.
"""

from __future__ import annotations

import contextlib

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from zoo.errors import ZooError
from zoo.train.parallel.base import MeshStrategy, require_world
from zoo.train.parallel.fsdp import gather_full_model, shard_blocks
from zoo.train.parallel.scaler import AgreeingGradScaler


class TensorParallelStrategy(MeshStrategy):
    # Sharded (DTensor) and replicated (plain) parameters side by side: CUDA's default multi-tensor
    # optimizer kernels refuse the mix, so step tensor by tensor.
    foreach = False

    def __init__(self, ctx, recipe, build_model, two_d: bool):
        super().__init__(ctx, recipe, build_model)
        self.name = "dp-tp" if two_d else "tp"
        self.mesh = None
        if ctx.distributed:
            tp = recipe.parallelism.tensor_parallel_size if two_d else ctx.world_size
            require_world(ctx, tp * (2 if two_d else 1), f"{self.name} with tensor_parallel_size {tp}")
            self.mesh = init_device_mesh(ctx.device.type, (ctx.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
            if recipe.precision == "fp16":
                self.scaler = AgreeingGradScaler(ctx.device)  # DTensor and plain gradients, one decision

    @property
    def reports_loss(self) -> bool:
        return self.mesh is None or self.mesh["tp"].get_local_rank() == 0

    def wrap(self, model):
        if self.mesh is None:
            return model
        plan_of = getattr(model, "tensor_parallel_plan", None)
        if plan_of is None:
            raise ZooError(f"{type(model).__name__} has no tensor-parallel plan; tensor parallelism supports the "
                           "bert and cnn families (use launchers/ddp.py or fsdp.py for this model)")
        parallelize_module(model, self.mesh["tp"], plan_of())
        if self.dp_size > 1:
            shard_blocks(model, self.mesh["dp"], self.recipe.precision, self.recipe.parallelism.fsdp_reshard_after_forward)
        return model

    def accumulating(self, skip_sync: bool):
        if self.mesh is not None and self.dp_size > 1:
            self.module.set_requires_gradient_sync(not skip_sync)
        return contextlib.nullcontext()

    def full_model(self, model):
        if self.mesh is None:
            return model
        return gather_full_model(self.module, self.build_model)
