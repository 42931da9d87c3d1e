"""DeepSpeed launcher: ZeRO stage 1/2/3 or DeepSpeed's PipelineModule, chosen by the recipe.

    deepspeed --num_gpus 2 launchers/deepspeed.py --recipe fp32 parallelism.strategy=zero3
    torchrun --nproc_per_node 2 launchers/deepspeed.py --recipe fp32 parallelism.strategy=ds-pp
    deepspeed --hostfile hosts launchers/deepspeed.py --recipe qat-int8       # multi-node (docs/guides/launchers.md)

The DeepSpeed config is generated from the recipe (zoo/train/parallel/deepspeed.py); the run writes
it to <output-dir>/deepspeed_config.json. Without a ZeRO/pipeline strategy in the recipe: ZeRO-2.
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing, and keep
# launchers/deepspeed.py and horovod.py from shadowing the packages they are named after.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.train.entry import run_launcher  # noqa: E402

if __name__ == "__main__":
    run_launcher("deepspeed")
