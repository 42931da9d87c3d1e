"""Process groups: backend choice, and a restart-safe rendezvous under torchrun.

Backend `auto` is NCCL with CUDA, else gloo. oneCCL (`ccl`) is used only when its PyTorch
binding imports and registers the backend; otherwise the run is refused with what to install.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from zoo.errors import ZooError


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # None: a single process without a process group; "horovod": Horovod's own
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def barrier(self) -> None:
        if self.backend == "horovod":
            import horovod.torch as hvd  # lazy: optional, built by make setup where it can be; only horovodrun jobs need it

            hvd.barrier()
        elif self.distributed:
            dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over all ranks (CPU float64 in, same out); Horovod jobs have no torch process group."""
        if self.backend == "horovod":
            import horovod.torch as hvd  # lazy: optional, built by make setup where it can be; only horovodrun jobs need it

            return hvd.allreduce(tensor, op=hvd.Sum)
        if self.distributed:
            device_tensor = tensor.to(self.device)
            dist.all_reduce(device_tensor)
            return device_tensor.cpu()
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum over all ranks (CPU tensor in, same out)."""
        if self.backend == "horovod":
            import horovod.torch as hvd  # lazy: optional, built by make setup where it can be; only horovodrun jobs need it

            return hvd.allreduce(tensor, op=hvd.Max)
        if self.distributed:
            device_tensor = tensor.to(self.device)
            dist.all_reduce(device_tensor, op=dist.ReduceOp.MAX)
            return device_tensor.cpu()
        return tensor


def resolve_backend(choice: str) -> str:
    if choice == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if choice == "nccl" and not torch.cuda.is_available():
        raise ZooError("backend nccl needs CUDA GPUs and none is visible; use --backend gloo (or auto) on CPUs")
    if choice == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401  # lazy: optional (oneCCL), only for backend ccl
        except ImportError:
            raise ZooError("backend ccl needs Intel's oneCCL binding: install oneccl_bindings_for_pytorch "
                           "(not on PyPI; see the README) or use --backend gloo") from None
        if not dist.is_backend_available("ccl"):
            raise ZooError("oneccl_bindings_for_pytorch imported but registered no 'ccl' backend; "
                           "check its version matches torch, or use --backend gloo")
    return choice


def init_distributed(backend_choice: str = "auto") -> DistContext:
    """Join the torchrun job described by the environment, or run as a single process."""
    backend = resolve_backend(backend_choice)  # refuse a bad choice even for one process
    if "WORLD_SIZE" not in os.environ or dist.is_initialized():
        if dist.is_initialized():
            return _context(backend)
        return DistContext(device=_device(backend, 0))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # After a torchrun restart, gloo would try to reach the dead attempt's peers through keys left in the
    # store: a per-attempt prefix gives every attempt a clean namespace.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # torchrun's agent already serves the store on MASTER_PORT; other launchers (deepspeed) leave it to rank 0.
    host_store = "TORCHELASTIC_RUN_ID" not in os.environ and rank == 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=None,
                          is_master=host_store, timeout=timedelta(seconds=300))
    store = dist.PrefixStore(f"zoo_attempt_{attempt}", store)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=600))
    return _context(backend)


def _device(backend: str, local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")


def _context(backend: str) -> DistContext:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, backend, _device(backend, local_rank))


def shutdown(ctx: DistContext) -> None:
    if ctx.backend == "horovod":
        import horovod.torch as hvd  # lazy: optional, built by make setup where it can be; only horovodrun jobs need it

        hvd.shutdown()
    elif ctx.distributed and dist.is_initialized():
        # Together: a rank tearing gloo down while a peer still holds the connection pairs can abort the process
        # ("terminate called without an active exception"), seen when rank 0 spent longer writing its summary.
        dist.barrier()
        dist.destroy_process_group()
