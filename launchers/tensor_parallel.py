"""Tensor-parallel launcher (DTensor): `torchrun --nproc_per_node N launchers/tensor_parallel.py --recipe R`.

Uses the model family's plan (BERT: attention q/k/v and FFN-in column-wise, projections row-wise).
`parallelism.strategy=dp-tp` (recipe dp-tp) adds FSDP2 over data-parallel replicas:
`torchrun --nproc_per_node 4 launchers/tensor_parallel.py --recipe dp-tp`. See zoo/train/parallel/tensor.py.
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing, and keep
# launchers/deepspeed.py and horovod.py from shadowing the packages they are named after.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.train.entry import run_launcher  # noqa: E402

if __name__ == "__main__":
    run_launcher("tensor_parallel")
