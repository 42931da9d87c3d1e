"""Quantization-aware training through torchao's PT2E route.

Why PT2E: it exports cleanly to ONNX QDQ through the dynamo exporter (measured: the FX route needs
the legacy exporter and observers disabled by hand), and X86InductorQuantizer's scheme (u8
activations, s8 per-channel weights) is the one onnxruntime's AVX2/VNNI int8 kernels run fast.
"""

from __future__ import annotations

import warnings

import torch

from torchao.quantization.pt2e import (
    allow_exported_model_train_eval,
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)


def prepare_qat(model: torch.nn.Module, example: torch.Tensor) -> torch.nn.Module:
    """The fp32 model as an exported graph with fake quantization inserted, in train mode."""
    model.eval()
    batch = torch.export.Dim("batch", min=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = torch.export.export(model, (example,), dynamic_shapes=({0: batch},)).module()
    # reduce_range (7-bit activations): AVX2 CPUs without VNNI multiply u8 x s8 pairs into saturating int16
    # (vpmaddubsw); with 8-bit activations MNIST-1D's CNN lost 7 points in onnxruntime while the same model
    # scored its QAT accuracy in torch. 7 bits give the same int8 results on AVX2, VNNI and AMX machines.
    config = get_default_x86_inductor_quantization_config(is_qat=True, reduce_range=True)
    quantizer = X86InductorQuantizer().set_global(config)
    prepared = prepare_qat_pt2e(graph, quantizer)
    # Lets `.train()`/`.eval()` (called through DDP and other wrappers) map to PT2E's own switches.
    allow_exported_model_train_eval(prepared)
    move_exported_model_to_train(prepared)
    return prepared


def convert_qat(prepared: torch.nn.Module) -> torch.nn.Module:
    """Fold the learned fake quantization into quantize/dequantize ops, ready for ONNX export."""
    move_exported_model_to_eval(prepared)
    return convert_pt2e(prepared)

