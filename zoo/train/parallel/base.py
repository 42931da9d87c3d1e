"""The strategy interface and the plain data-parallel step every wrapper-style strategy shares."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from zoo.errors import ZooError
from zoo.train import checkpoint


def make_optimizer(recipe, params, lr: float, foreach: bool | None = None) -> torch.optim.Optimizer:
    opt = recipe.optimizer
    if opt.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=opt.weight_decay, foreach=foreach)
    return torch.optim.SGD(params, lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay, foreach=foreach)


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def summed_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), y, reduction="sum")


class Strategy:
    """One rank's view of a parallel layout. Subclasses override `wrap` and, where the step differs, `step`."""

    name = "none"
    foreach: bool | None = None  # multi-tensor optimizer kernels (torch's default: on for CUDA)

    def __init__(self, ctx, recipe, build_model: Callable[[], torch.nn.Module]):
        self.ctx, self.recipe, self.build_model = ctx, recipe, build_model
        self.module: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=recipe.precision == "fp16")

    # -- layout ---------------------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        """Which slice of the global batch this rank reads."""
        return self.ctx.rank

    @property
    def dp_size(self) -> int:
        return self.ctx.world_size

    @property
    def reports_loss(self) -> bool:
        """Whether this rank's loss counts in the global sum (one rank per data-parallel replica)."""
        return True

    # -- setup ----------------------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def micro_batch_size(self, per_replica: int) -> int | None:
        """Micro-batch size for a replica's share of the global batch (None: the whole share at once)."""
        return self.recipe.parallelism.micro_batch_size

    def setup(self, model: torch.nn.Module, lr: float, accumulation: int) -> None:
        """Wrap the model and build the optimizer; `accumulation` micro-batches make one step."""
        self.accumulation = accumulation
        self.module = self.wrap(model)
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.recipe, params, lr, self.foreach)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)

    # -- one optimizer step ---------------------------------------------------------------------------
    def step(self, batches: list[tuple[torch.Tensor, torch.Tensor]], loss_scale: float) -> torch.Tensor:
        """Forward/backward every micro-batch, then step; returns this rank's summed loss (float64)."""
        total = torch.zeros((), dtype=torch.float64)
        for i, (x, y) in enumerate(batches):
            last = i == len(batches) - 1
            with self.accumulating(not last):
                with autocast(self.recipe.precision, self.ctx.device):
                    logits = self.module(x)
                loss = summed_loss(logits, y)
                self.scaler.scale(loss * loss_scale).backward()
            total += loss.detach().double().cpu()
        self.optimizer_step()
        return total

    def accumulating(self, skip_sync: bool):
        """Context for a micro-batch whose gradients need no cross-rank reduction yet."""
        return contextlib.nullcontext()

    def optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    # -- results --------------------------------------------------------------------------------------
    def full_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """A plain module holding the full trained weights, on every rank (collective where sharded)."""
        return model

    def save_checkpoint(self, root: Path, phase: str, step: int) -> None:
        checkpoint.save(root, phase, step, self.module, self.optimizer, self.ctx)

    def load_checkpoint(self, root: Path, phase: str) -> int:
        return checkpoint.load_latest(root, phase, self.module, self.optimizer, self.ctx)

    def for_qat(self) -> "Strategy | None":
        """The strategy for the QAT phase, or None for DDP on the same group. Its model is an exported fake-quant
        graph with no module tree to shard or split, so module-structure strategies fine-tune it data-parallel
        (zoo.train.parallel.qat_strategy)."""
        return None

    def finish(self) -> None:
        """Release what the strategy holds (engines, groups) after a phase."""


class MeshStrategy(Strategy):
    """A strategy over a device mesh whose "dp" dimension holds the data-parallel replicas."""

    mesh = None

    @property
    def dp_rank(self) -> int:
        return self.mesh["dp"].get_local_rank() if self.mesh else 0

    @property
    def dp_size(self) -> int:
        return self.mesh["dp"].size() if self.mesh else 1


def require_world(ctx, multiple: int, what: str) -> None:
    if ctx.world_size % multiple:
        raise ZooError(f"{what} needs a world size divisible by {multiple}; got {ctx.world_size} processes "
                       f"(e.g. torchrun --nproc_per_node {multiple * max(1, ctx.world_size // multiple)})")
