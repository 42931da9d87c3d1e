"""Pipeline launcher (torch.distributed.pipelining): `torchrun --nproc_per_node N launchers/pipeline.py --recipe R`.

One stage per rank, split at the family's points (BERT: between layers), schedule 1F1B or GPipe
(`parallelism.pipeline_schedule`). `parallelism.strategy=pp-dp` (recipe pp-dp) replicates each stage:
`torchrun --nproc_per_node 4 launchers/pipeline.py --recipe pp-dp`. See zoo/train/parallel/pipeline.py.
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing, and keep
# launchers/deepspeed.py and horovod.py from shadowing the packages they are named after.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.train.entry import run_launcher  # noqa: E402

if __name__ == "__main__":
    run_launcher("pipeline")
