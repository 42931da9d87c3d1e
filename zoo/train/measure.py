"""What a run measures about itself, on every rank: peak memory, CPU seconds per step by thread, whether the ranks
ended with the same weights, and the torch model's accuracy."""

from __future__ import annotations

import resource
import statistics

import torch

from zoo.metrics import label_accuracy
from zoo.train.distributed import DistContext


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def per_rank(value: float, ctx: DistContext, digits: int = 1) -> list[float]:
    """`value` from every rank, in rank order (on every rank)."""
    slots = torch.zeros(ctx.world_size, dtype=torch.float64)
    slots[ctx.rank] = value
    return [round(v, digits) for v in ctx.all_reduce_sum(slots).tolist()]


def cpu_profile(step_cpu: list[tuple[float, float]]) -> dict[str, float]:
    """Where one rank's step time went, from the CPU clocks (median step; the first two and last two steps left
    out when there are more than four: warm-up and memory counting). `main_thread`: CPU seconds of the thread that
    runs forward, backward and the optimizer (one intra-op thread per process: the compute, plus Python);
    `other_threads`: CPU seconds of every other thread — the communication libraries' workers (gloo, Horovod,
    DeepSpeed), which do the copies and reductions of collectives. Wall time minus `main_thread` is what the
    training thread spent waiting for them."""
    kept = step_cpu[2:-2] if len(step_cpu) > 4 else step_cpu
    if not kept:
        return {"main_thread": 0.0, "other_threads": 0.0}
    return {"main_thread": statistics.median(t for _, t in kept),
            "other_threads": statistics.median(max(0.0, p - t) for p, t in kept)}


def ranks_agree(model: torch.nn.Module, ctx: DistContext, tolerance: float = 1e-6) -> bool:
    """Whether every rank ended with the same full weights (per-tensor checksums against the rank mean)."""
    sums = torch.stack([t.detach().double().sum().cpu() for t in model.state_dict().values()])
    mean = ctx.all_reduce_sum(sums.clone()) / ctx.world_size
    mismatch = torch.tensor(float(((sums - mean).abs() > tolerance * (1 + mean.abs())).any()), dtype=torch.float64)
    return float(ctx.all_reduce_sum(mismatch)) == 0.0


@torch.no_grad()
def torch_accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    device = next(model.parameters()).device
    return label_accuracy(model(x.to(device)).float().cpu().numpy(), y.numpy())
