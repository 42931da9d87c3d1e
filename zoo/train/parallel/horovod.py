"""Horovod: `horovodrun -np N -H host:N --gloo python launchers/horovod.py --recipe R`.

Every rank holds the whole model; Horovod's DistributedOptimizer averages gradients (ring allreduce
over its gloo controller) once per step, after `backward_passes_per_step` micro-batches. Horovod brings
its own rendezvous, so there is no torch process group: the trainer's loss sums and barriers go
through Horovod too (DistContext backend "horovod"), and checkpoints are written by rank 0.
"""

from __future__ import annotations

from pathlib import Path

import torch

from zoo.train.distributed import DistContext
from zoo.train.parallel.base import Strategy, make_optimizer


def init_horovod(backend_choice: str = "auto") -> DistContext:
    import horovod.torch as hvd

    hvd.init()
    use_cuda = torch.cuda.is_available() and backend_choice in ("auto", "nccl")
    if use_cuda:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device("cuda", hvd.local_rank()) if use_cuda else torch.device("cpu")
    return DistContext(hvd.rank(), hvd.size(), hvd.local_rank(), "horovod", device)


class HorovodStrategy(Strategy):
    name = "horovod"

    def setup(self, model, lr, accumulation):
        import horovod.torch as hvd

        self.accumulation = accumulation
        self.module = model
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.base_optimizer = make_optimizer(self.recipe, [p for _, p in named], lr)
        self.optimizer = hvd.DistributedOptimizer(self.base_optimizer, named_parameters=named, op=hvd.Average,
                                                  backward_passes_per_step=accumulation)
        hvd.broadcast_optimizer_state(self.base_optimizer, root_rank=0)

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
        from zoo.store.cache import atomic_write_bytes
        from zoo.train.checkpoint import mark_complete

        target = root / phase / f"step_{step}"
        if self.ctx.is_main:  # replicas are identical: one copy
            import io

            target.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            torch.save({"model": self.module.state_dict(), "optim": self.base_optimizer.state_dict(),
                        "rng": torch.get_rng_state()}, buffer)
            atomic_write_bytes(target / "state.pt", buffer.getvalue())
        mark_complete(root, phase, step, self.ctx)

    def load_checkpoint(self, root: Path, phase: str) -> int:
        from zoo.train.checkpoint import latest_complete

        latest = latest_complete(root, phase)
        if latest is None:
            return 0
        step, path = latest
        state = torch.load(path / "state.pt", map_location=self.ctx.device, weights_only=False)
        self.module.load_state_dict(state["model"])
        self.base_optimizer.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        return step

    def for_qat(self):
        return HorovodStrategy(self.ctx, self.recipe, self.build_model)
