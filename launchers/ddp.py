"""DDP launcher: `torchrun [--nproc_per_node N] launchers/ddp.py --recipe qat-int8 [key=value ...]`.

Thin on purpose: every rank holds the whole model and DistributedDataParallel all-reduces gradients
(NCCL on GPUs, gloo on CPUs, oneCCL where installed). See zoo/train/parallel/ddp.py.
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing, and keep
# launchers/deepspeed.py and horovod.py from shadowing the packages they are named after.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.train.entry import run_launcher  # noqa: E402

if __name__ == "__main__":
    run_launcher("ddp")
