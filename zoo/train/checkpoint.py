"""Checkpoints with torch.distributed.checkpoint (DCP): sharding-aware, resumable, never half-written.

Layout: <dir>/<phase>/step_<N>/ holds the DCP files, each rank's RNG state, and a COMPLETE marker
written by rank 0 after every rank finished. Only complete checkpoints are ever loaded.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import warnings
from pathlib import Path

import torch

from zoo.fsutil import atomic_write_bytes
from zoo.train.distributed import DistContext

COMPLETE = "COMPLETE"


@contextlib.contextmanager
def _one_process_notice_dropped():
    """DCP warns on every save and load of a one-process run that it assumes one process, which is the case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def complete_steps(root: Path, phase: str) -> list[tuple[int, Path]]:
    found = []
    for path in (root / phase).glob("step_*") if (root / phase).is_dir() else []:
        m = re.fullmatch(r"step_(\d+)", path.name)
        if m and (path / COMPLETE).exists():
            found.append((int(m[1]), path))
    return sorted(found)


def save(root: Path, phase: str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         ctx: DistContext, keep: int = 2) -> Path:
    import torch.distributed.checkpoint as dcp  # lazy: DCP (DTensor, sympy, FSDP: ~0.8 s a rank) only to checkpoint
    from torch.distributed.checkpoint.state_dict import get_state_dict  # lazy: as above

    target = root / phase / f"step_{step}"
    model_state, optim_state = get_state_dict(model, optimizer)
    with _one_process_notice_dropped():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(target))
    torch.save(torch.get_rng_state(), target / f"rng_rank{ctx.rank}.pt")
    mark_complete(root, phase, step, ctx, keep)
    return target


def mark_complete(root: Path, phase: str, step: int, ctx: DistContext, keep: int = 2) -> None:
    """After every rank wrote its part: mark the checkpoint loadable, drop old ones (rank 0), then release all."""
    ctx.barrier()
    if ctx.is_main:
        (root / phase / f"step_{step}" / COMPLETE).write_text(f"{step}\n")
        prune(root, phase, keep)
    ctx.barrier()


def save_whole(root: Path, phase: str, step: int, filename: str, module: torch.nn.Module,
               optimizer: torch.optim.Optimizer, ctx: DistContext, write: bool) -> None:
    """A checkpoint written as plain files, one per writer (Horovod's rank 0; each pipeline stage's first
    replica): for layouts whose ranks hold disjoint or identical parts, with no DCP resharding needed."""
    if write:
        buffer = io.BytesIO()
        torch.save({"model": module.state_dict(), "optim": optimizer.state_dict(), "rng": torch.get_rng_state()},
                   buffer)
        atomic_write_bytes(root / phase / f"step_{step}" / filename, buffer.getvalue())
    mark_complete(root, phase, step, ctx)


def load_whole(root: Path, phase: str, filename: str, module: torch.nn.Module,
               optimizer: torch.optim.Optimizer) -> int:
    latest = latest_complete(root, phase)
    if latest is None:
        return 0
    step, path = latest
    state = torch.load(path / filename, map_location="cpu", weights_only=False)
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    return step


def latest_complete(root: Path, phase: str) -> tuple[int, Path] | None:
    found = complete_steps(root, phase)
    return found[-1] if found else None


def prune(root: Path, phase: str, keep: int = 2) -> None:
    """Delete all but the newest `keep` complete checkpoints of a phase."""
    for _, old in complete_steps(root, phase)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_latest(root: Path, phase: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                ctx: DistContext) -> int:
    """Restore the newest complete checkpoint of `phase`; returns its step (0 when there is none)."""
    found = complete_steps(root, phase)
    if not found:
        return 0
    import torch.distributed.checkpoint as dcp  # lazy: DCP only to resume (see save)
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # lazy: as above

    step, path = found[-1]
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    with _one_process_notice_dropped():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng = path / f"rng_rank{ctx.rank}.pt"
    if rng.exists():
        torch.set_rng_state(torch.load(rng))
    return step
