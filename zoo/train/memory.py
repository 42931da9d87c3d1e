"""What a rank's memory holds: live tensor bytes by category, counted, next to the resident set.

The resident set mixes what a layout needs with what the allocator (glibc on CPU) keeps from earlier steps. Here
tensors are counted instead, once per profiled step, at the moment the optimizer steps — when parameters,
gradients, optimizer state and communication buffers are all alive:

- parameters: the storage behind the model's parameters on this rank (a DTensor's local shard; a ZeRO-3
  parameter's partition `ds_tensor`);
- master_weights: parameters the optimizer steps that are not the model's own (DeepSpeed's fp32 partitions);
- gradients: the `.grad` of both;
- optimizer_state: the torch optimizer's state tensors (Adam's moments, step counters);
- buffers: every other tensor alive in the process that did not exist before the model was built — communication
  buckets, flat partitions, all-gather and reduce-scatter buffers (found by walking Python's objects, so buffers
  held only in C++, like DDP's reducer buckets, are not seen);
- activations: the bytes autograd saved for backward during the step (`saved_tensors_hooks`), distinct storages.

Model states (the ZeRO paper's term) are parameters + master weights + gradients + optimizer state.

And the allocator those tensors live in: `zoo train` and the benchmarks start workers on jemalloc where installed.
"""

from __future__ import annotations

import ctypes.util
import gc
import os
from pathlib import Path

import torch

MIB = 2**20
MODEL_STATES = ("parameters", "master_weights", "gradients", "optimizer_state")


def torch_optimizer(optimizer) -> torch.optim.Optimizer | None:
    """The torch optimizer that actually steps: the strategy's own, or the one a DeepSpeed engine wraps."""
    for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
        if isinstance(candidate, torch.optim.Optimizer):
            return candidate
    return None


def live_storages() -> dict[int, int]:
    """data_ptr -> bytes of every tensor storage Python can reach."""
    return _storages(obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and not obj.is_meta)


def _storages(tensors) -> dict[int, int]:
    """data_ptr -> bytes of the distinct storages behind `tensors` on this rank (a DTensor counts its local shard)."""
    found: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        try:
            storage = (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()
        except (RuntimeError, ReferenceError):  # tensors without storage (sparse, functional wrappers)
            continue
        if storage.nbytes():
            found[storage.data_ptr()] = storage.nbytes()
    return found


class MemoryCount:
    """Count one rank's tensors by category during the steps between `start()` and `stop()` (benchmarks)."""

    def __init__(self, strategy, before_model: set[int]):
        self.strategy, self.before_model = strategy, before_model
        self.counts: dict[str, int] = {}
        self.saved: dict[int, int] = {}
        self.saved_total = 0  # bytes of `saved`, kept as packs arrive (no re-summing per tensor)
        self.activations = 0
        self._hooks = []

    def start(self) -> None:
        optimizer = torch_optimizer(self.strategy.optimizer)
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._count(opt)))
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda packed: packed)
        self._saved_hooks.__enter__()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:  # tensor subclasses (DTensor, functional wrappers) may have no storage of their own
            storage = tensor.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
        except RuntimeError:
            return tensor
        if pointer not in self.saved:
            self.saved[pointer] = size
            self.saved_total += size
            self.activations = max(self.activations, self.saved_total)
        return tensor

    def step_done(self) -> None:
        self.saved.clear()  # what one step saved is freed by its backward
        self.saved_total = 0

    def _count(self, optimizer: torch.optim.Optimizer) -> None:
        module = self.strategy.module
        model_params = [getattr(p, "ds_tensor", None) if getattr(p, "ds_tensor", None) is not None else p
                        for p in module.parameters()]
        params = _storages(model_params)
        stepped = [p for group in optimizer.param_groups for p in group["params"]]
        master = {k: v for k, v in _storages(stepped).items() if k not in params}
        grads = _storages([p.grad for p in [*module.parameters(), *stepped]])
        state = _storages([t for per_param in optimizer.state.values() for t in per_param.values() if torch.is_tensor(t)])
        known = params | master | grads | state
        buffers = {k: v for k, v in live_storages().items() if k not in known and k not in self.before_model}
        counts = {"parameters": params, "master_weights": master, "gradients": grads, "optimizer_state": state,
                  "buffers": buffers}
        for name, found in counts.items():
            self.counts[name] = max(self.counts.get(name, 0), sum(found.values()))

    def stop(self) -> dict[str, float]:
        for hook in self._hooks:
            hook.remove()
        self._saved_hooks.__exit__(None, None, None)
        report = {name: round(self.counts.get(name, 0) / MIB, 1)
                  for name in (*MODEL_STATES, "buffers")}
        report["activations"] = round(self.activations / MIB, 1)
        report["model_states"] = round(sum(report[c] for c in MODEL_STATES), 1)
        return report


# jemalloc without decay: freed pages stay with the process for reuse (no page faults on the next step's buffers) but,
# unlike glibc, large blocks are not stranded in per-thread arenas and heap gaps, so the resident set follows what the
# layout holds; benchmarks/parallel.py measures both allocators side by side (results/parallel.md).
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def allocator_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment that makes training workers use jemalloc where it is installed (`make setup` installs it), as
    Intel's CPU launchers do. Nothing when the user already preloads a library or sets ZOO_ALLOCATOR=system."""
    environ = os.environ if environ is None else environ
    if environ.get("LD_PRELOAD") or environ.get("ZOO_ALLOCATOR") == "system":
        return {}
    library = ctypes.util.find_library("jemalloc")
    if library is None:
        return {}
    return {"LD_PRELOAD": library, "MALLOC_CONF": environ.get("MALLOC_CONF", JEMALLOC_CONF)}


def allocator_in_use() -> str:
    """Which malloc this process runs on (recorded in summary.json)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if f"lib{name}" in maps:
            return name
    return "system"
