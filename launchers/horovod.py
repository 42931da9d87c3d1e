"""Horovod launcher: `horovodrun -np 2 -H localhost:2 --gloo python launchers/horovod.py --recipe qat-int8`.

Multi-node: `horovodrun -np 8 -H node1:4,node2:4 --gloo python launchers/horovod.py --recipe R` (see
README). Horovod is built by `make setup` (PyTorch + gloo). See zoo/train/parallel/horovod.py.
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing, and keep
# launchers/deepspeed.py and horovod.py from shadowing the packages they are named after.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.train.entry import run_launcher  # noqa: E402

if __name__ == "__main__":
    run_launcher("horovod", init="zoo.train.parallel.horovod:init_horovod")  # outside horovodrun: a run says how to start one
