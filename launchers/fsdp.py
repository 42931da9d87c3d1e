"""FSDP2 launcher: `torchrun --nproc_per_node N launchers/fsdp.py --recipe qat-int8 [key=value ...]`.

`fully_shard` per block (BERT layers, CNN stages), then the root: parameters, gradients and optimizer
state sharded over ranks; the recipe's precision becomes the MixedPrecisionPolicy (bf16/fp16 compute,
fp32 gradient reduction). See zoo/train/parallel/fsdp.py.
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing, and keep
# launchers/deepspeed.py and horovod.py from shadowing the packages they are named after.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.train.entry import run_launcher  # noqa: E402

if __name__ == "__main__":
    run_launcher("fsdp")
