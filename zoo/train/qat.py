"""Quantization-aware training through torchao's PT2E route.

Why PT2E: it exports cleanly to ONNX QDQ through the dynamo exporter (measured: the FX route needs
the legacy exporter and observers disabled by hand), and X86InductorQuantizer's scheme (u8
activations, s8 per-channel weights) is the one onnxruntime's AVX2/VNNI int8 kernels run fast.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import types
import warnings

import torch

from zoo.logs import NOISY_IMPORTS, quiet

with quiet(*NOISY_IMPORTS):  # torchao warns while imported (CUDA kernels a CPU build lacks)
    from torchao.quantization.pt2e import allow_exported_model_train_eval
    from torchao.quantization.pt2e.fake_quantize import FusedMovingAvgObsFakeQuantize
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

from zoo.train.parallel import qat_strategy
from zoo.train.schedule import Phase


def fine_tune(model: torch.nn.Module, recipe, data, ctx, strategy, train) -> torch.nn.Module:
    """int8-qat's training hook (zoo.kinds): the trained fp32 model fine-tuned with fake quantization for the recipe's
    qat_steps (a phase named "qat" of the same loop), its observers' ranges agreed over the global batch, then
    converted to the int8 model the exporter writes."""
    q = recipe.quantization
    prepared = prepare_qat(model, data.train.x[:2].to(ctx.device))
    ranges = ObservedRanges(prepared, ctx)
    # First ranges from the same examples on every rank and in every layout (a checkpoint, if resumed, replaces them).
    ranges.calibrate(prepared, data.train.x[:recipe.global_batch_size].to(ctx.device))
    prepared = train(Phase("qat", q.qat_steps, q.qat_lr, 0), prepared, qat_strategy(strategy), ranges.update)
    ranges.close()
    return convert_qat(prepared)


def prepare_qat(model: torch.nn.Module, example: torch.Tensor) -> torch.nn.Module:
    """A copy of the fp32 model as an exported graph with fake quantization inserted, in train mode.

    A copy: the exported graph would otherwise share the fp32 model's parameter tensors, so QAT would rewrite the
    fp32 weights exported beside it, and hooks a data-parallel optimizer left on them (Horovod's) would fire twice.
    """
    model = copy.deepcopy(model).eval()
    batch = torch.export.Dim("batch", min=1)
    # reduce_range (7-bit activations): AVX2 CPUs without VNNI multiply u8 x s8 pairs into saturating int16
    # (vpmaddubsw); with 8-bit activations MNIST-1D's CNN lost 7 points in onnxruntime while the same model
    # scored its QAT accuracy in torch. 7 bits give the same int8 results on AVX2, VNNI and AMX machines.
    config = get_default_x86_inductor_quantization_config(is_qat=True, reduce_range=True)
    quantizer = X86InductorQuantizer().set_global(config)
    with warnings.catch_warnings(), _no_cyclic_gc():  # both steps trace the model
        warnings.simplefilter("ignore")
        graph = torch.export.export(model, (example,), dynamic_shapes=({0: batch},)).module()
        prepared = prepare_qat_pt2e(graph, quantizer)
    allow_train_eval(prepared)
    prepared.train()
    return prepared


# The ops whose train and eval forms differ in an exported graph: PT2E's train/eval switch rewrites their patterns.
MODE_DEPENDENT_OPS = ("dropout", "batch_norm")


def allow_train_eval(prepared: torch.fx.GraphModule) -> None:
    """Lets `.train()`/`.eval()` (called through DDP and other wrappers) work on the exported QAT graph: PT2E's own
    switches where the graph holds dropout or batch norm (BERT). A graph with neither (the CNN, the GRU) has nothing
    to switch, and PT2E's switch would still trace its six patterns anew (0.3-1 s a switch, two a QAT phase on every
    rank): there the calls do nothing."""
    if any(node.op == "call_function" and any(op in str(node.target) for op in MODE_DEPENDENT_OPS)
           for node in prepared.graph.nodes):
        allow_exported_model_train_eval(prepared)
        return
    prepared.train = types.MethodType(lambda self, mode=True: self, prepared)
    prepared.eval = types.MethodType(lambda self: self, prepared)


@contextlib.contextmanager
def _no_cyclic_gc():
    """Python's cyclic GC held off while a graph is traced: a finalizer that runs tensor ops (a training library's
    engine being collected) would otherwise run inside the trace, at whichever allocation triggers a collection."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def convert_qat(prepared: torch.nn.Module) -> torch.nn.Module:
    """Fold the learned fake quantization into quantize/dequantize ops, ready for ONNX export."""
    prepared.eval()  # allow_train_eval: PT2E's switch to eval where the graph has one
    return convert_pt2e(prepared)



class ObservedRanges:
    """The observers of a QAT graph, updated once per optimizer step from the global batch, whatever the layout.

    PT2E's fused observers update their moving min/max in every forward from whatever that forward sees: under data
    parallelism a rank sees only its slice, and with gradient accumulation weights are averaged in once per
    micro-batch. So N processes (or micro-batches) learned other quantization parameters than 1 process, and the
    ranks ended the phase disagreeing. Here the observers' own update is off; a pre-hook keeps the running min/max
    (per tensor, or per channel for weights) of every forward, and `update()` after each optimizer step takes the
    maximum over ranks of (-min, max) in one all-reduce for all observers, applies each observer's moving average
    once and writes its scale and zero point. A step's fake quantization uses the ranges of the steps before it;
    `calibrate` sets the first ranges from examples every rank holds (the same in every layout).
    """

    def __init__(self, prepared: torch.nn.Module, ctx):
        self.ctx = ctx
        self.modules = [m for m in prepared.modules() if isinstance(m, FusedMovingAvgObsFakeQuantize)]
        self.seen: dict[int, torch.Tensor] = {}
        self.hooks = []
        for index, module in enumerate(self.modules):
            module.observer_enabled.fill_(0)
            self.hooks.append(module.register_forward_pre_hook(self._observer(index)))

    def _observer(self, index: int):
        def observe(module, args):
            x = args[0].detach()
            rows = x.transpose(0, module.ch_axis).flatten(1) if module.is_per_channel else x.reshape(1, -1)
            extent = torch.stack([-rows.min(dim=1).values, rows.max(dim=1).values]).float().cpu()  # [2, channels]
            previous = self.seen.get(index)
            self.seen[index] = extent if previous is None else torch.maximum(previous, extent)
        return observe

    @torch.no_grad()
    def calibrate(self, prepared: torch.nn.Module, x: torch.Tensor) -> None:
        for module in self.modules:
            module.fake_quant_enabled.fill_(0)
        prepared(x)
        for module in self.modules:
            module.fake_quant_enabled.fill_(1)
        self.update()

    @torch.no_grad()
    def update(self) -> None:
        """Fold the ranges seen since the last update (all ranks) into every observer; called on every rank."""
        if not self.modules:
            return
        if len(self.seen) != len(self.modules):
            raise RuntimeError(f"{len(self.modules) - len(self.seen)} QAT observers saw no input this step")
        extents = [self.seen[i] for i in range(len(self.modules))]
        flat = self.ctx.all_reduce_max(torch.cat([e.flatten() for e in extents]))
        self.seen.clear()
        offset = 0
        for module, extent in zip(self.modules, extents):
            neg_low, high = flat[offset:offset + extent.numel()].view(2, -1)
            offset += extent.numel()
            low = -neg_low
            observer = module.activation_post_process
            if not module.is_per_channel:
                low, high = low[0], high[0]
            if observer.min_val.numel() == 0 or torch.isinf(observer.min_val).all():  # never observed
                _assign(observer.min_val, low)
                _assign(observer.max_val, high)
            else:
                c = observer.averaging_constant
                _assign(observer.min_val, observer.min_val + c * (low - observer.min_val))
                _assign(observer.max_val, observer.max_val + c * (high - observer.max_val))
            scale, zero_point = observer.calculate_qparams()
            _assign(module.scale, scale)
            _assign(module.zero_point, zero_point)

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()


def _assign(buffer: torch.Tensor, value: torch.Tensor) -> None:
    """Write `value` into a buffer in place (its shape on first use: per-channel buffers start empty or [1])."""
    value = value.reshape(buffer.shape) if value.numel() == buffer.numel() else value
    if buffer.shape != value.shape:
        buffer.resize_(value.shape)
    buffer.copy_(value)
