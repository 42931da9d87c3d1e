"""The one training loop. Launchers choose a parallel wrapper and call `run`; nothing else trains.

Global batch size is fixed by the recipe whatever the world size: each step every rank takes its
contiguous slice of the same seeded global batch, in micro-batches (gradient accumulation), and the
loss is scaled so mean-reduced gradients equal the 1-process gradient of the global batch. So 1 and
N processes train the same model.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import zipfile
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from pkgutil import resolve_name

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from zoo import faults
from zoo.cards import PublishedFile
from zoo.data import Dataset, load_dataset
from zoo.data.base import cut_padding, sequence_lengths
from zoo.data.shifts import augmented
from zoo.errors import ZooError
from zoo.fsutil import atomic_write_text
from zoo.kinds import trained_kinds
from zoo.models import count_params, model_for, model_spec
from zoo.provenance import current_versions
from zoo.recipes import Recipe
from zoo.store.history import published_object
from zoo.train.distributed import DistContext
from zoo.train.memory import MemoryCount, allocator_in_use, live_storages
from zoo.train.parallel import Strategy, make_strategy
from zoo.train.measure import cpu_profile, peak_rss_mib, per_rank, ranks_agree, torch_accuracy
from zoo.train.schedule import BatchPlan, Phase, lr_at, steps_for
from zoo.run_summary import PhaseSummary, RunSummary, TrackedRun
from zoo.train.tracking import Tracker

def _progress(ctx: DistContext, label: str, total: int):
    if not ctx.is_main:
        return contextlib.nullcontext(None)

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}  {task.fields[rate]:.0f} samples/s"),
                    TimeRemainingColumn(), console=Console(stderr=True), transient=False)


def train_phase(phase: Phase, model: torch.nn.Module, strategy: Strategy, recipe: Recipe, data: Dataset,
                ctx: DistContext, tracker, ckpt_dir: Path | None, resume: bool,
                after_step: Callable[[], None] | None = None, before_model: set[int] | None = None) -> torch.nn.Module:
    """Train `model` for `phase.steps` optimizer steps under `strategy`; returns the trained plain module.
    `after_step` runs on every rank after each optimizer step (QAT: the observers' ranges of the global batch).
    `before_model` (the tensor storages alive before the model existed): count this rank's tensors by category
    during the last two steps (zoo.train.memory; benchmarks)."""
    if recipe.trainable is not None:
        freeze_except(model, recipe.trainable)
    x_all, y_all = data.train.x, data.train.y
    cut = phase.padding_id
    plan = BatchPlan(len(data.train), recipe.global_batch_size, strategy.dp_rank, strategy.dp_size, recipe.seed,
                     strategy.micro_batch_size(recipe.global_batch_size // strategy.dp_size),
                     lengths=sequence_lengths(x_all, cut) if cut is not None else None)
    strategy.setup(model, phase.lr, plan.accumulation)
    salt = 0 if phase.name == "fp32" else 1
    # Gradients are mean-reduced over data-parallel replicas: scale so the result is the global-batch mean.
    loss_scale = strategy.dp_size / recipe.global_batch_size

    start = strategy.load_checkpoint(ckpt_dir, phase.name) if (resume and ckpt_dir) else 0
    if start:
        phase.losses = _saved_losses(ckpt_dir, phase.name, start)
        if ctx.is_main:
            print(f"[{phase.name}] resumed from the checkpoint at step {start}", flush=True)
    interval = recipe.checkpoint.interval_steps
    fault = _fault_step(ctx)
    counter = MemoryCount(strategy, before_model) if before_model is not None else None
    strategy.train()
    begin = time.perf_counter()
    with _progress(ctx, f"{phase.name} training", phase.steps) as bar:
        task = bar.add_task(f"[{phase.name}] {recipe.model} ({strategy.name})", total=phase.steps, completed=start,
                            loss=float("nan"), rate=0.0) if bar else None
        for step in range(start, phase.steps):
            if fault is not None and step == fault:
                faults.die("train-step", f"rank {ctx.rank} dies before step {step}")
            if counter is not None and step == max(start, phase.steps - 2):
                counter.start()
            strategy.set_lr(lr_at(step, phase, recipe.schedule.name))
            batches = [((x_all[idx] if cut is None else cut_padding(x_all[idx], cut)).to(ctx.device),
                        y_all[idx].to(ctx.device)) for idx in plan.micro_batches(step, salt)]
            tick, cpu_tick, thread_tick = time.perf_counter(), time.process_time(), time.thread_time()
            step_loss = strategy.step(batches, loss_scale)
            if after_step is not None:
                after_step()
            if counter is not None:
                counter.step_done()
            phase.step_seconds.append(time.perf_counter() - tick)
            phase.step_cpu.append((time.process_time() - cpu_tick, time.thread_time() - thread_tick))
            if not strategy.reports_loss:
                step_loss = torch.zeros((), dtype=torch.float64)
            loss = float(ctx.all_reduce_sum(step_loss)) / recipe.global_batch_size
            phase.losses.append(loss)
            tracker.metric(f"{phase.name}/loss", loss, step)
            if bar is not None:
                elapsed = time.perf_counter() - begin
                bar.update(task, advance=1, loss=loss, rate=(step + 1 - start) * recipe.global_batch_size / max(elapsed, 1e-9))
            if ckpt_dir and interval and ((step + 1) % interval == 0 or step + 1 == phase.steps):
                if ctx.is_main:  # the loss curve so far, so a resumed run keeps the steps before the restart
                    atomic_write_text(ckpt_dir / phase.name / LOSSES_FILE, json.dumps(phase.losses))
                strategy.save_checkpoint(ckpt_dir, phase.name, step + 1)
    phase.seconds = time.perf_counter() - begin
    if counter is not None and counter.counts:
        phase.memory = {category: per_rank(mib, ctx) for category, mib in counter.stop().items()}
    phase.peak_rss_mib = per_rank(peak_rss_mib(), ctx)
    phase.cpu_seconds = {key: per_rank(value, ctx, digits=4) for key, value in cpu_profile(phase.step_cpu).items()}
    strategy.train(False)
    trained = strategy.full_model(model)
    strategy.finish()
    phase.ranks_consistent = ranks_agree(trained, ctx)
    return trained


LOSSES_FILE = "losses.json"


def _saved_losses(ckpt_dir: Path, phase: str, start: int) -> list[float]:
    """The losses of steps 0..start-1, written beside the checkpoints (at or after the one resumed from)."""
    path = ckpt_dir / phase / LOSSES_FILE
    losses = json.loads(path.read_text()) if path.exists() else []
    return losses[:start] if len(losses) >= start else []  # checkpoints from before the zoo kept them


def _fault_step(ctx: DistContext) -> int | None:
    """The step at which this rank dies (ZOO_TEST_FAULT=train-step@RANK:STEP), on its first attempt only."""
    armed = faults.armed("train-step")
    if armed is None or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    rank, step = armed
    return step if rank == ctx.rank else None


def freeze_except(model: torch.nn.Module, patterns: list[str]) -> None:
    """Train only parameters whose names match one of the globs (e.g. `classifier.*`)."""
    names = [name for name, _ in model.named_parameters()]
    for name, param in model.named_parameters():
        # Exported (QAT) graphs name parameters with '_' where the module tree had '.'.
        param.requires_grad = any(fnmatch(name, p) or fnmatch(name, p.replace(".", "_")) for p in patterns)
    if not any(p.requires_grad for p in model.parameters()):
        raise ZooError(f"trainable {patterns} matches no parameter; names look like {names[:3]}")


def initial_state(source: str | PublishedFile) -> tuple[str, dict[str, torch.Tensor]]:
    """Where `init_from` points and the weights there: a state dict saved by torch (`zoo import`'s converted
    checkpoint) or an fp32 ONNX file, whose initializers carry the module's parameter names (a published file,
    fetched by content)."""
    if isinstance(source, PublishedFile):
        path, where = published_object(source), source.label()
    else:
        path, where = Path(source), source
        if not path.is_file():
            raise ZooError(f"init_from: {path} does not exist (`zoo import` writes imported weights)")
    if zipfile.is_zipfile(path):
        return where, torch.load(path, map_location="cpu", weights_only=True)
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # protobuf's DecodeError and friends: not a model file
        raise ZooError(f"init_from: {where} is neither a torch state dict nor an ONNX model ({exc})") from None
    return where, {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}


def load_initial_weights(model: torch.nn.Module, source: str | PublishedFile) -> None:
    """Start from saved weights; only the task head may be missing (it is what fine-tuning learns)."""
    where, state = initial_state(source)
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("classifier.")]
    if missing or result.unexpected_keys:
        raise ZooError(f"init_from: {where} does not fit the model: missing {missing[:5]}, "
                       f"unexpected {result.unexpected_keys[:5]}")


def run(recipe: Recipe, ctx: DistContext, strategy_name: str = "ddp", output_dir: Path | None = None,
        resume: bool = False, tracking_uri: str | None = None, launcher: str = "ddp",
        profile_memory: bool = False) -> RunSummary | None:
    """Train (fp32, then the phase of each kind the recipe's quantization scheme makes: QAT), export every variant and
    measure it. Rank 0 returns the summary."""
    torch.manual_seed(recipe.seed)
    np.random.seed(recipe.seed)
    if ctx.device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS needs a fixed workspace
    torch.use_deterministic_algorithms(True)
    spec = model_spec(recipe.model)
    data = augmented(load_dataset(recipe.dataset or spec.dataset), recipe.augment)

    def fresh_model() -> torch.nn.Module:
        return model_for(recipe.model, data, **recipe.model_args).to(ctx.device)

    baseline_rss = per_rank(peak_rss_mib(), ctx)  # imports and data, before any model exists
    before_model = live_storages() if profile_memory else None
    model = fresh_model()
    strategy = make_strategy(strategy_name, ctx, recipe, fresh_model)
    if recipe.init_from:
        load_initial_weights(model, recipe.init_from)
    output_dir = Path(output_dir or Path("runs") / f"{recipe.model}-{recipe.name}")
    strategy.output_dir = output_dir
    ckpt_dir = output_dir / "checkpoints" if recipe.checkpoint.interval_steps else None
    if ctx.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
    ctx.barrier()

    tracker = _make_tracker(recipe, ctx, tracking_uri, launcher)
    started = time.perf_counter()
    try:
        phases = [Phase("fp32", steps_for(recipe, len(data.train)), recipe.optimizer.lr, recipe.schedule.warmup_steps,
                        padding_id=data.padding_id if recipe.group_by_length else None)]
        model = train_phase(phases[0], model, strategy, recipe, data, ctx, tracker, ckpt_dir, resume,
                            before_model=set(before_model) if before_model is not None else None)
        model.eval()
        eval_split = data.split(recipe.eval_split, recipe.eval_examples)
        measure = bool(recipe.export.variants)  # `export.variants=[]`: train only (benchmarks)
        # Every rank holds the whole trained model (Strategy.full_model): the rank that reports measures it.
        measure_here = measure and ctx.is_main
        torch_metrics = {"fp32": torch_accuracy(model, eval_split.x, eval_split.y)} if measure_here else {}

        def train(phase: Phase, module: torch.nn.Module, layout: Strategy, after_step=None) -> torch.nn.Module:
            """One more phase of this run (a kind's training hook: QAT fine-tuning)."""
            phases.append(phase)
            return train_phase(phase, module, layout, recipe, data, ctx, tracker, ckpt_dir, resume, after_step)

        trained = {}  # the kinds made by their own training phase (zoo.kinds: Kind.training): their torch models
        for kind in trained_kinds(recipe.quantization.scheme):
            trained[kind.key] = resolve_name(kind.training.hook)(model, recipe, data, ctx, strategy, train)
            if measure_here:
                torch_metrics[kind.key] = torch_accuracy(trained[kind.key], eval_split.x, eval_split.y)
        for name, value in torch_metrics.items():
            tracker.metric(f"torch/{name}/accuracy", value, 0)
        summary = None
        if ctx.is_main:
            from zoo.train.exports import export_variants  # lazy: onnxruntime (~4 s), on the one rank that exports

            # Export and onnxruntime measurement run on the CPU, wherever training ran.
            model = model.cpu()
            variants = export_variants(recipe, model, {key: m.cpu() for key, m in trained.items()}, data,
                                       output_dir) if measure else {}
            summary = RunSummary(
                model=recipe.model, recipe=recipe.name, recipe_sha256=recipe.digest(), launcher=launcher,
                strategy=strategy.name, world_size=ctx.world_size, backend=ctx.backend or "none",
                threads=torch.get_num_threads(), seed=recipe.seed, num_params=count_params(model), dataset=data.name,
                eval_split=recipe.eval_split, eval_examples=len(eval_split),
                phases={p.name: PhaseSummary(steps=p.steps, seconds=round(p.seconds, 3),
                                             first_loss=p.losses[0] if p.losses else None,
                                             final_loss=p.losses[-1] if p.losses else None, losses=p.losses,
                                             step_seconds=[round(t, 4) for t in p.step_seconds],
                                             peak_rss_mib=p.peak_rss_mib, memory_mib=p.memory,
                                             cpu_seconds_per_step=p.cpu_seconds,
                                             ranks_consistent=p.ranks_consistent)
                        for p in phases},
                baseline_rss_mib=baseline_rss, torch_accuracy=torch_metrics, variants=variants,
                wall_seconds=round(time.perf_counter() - started, 3), library_versions=current_versions(),
                allocator=allocator_in_use(),
                tracking=TrackedRun(uri=tracker.uri, run_id=tracker.run_id))
            torch.save(model.state_dict(), output_dir / "model.pt")
            summary_path = summary.write(output_dir)
            for key, v in variants.items():
                tracker.metric(f"onnx/{key}/accuracy", v.accuracy, 0)
            tracker.artifacts([output_dir / v.file for v in variants.values()] + [summary_path])
        tracker.finish()
        return summary
    except BaseException:
        tracker.finish("FAILED")
        raise


def _make_tracker(recipe: Recipe, ctx: DistContext, uri: str | None, launcher: str):
    enabled = ctx.is_main and recipe.tracking.enabled
    return Tracker(enabled, uri or recipe.tracking.uri, recipe.tracking.experiment, f"{recipe.model}-{recipe.name}",
                   {"recipe": recipe.model_dump(mode="json"), "launcher": launcher, "world_size": ctx.world_size})
