"""A training run's plan, the same on every rank and in every layout: its phases (fp32, then QAT), how many
optimizer steps, the learning rate at each step, and which examples each data-parallel replica reads in each step
(a seeded global batch cut into per-replica slices and micro-batches)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from zoo.errors import ZooError
from zoo.recipes import Recipe


@dataclass
class Phase:
    name: str  # "fp32" or "qat"
    steps: int
    lr: float
    warmup_steps: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    peak_rss_mib: list[float] = field(default_factory=list)  # per rank, at the end of training (before export)
    memory: dict[str, list[float]] | None = None  # MiB by category in the last two steps, per rank (zoo.train.memory)
    # CPU seconds each step used on this rank: all threads, and the training (main) thread alone
    step_cpu: list[tuple[float, float]] = field(default_factory=list)
    cpu_seconds: dict[str, list[float]] | None = None  # per rank: median per step (`cpu_profile`)
    ranks_consistent: bool | None = None
    # Token sequences padded at the end with this id (the recipe's group_by_length on a text dataset): batches are
    # drawn of similar lengths and cut to their longest sequence. None: whole rows (the QAT phase's exported graph has
    # a fixed sequence length).
    padding_id: int | None = None


def lr_at(step: int, phase: Phase, schedule: str) -> float:
    if step < phase.warmup_steps:
        return phase.lr * (step + 1) / phase.warmup_steps
    if schedule == "constant":
        return phase.lr
    progress = (step - phase.warmup_steps) / max(1, phase.steps - phase.warmup_steps)
    return phase.lr * 0.5 * (1 + math.cos(math.pi * progress))


# group_by_length sorts runs of this many global batches by length: batches of similar texts, while which texts meet in
# a run, and the order of the batches, stay random (Hugging Face's group_by_length sorts 50).
LENGTH_GROUP_BATCHES = 64


class BatchPlan:
    """Which examples each data-parallel replica sees at each step: seeded, identical on every rank. With `lengths`
    (one per example), each epoch's global batches hold examples of similar length (`group_by_length`)."""

    def __init__(self, n: int, global_batch: int, dp_rank: int, dp_size: int, seed: int, micro_batch: int | None,
                 lengths: torch.Tensor | None = None):
        if global_batch % dp_size:
            raise ZooError(f"global_batch_size {global_batch} is not divisible by the {dp_size} data-parallel "
                           "replicas; pick a multiple so every replica gets the same share")
        if global_batch > n:
            raise ZooError(f"global_batch_size {global_batch} exceeds the {n} training examples")
        self.n, self.global_batch, self.dp_rank, self.seed = n, global_batch, dp_rank, seed
        self.per_rank = global_batch // dp_size
        self.micro = min(micro_batch or self.per_rank, self.per_rank)
        if self.per_rank % self.micro:
            raise ZooError(f"micro_batch_size {self.micro} does not divide the per-replica batch {self.per_rank}")
        self.steps_per_epoch = n // global_batch  # the last partial batch is dropped
        self.lengths = lengths
        self._order: tuple[tuple[int, int], torch.Tensor] | None = None  # one epoch's order, drawn once

    def epoch_order(self, epoch: int, salt: int) -> torch.Tensor:
        """The examples of one epoch in the order its global batches take them."""
        if self._order is None or self._order[0] != (epoch, salt):
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + salt * 10_007 + epoch)
            order = torch.randperm(self.n, generator=generator)
            if self.lengths is not None:
                order = group_by_length(order, self.lengths, self.global_batch, generator)
            self._order = ((epoch, salt), order)
        return self._order[1]

    @property
    def accumulation(self) -> int:
        return self.per_rank // self.micro

    def rank_indices(self, step: int, salt: int) -> torch.Tensor:
        epoch, position = divmod(step, self.steps_per_epoch)
        batch = self.epoch_order(epoch, salt)[position * self.global_batch:(position + 1) * self.global_batch]
        return batch[self.dp_rank * self.per_rank:(self.dp_rank + 1) * self.per_rank]

    def micro_batches(self, step: int, salt: int) -> list[torch.Tensor]:
        return list(self.rank_indices(step, salt).split(self.micro))


def group_by_length(order: torch.Tensor, lengths: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor:
    """`order` (a shuffled epoch) regrouped so each run of batches' examples, sorted longest first, make batches of
    similar length, whose order is then shuffled: the same examples once each, and less padding per batch."""
    used = len(order) // batch * batch  # the last partial batch is dropped as before
    run = batch * LENGTH_GROUP_BATCHES
    runs = [order[start:min(start + run, used)] for start in range(0, used, run)]
    grouped = torch.cat([part[torch.sort(lengths[part], descending=True, stable=True).indices] for part in runs])
    batches = grouped.view(-1, batch)[torch.randperm(used // batch, generator=generator)]
    return torch.cat([batches.reshape(-1), order[used:]])


def steps_for(recipe: Recipe, n_train: int) -> int:
    if recipe.steps is not None:
        return recipe.steps
    return max(1, round(recipe.epochs * (n_train // recipe.global_batch_size)))
