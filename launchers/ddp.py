"""DDP launcher: `torchrun [--nproc_per_node N] launchers/ddp.py --recipe qat-int8 [key=value ...]`.

Thin on purpose: parse arguments, join the process group, wrap the model in DDP, call the trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from zoo.train.launch import launch  # noqa: E402


def wrap_ddp(model, ctx):
    if not ctx.distributed:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


if __name__ == "__main__":
    launch(wrap_ddp, launcher="ddp")
