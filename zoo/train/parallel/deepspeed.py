"""DeepSpeed: ZeRO stage 1/2/3 engines and DeepSpeed's PipelineModule, configured from the recipe.

The DeepSpeed config is generated from the recipe (`deepspeed_config`) and written next to the run's
outputs for reference; there is no hand-kept JSON. The optimizer is the trainer's own torch AdamW/SGD
(a client optimizer), so no FusedAdam JIT build runs. DeepSpeed's CPU communication op is built once
by `make setup` into `$TORCH_EXTENSIONS_DIR` (default: the virtualenv's torch-extensions folder).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch

from zoo.imports import unavailable
from zoo.models import pipeline_blocks
from zoo.train.checkpoint import latest_complete, mark_complete
from zoo.train.parallel.base import Strategy, make_optimizer, require_world, summed_loss
from zoo.train.parallel.pipeline import balanced_split, merge_stages


def import_deepspeed() -> None:
    """Import DeepSpeed, once per process, before a DeepSpeed strategy uses it. What it reads from the environment
    when imported is set first (unless the user set it): its CPU communication op is built once by `make setup` into
    the virtualenv's torch-extensions folder (a JIT build in every job's first step would cost minutes), and without
    NVIDIA devices its accelerator is the CPU (its probe would otherwise print a warning to stdout, into `--json`
    output). DeepSpeed's package imports its autotuner, which imports MLflow if it can (to log autotuning trials; the
    zoo never autotunes): most of `import deepspeed` (1.1-1.9 s a rank). It is imported with MLflow hidden, so the
    autotuner notes MLflow as missing; `import mlflow` afterwards (rank 0's tracking) works as before."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
    if "DS_ACCELERATOR" not in os.environ and not os.path.exists("/dev/nvidiactl"):
        os.environ["DS_ACCELERATOR"] = "cpu"
    with unavailable("mlflow"):
        import deepspeed  # noqa: F401  # lazy: optional and heavy (DeepSpeed); only its strategies need it


def buffer_sizes(num_params: int, stage: int) -> dict:
    """Communication buffers sized from the model (in elements), not DeepSpeed's billion-parameter defaults.

    DeepSpeed's defaults (5e8-element reduce and all-gather buckets, 2 GB each in fp32; ZeRO-3 prefetch 5e7 and up to
    1e9 live gathered parameters) exceed the whole model states of anything below a few billion parameters: on a 54M
    BERT the 5e8-element gradient bucket alone was 1908 MiB per rank (torch's memory profiler), more than DDP's whole
    model states. Here one unit is about one transformer layer's parameters (1/16 of the model, at least 65536
    elements, at most DeepSpeed's default): buckets and prefetch hold one unit, at most two units of gathered
    parameters stay live, and tensors under 1% of a unit (biases, norms) are kept whole rather than partitioned.
    The recipe's `parallelism.deepspeed` keys override these."""
    unit = int(min(5e8, max(2**16, num_params // 16)))
    sizes = {"reduce_bucket_size": unit, "allgather_bucket_size": unit}
    if stage == 3:
        sizes |= {"stage3_prefetch_bucket_size": unit, "stage3_max_live_parameters": 2 * unit,
                  "stage3_max_reuse_distance": 2 * unit, "stage3_param_persistence_threshold": max(1, unit // 100)}
    return sizes


def share_fp32_master(zero_optimizer) -> int:
    """Let DeepSpeed's ZeRO optimizer step the model's own fp32 partition instead of a private copy of it.

    DeepSpeed's ZeRO optimizers are written for mixed precision: each rank steps an fp32 "master" copy of its
    partition and copies the result back into the model's (bf16/fp16) partition. With fp32 weights that copy holds
    the same numbers as the partition it was cloned from: 4/N bytes per parameter above the ZeRO accounting (measured
    in benchmarks/results/parallel.md). DeepSpeed 0.19 means to reuse the partition when dtypes and devices match
    (ZeRO-3), but compares a torch.device with a device string, which never holds, so it always clones.
    Here the master tensors (same objects, so optimizer groups and state keys stay valid) are pointed at the model's
    partition storage; the copy back after each step becomes a copy onto itself. ZeRO-1/2's per-parameter links into
    the master (used by `safe_get_full_fp32_param` and checkpoints) are rebuilt. Offloaded, NVMe-swapped and
    mixed-precision partitions are left alone. Returns the bytes freed on this rank."""
    import deepspeed.comm as ds_dist  # lazy: optional and heavy (DeepSpeed); only its strategies need it

    if getattr(zero_optimizer, "offload_optimizer", False) or getattr(zero_optimizer, "cpu_offload", False):
        return 0
    if hasattr(zero_optimizer, "fp32_partitioned_groups_flat"):  # ZeRO-3
        pairs = list(zip(zero_optimizer.fp32_partitioned_groups_flat, zero_optimizer.fp16_partitioned_groups_flat))
    elif hasattr(zero_optimizer, "single_partition_of_fp32_groups"):  # ZeRO-1/2 (and DeepSpeed's pipeline)
        pairs = [(master, zero_optimizer.parallel_partitioned_bit16_groups[i][
                     ds_dist.get_rank(group=zero_optimizer.real_dp_process_group[i])])
                 for i, master in enumerate(zero_optimizer.single_partition_of_fp32_groups)]
    else:
        return 0
    freed = 0
    for master, own in pairs:
        if (master is own or master.numel() == 0 or master.dtype != own.dtype or master.device != own.device
                or master.shape != own.shape or master.untyped_storage().data_ptr() == own.untyped_storage().data_ptr()
                or not torch.equal(master, own)):
            continue
        freed += master.untyped_storage().nbytes()
        master.data = own.data
    if freed and hasattr(zero_optimizer, "_link_all_hp_params"):
        zero_optimizer._link_all_hp_params()
    return freed


def deepspeed_config(recipe, stage: int, dp_size: int, micro: int, accumulation: int,
                     num_params: int | None = None) -> dict:
    config = {
        "train_batch_size": recipe.global_batch_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": {"stage": stage, **(buffer_sizes(num_params, stage) if num_params else {})},
        "zero_allow_untested_optimizer": True,  # plain torch SGD is fine; DeepSpeed only vouches for Adam(W)
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,  # the trainer shows progress (rank 0)
        "wall_clock_breakdown": False,
    }
    if recipe.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif recipe.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return _merge(config, recipe.parallelism.deepspeed)


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def _low_precision(recipe, x: torch.Tensor) -> torch.Tensor:
    # DeepSpeed casts the module itself to bf16/fp16 (no autocast): float inputs must follow.
    if x.is_floating_point() and recipe.precision != "fp32":
        return x.to(torch.bfloat16 if recipe.precision == "bf16" else torch.float16)
    return x


def full_fp32_state(module: torch.nn.Module, names: dict[int, str] | None = None) -> dict[str, torch.Tensor]:
    """Full fp32 weights from a DeepSpeed engine's module (ZeRO-3 shards gathered; a collective)."""
    import deepspeed  # lazy: optional and heavy (DeepSpeed); only its strategies need it
    from deepspeed.utils import safe_get_full_fp32_param  # lazy: optional and heavy (DeepSpeed); only its strategies need it

    state = {}
    for name, param in module.named_parameters():
        full = safe_get_full_fp32_param(param)  # the optimizer's fp32 master copy when there is one
        if full is None:
            with deepspeed.zero.GatheredParameters([param]):
                full = param.detach().clone()
        state[names[id(param)] if names else name] = full.detach().float().cpu()
    return state


class _DeepSpeedBase(Strategy):
    stage = 0

    def __init__(self, ctx, recipe, build_model):
        import_deepspeed()  # before any other import of DeepSpeed in this process
        super().__init__(ctx, recipe, build_model)

    def _initialize(self, model: torch.nn.Module, lr: float, micro: int, accumulation: int) -> None:
        import deepspeed  # lazy: optional and heavy (DeepSpeed); only its strategies need it

        params = [p for p in model.parameters() if p.requires_grad]
        self.config = deepspeed_config(self.recipe, self.stage, self.dp_size, micro, accumulation,
                                       sum(p.numel() for p in params))
        optimizer = make_optimizer(self.recipe, params, lr)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                 model_parameters=params, config=self.config)
        share_fp32_master(self.optimizer)
        self.module = self.engine
        if self.ctx.is_main and getattr(self, "output_dir", None):
            (self.output_dir / "deepspeed_config.json").write_text(json.dumps(self.config, indent=2) + "\n")

    def save_checkpoint(self, root: Path, phase: str, step: int) -> None:
        self.engine.save_checkpoint(str(root / phase), tag=f"step_{step}", save_latest=False)
        mark_complete(root, phase, step, self.ctx)

    def load_checkpoint(self, root: Path, phase: str) -> int:
        latest = latest_complete(root, phase)
        if latest is None:
            return 0
        step, path = latest
        self.engine.load_checkpoint(str(root / phase), tag=path.name)
        return step

    def finish(self) -> None:
        self.engine.destroy()
        # DeepSpeed turns Python's cyclic GC off while an engine lives and back on in destroy(). Engines are reference
        # cycles: collected here, at a known point, their __del__ (destroy() again: optimizer hooks and buffers) cannot
        # run inside whatever allocates next, such as the torch.export trace of the QAT phase or an ONNX export.
        self.engine = self.optimizer = self.module = None
        gc.collect()


class ZeroStrategy(_DeepSpeedBase):
    def __init__(self, ctx, recipe, build_model, stage: int):
        super().__init__(ctx, recipe, build_model)
        self.stage, self.name = stage, f"zero{stage}"
        self.scaler = torch.amp.GradScaler(enabled=False)  # DeepSpeed scales fp16 losses itself

    def setup(self, model, lr, accumulation):
        self.accumulation = accumulation
        per_replica = self.recipe.global_batch_size // self.dp_size
        self._initialize(model, lr, per_replica // accumulation, accumulation)

    def step(self, batches, loss_scale):
        total = torch.zeros((), dtype=torch.float64)
        for x, y in batches:
            loss = summed_loss(self.engine(_low_precision(self.recipe, x)), y)
            # The trainer's scaling already makes the global-batch mean: no extra division by accumulation.
            self.engine.backward(loss * loss_scale, scale_wrt_gas=False)
            self.engine.step()  # steps the optimizer only at the accumulation boundary
            total += loss.detach().double().cpu()
        return total

    def full_model(self, model):
        plain = self.build_model()
        plain.load_state_dict(full_fp32_state(self.engine.module))
        return plain

    def finish(self) -> None:
        super().finish()
        if self.stage == 3:
            restore_linear()


def restore_linear() -> None:
    """Put back `torch.nn.functional.linear` after a ZeRO-3 engine.

    ZeRO-3 replaces it process-wide with its memory-efficient autograd Function (whose forward calls `addmm`), and
    DeepSpeed leaves it replaced "unless manually reset". Anything traced afterwards in the same process then sees
    `addmm` where the model has `linear`: torchao's QAT quantizer refused the graph ("addmm is not an aten linear
    operator"), so `zero3` with `qat-int8` crashed at the start of the QAT phase."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses  # lazy: DeepSpeed

    original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original


class DeepSpeedPipelineStrategy(_DeepSpeedBase):
    """DeepSpeed's PipelineModule over the family's split points; ZeRO-1 across pipeline replicas."""

    name = "ds-pp"
    stage = 1

    def __init__(self, ctx, recipe, build_model):
        super().__init__(ctx, recipe, build_model)
        self.stages = recipe.parallelism.pipeline_stages if ctx.distributed else 1

        require_world(ctx, self.stages, f"ds-pp with {self.stages} stages")
        self.scaler = torch.amp.GradScaler(enabled=False)

    @property
    def dp_rank(self) -> int:
        return self.ctx.rank % self.dp_size  # DeepSpeed's grid: rank = stage * dp_size + dp_rank

    @property
    def dp_size(self) -> int:
        return self.ctx.world_size // self.stages

    @property
    def reports_loss(self) -> bool:
        return self.ctx.is_main  # train_batch returns the global mean loss on every rank

    def micro_batch_size(self, per_replica: int) -> int | None:
        return self.recipe.parallelism.micro_batch_size or max(1, per_replica // (2 * self.stages))

    def setup(self, model, lr, accumulation):
        import deepspeed  # lazy: optional and heavy (DeepSpeed); only its strategies need it
        from deepspeed.pipe import PipelineModule  # lazy: optional and heavy (DeepSpeed); only its strategies need it


        self.accumulation = accumulation
        deepspeed.init_distributed(dist_backend=self.ctx.backend)  # reuses the trainer's process group
        # DeepSpeed hands each layer the previous one's output as one argument (a tuple stays a tuple).
        blocks = [_SplatTuple(block) for block in pipeline_blocks(model)]
        sizes = [sum(p.numel() for p in b.parameters()) for b in blocks]
        balanced_split(sizes, self.stages)  # a clear error when there are fewer blocks than stages
        pipe = PipelineModule(layers=blocks, num_stages=self.stages, partition_method="parameters",
                              loss_fn=lambda logits, y: torch.nn.functional.cross_entropy(logits.float(), y))
        self.names = {id(t): n for n, t in model.named_parameters()}
        per_replica = self.recipe.global_batch_size // self.dp_size
        self._initialize(pipe, lr, per_replica // accumulation, accumulation)

    def step(self, batches, loss_scale):
        data = iter([(_low_precision(self.recipe, x), y) for x, y in batches])
        # DeepSpeed averages the per-micro-batch mean losses over accumulation steps and replicas.
        mean = self.engine.train_batch(data_iter=data)
        return torch.tensor(float(mean) * self.recipe.global_batch_size, dtype=torch.float64)

    def train(self, mode: bool = True) -> None:
        self.engine.module.train(mode)

    def full_model(self, model):
        return merge_stages(full_fp32_state(self.engine.module, self.names), self.build_model)


class _SplatTuple(torch.nn.Module):
    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, inputs):
        return self.block(*inputs) if isinstance(inputs, tuple) else self.block(inputs)
