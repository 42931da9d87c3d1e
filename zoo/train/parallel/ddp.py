"""DistributedDataParallel: every rank holds the whole model; gradients are all-reduced (mean)."""

from __future__ import annotations

import contextlib

from torch.nn.parallel import DistributedDataParallel

from zoo.train.parallel.base import Strategy


class DDPStrategy(Strategy):
    name = "ddp"

    def wrap(self, model):
        if not self.ctx.distributed:
            return model
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def accumulating(self, skip_sync: bool):
        # Accumulate micro-batches locally; only the last one's backward all-reduces.
        if skip_sync and isinstance(self.module, DistributedDataParallel):
            return self.module.no_sync()
        return contextlib.nullcontext()

