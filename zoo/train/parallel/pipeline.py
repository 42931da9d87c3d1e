"""Pipeline parallelism with `torch.distributed.pipelining` (GPipe or 1F1B), and PP x DP.

The model family's `pipeline_blocks()` are its split points; stages get contiguous blocks balanced
by parameter count. A replica's share of the global batch is cut into micro-batches that flow
through the stages; with PP x DP each stage is wrapped in DDP over its data-parallel peers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from zoo.errors import ZooError
from zoo.models import pipeline_blocks
from zoo.train.checkpoint import load_whole, save_whole
from zoo.train.parallel.base import MeshStrategy, autocast, require_world, summed_loss
from zoo.train.parallel.scaler import AgreeingGradScaler

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class Chain(nn.Module):
    """Contiguous blocks of a model, registered under their global block index (distinct names per stage)."""

    def __init__(self, blocks: dict[int, nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): block for i, block in blocks.items()})

    def forward(self, *args):
        out = args
        for block in self.blocks.values():
            out = block(*out) if isinstance(out, tuple) else block(out)
        return out


def balanced_split(sizes: list[int], parts: int) -> list[range]:
    """Contiguous ranges of blocks, one per stage, with parameter counts as even as possible."""
    if len(sizes) < parts:
        raise ZooError(f"the model has {len(sizes)} pipeline blocks, fewer than the {parts} stages asked for")
    total, bounds, start = sum(sizes), [], 0
    for part in range(parts - 1):
        target = total * (part + 1) / parts
        end, running = start + 1, sum(sizes[:start + 1])
        # Leave at least one block for every later stage.
        while end < len(sizes) - (parts - part - 1) and running + sizes[end] / 2 <= target:
            running += sizes[end]
            end += 1
        bounds.append(range(start, end))
        start = end
    bounds.append(range(start, len(sizes)))
    return bounds


def stage_blocks(model: nn.Module, stage: int, stages: int) -> dict[int, nn.Module]:
    blocks = pipeline_blocks(model)
    sizes = [sum(p.numel() for p in b.parameters()) for b in blocks]
    return {i: blocks[i] for i in balanced_split(sizes, stages)[stage]}


def original_names(model: nn.Module, part: nn.Module) -> dict[str, torch.Tensor]:
    """`part`'s parameters and buffers under their names in the full model."""
    names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    return {names[id(t)]: t.detach() for t in [*part.parameters(), *part.buffers()]}


def merge_stages(local: dict[str, torch.Tensor], build_model) -> nn.Module:
    """Every rank's part (named as in the full model) merged into a fresh plain model on every rank."""
    pieces = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(pieces, {k: v.cpu() for k, v in local.items()})
    plain = build_model()
    plain.load_state_dict({k: v for piece in pieces for k, v in piece.items()})
    return plain


class PipelineStrategy(MeshStrategy):
    def __init__(self, ctx, recipe, build_model, two_d: bool):
        super().__init__(ctx, recipe, build_model)
        self.name = "pp-dp" if two_d else "pp"
        self.mesh = None
        self.stages = 1
        if ctx.distributed:
            self.stages = recipe.parallelism.pipeline_stages if two_d else ctx.world_size
            require_world(ctx, self.stages * (2 if two_d else 1), f"{self.name} with {self.stages} stages")
            self.mesh = init_device_mesh(ctx.device.type, (self.stages, ctx.world_size // self.stages),
                                         mesh_dim_names=("pp", "dp"))
            if recipe.precision == "fp16":
                self.scaler = AgreeingGradScaler(ctx.device)  # every stage steps (or skips) together
        self.stage_index = self.mesh["pp"].get_local_rank() if self.mesh else 0

    @property
    def reports_loss(self) -> bool:
        return self.stage_index == self.stages - 1  # only the last stage computes the loss

    def micro_batch_size(self, per_replica: int) -> int | None:
        # Default: two micro-batches per stage keep every stage busy in 1F1B's steady state.
        return self.recipe.parallelism.micro_batch_size or max(1, per_replica // (2 * self.stages))

    def wrap(self, model):
        if self.mesh is None:
            return model
        self.full = model
        self.part = Chain(stage_blocks(model, self.stage_index, self.stages))
        module = self.part
        if self.dp_size > 1:
            module = nn.parallel.DistributedDataParallel(self.part, process_group=self.mesh["dp"].get_group())
        stage = PipelineStage(module, self.stage_index, self.stages, self.ctx.device, group=self.mesh["pp"].get_group())
        self.schedule = SCHEDULES[self.recipe.parallelism.pipeline_schedule](
            stage, self.accumulation, loss_fn=self._loss, scale_grads=False)
        return module

    def _loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(summed_loss(logits, y) * self.loss_scale)

    def step(self, batches, loss_scale):
        if self.mesh is None:
            return super().step(batches, loss_scale)
        self.loss_scale = loss_scale
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        losses: list[torch.Tensor] = []
        first, last = self.stage_index == 0, self.stage_index == self.stages - 1
        with autocast(self.recipe.precision, self.ctx.device):
            self.schedule.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.optimizer_step()
        if not last:
            return torch.zeros((), dtype=torch.float64)
        return sum(loss.detach().double().cpu() for loss in losses) / (loss_scale * scale)

    def full_model(self, model):
        if self.mesh is None:
            return model
        return merge_stages(original_names(self.full, self.part), self.build_model)

    def save_checkpoint(self, root, phase, step):
        if self.mesh is None:
            return super().save_checkpoint(root, phase, step)

        # Each stage's first replica writes that stage (stages hold disjoint parameters).
        save_whole(root, phase, step, f"stage_{self.stage_index}.pt", self.part, self.optimizer, self.ctx,
                   self.dp_rank == 0)

    def load_checkpoint(self, root, phase):
        if self.mesh is None:
            return super().load_checkpoint(root, phase)

        return load_whole(root, phase, f"stage_{self.stage_index}.pt", self.part, self.optimizer)
