"""FSDP2: `fully_shard` per block, then the root; parameters, gradients and optimizer state are sharded."""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from zoo.models import parallel_units
from zoo.train.parallel.base import Strategy
from zoo.train.parallel.scaler import AgreeingGradScaler

LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    # Compute in the recipe's precision, reduce gradients in fp32 (the sharded master weights stay fp32).
    return MixedPrecisionPolicy(param_dtype=LOW_PRECISION.get(precision), reduce_dtype=torch.float32)


def shard_blocks(model: torch.nn.Module, mesh, precision: str, reshard: str = "all-but-last") -> torch.nn.Module:
    """`fully_shard` each block, then the root (which FSDP2 never reshards after forward: backward needs it first).
    `reshard` is the recipe's `parallelism.fsdp_reshard_after_forward`."""
    policy = mixed_precision(precision)
    blocks = parallel_units(model)
    for i, block in enumerate(blocks):
        keep = reshard == "none" or (reshard == "all-but-last" and i == len(blocks) - 1)
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=not keep)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def gather_full_model(module: torch.nn.Module, build_model) -> torch.nn.Module:
    """All-gather DTensor shards into a fresh plain module on every rank (a collective)."""
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    plain = build_model()
    plain.load_state_dict(state)
    return plain


class FSDPStrategy(Strategy):
    name = "fsdp"

    def __init__(self, ctx, recipe, build_model):
        super().__init__(ctx, recipe, build_model)
        if recipe.precision == "fp16" and ctx.distributed:
            self.scaler = AgreeingGradScaler(ctx.device)  # sharded gradients: every rank agrees on inf/nan

    def wrap(self, model):
        if not self.ctx.distributed:
            return model
        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,), mesh_dim_names=("dp",))
        return shard_blocks(model, mesh, self.recipe.precision, self.recipe.parallelism.fsdp_reshard_after_forward)

    def accumulating(self, skip_sync: bool):
        if self.ctx.distributed:
            # Reduce-scatter once per step, after the last micro-batch.
            self.module.set_requires_gradient_sync(not skip_sync)
        return contextlib.nullcontext()

    def full_model(self, model):
        if not self.ctx.distributed:
            return model
        return gather_full_model(self.module, self.build_model)
