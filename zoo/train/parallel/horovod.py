"""Horovod: `horovodrun -np N -H host:N --gloo python launchers/horovod.py --recipe R`.

Every rank holds the whole model; Horovod's DistributedOptimizer averages gradients (ring allreduce
over its gloo controller) once per step, after `backward_passes_per_step` micro-batches. Horovod brings
its own rendezvous, so there is no torch process group: the trainer's loss sums and barriers go
through Horovod too (DistContext backend "horovod"), and checkpoints are written by rank 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from zoo.errors import ZooError
from zoo.train.distributed import DistContext
from zoo.train.checkpoint import load_whole, save_whole
from zoo.train.parallel.base import Strategy, make_optimizer


class NotUnderHorovodrun(ZooError):
    exit_code = 2  # a usage error, like argparse's


def init_horovod(backend_choice: str = "auto") -> DistContext:
    if "HOROVOD_RANK" not in os.environ:
        raise NotUnderHorovodrun("launchers/horovod.py runs under horovodrun, e.g. horovodrun -np 2 -H localhost:2 "
                                 "--gloo python launchers/horovod.py --recipe qat-int8")
    import horovod.torch as hvd  # lazy: optional, built by make setup where it can be; only horovodrun jobs need it

    hvd.init()
    use_cuda = torch.cuda.is_available() and backend_choice in ("auto", "nccl")
    if use_cuda:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device("cuda", hvd.local_rank()) if use_cuda else torch.device("cpu")
    return DistContext(hvd.rank(), hvd.size(), hvd.local_rank(), "horovod", device)


class HorovodStrategy(Strategy):
    name = "horovod"

    def setup(self, model, lr, accumulation):
        import horovod.torch as hvd  # lazy: optional, built by make setup where it can be; only horovodrun jobs need it

        self.accumulation = accumulation
        self.module = model
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # Horovod's wrapper is a new optimizer object with its own state: it is the one to step, save and load.
        # Its state starts empty on every rank (resumed ranks all read the same checkpoint), so there is nothing to
        # broadcast: hvd.broadcast_optimizer_state would take a zero-gradient step to create state, which changed
        # the trained weights (4e-5 relative after 16 SGD steps, measured).
        self.optimizer = hvd.DistributedOptimizer(make_optimizer(self.recipe, [p for _, p in named], lr),
                                                  named_parameters=named, op=hvd.Average,
                                                  backward_passes_per_step=accumulation)

    def optimizer_step(self) -> None:
        if self.scaler.is_enabled():
            # fp16: finish the allreduce before unscaling, then step without a second synchronize.
            self.optimizer.synchronize()
            self.scaler.unscale_(self.optimizer)
            with self.optimizer.skip_synchronize():
                self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad()  # Horovod's wrapper has no set_to_none

    def save_checkpoint(self, root: Path, phase: str, step: int) -> None:
        # Replicas are identical: rank 0 writes the one copy.
        save_whole(root, phase, step, "state.pt", self.module, self.optimizer, self.ctx, self.ctx.is_main)

    def load_checkpoint(self, root: Path, phase: str) -> int:
        return load_whole(root, phase, "state.pt", self.module, self.optimizer)

    def for_qat(self):
        return HorovodStrategy(self.ctx, self.recipe, self.build_model)
