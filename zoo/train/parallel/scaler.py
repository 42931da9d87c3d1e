"""fp16 loss scaling for parameters split across ranks: FSDP2 shards, DTensor tensor-parallel weights, pipeline stages."""

from __future__ import annotations

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor


class AgreeingGradScaler(ShardedGradScaler):
    """Every rank of the job skips or takes the same steps and keeps the same scale.

    torch's ShardedGradScaler (found-inf all-reduced over the process group), with two differences. Gradients are
    unscaled through their local tensors: tensor parallelism leaves DTensor gradients beside plain ones, which one
    fused unscale call refuses ("got mixed torch.Tensor and DTensor"). And the scale exists from the start on every
    rank: a pipeline stage that never computes the loss never calls `scale()`, where torch creates it lazily, so its
    first step found none ("Attempted step but _scale is None")."""

    def __init__(self, device: torch.device, process_group=None):
        super().__init__(device.type, process_group=process_group or torch.distributed.group.WORLD)
        self._lazy_init_scale_growth_tracker(device)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16=True):
        by_device_and_dtype: dict[tuple, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                    by_device_and_dtype.setdefault((grad.device, grad.dtype), []).append(grad)
        found = {found_inf.device: found_inf}
        with torch.no_grad():
            for (device, _), grads in by_device_and_dtype.items():
                found.setdefault(device, found_inf.to(device))
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found[device], inv_scale.to(device))
        return found
