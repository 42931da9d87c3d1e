"""The variants onnxruntime's own tools make from an fp32 file: int8-ptq (quantize_static), int8-dynamic
(quantize_dynamic, transformers fused by onnxruntime's transformer optimizer first) and fp16 (its float16 converter);
int8 files get the zoo's int8 embedding tables (zoo.onnx_passes)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

import zoo.ort  # noqa: F401  (first: onnxruntime imported without ORTModule)
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
from onnxruntime.transformers.float16 import convert_float_to_float16
from onnxruntime.transformers.optimizer import optimize_model

from zoo.errors import ZooError
from zoo.logs import quiet
from zoo.metadata import save_onnx
from zoo.onnx_passes import gemm_as_matmul, quantize_embeddings, topological_sort

class _Calibration:
    """onnxruntime CalibrationDataReader over fixed batches."""

    def __init__(self, input_name: str, batches: list[np.ndarray]):
        self._items: Iterator = iter([{input_name: b} for b in batches])

    def get_next(self):
        return next(self._items, None)


# What onnxruntime's quantizers log through the root logger that needs nothing from the user: "Bias ... has already
# been marked for quantization" once per extra consumer of a shared bias (hundreds of lines for mnist1d-gru's unrolled
# steps), and "Please consider to run pre-processing" for a transformer, whose file went through onnxruntime's
# transformer optimizer instead (the same shape inference, plus the fusions), so `zoo fetch` printed it.
_NOTICES = ("has already been marked for quantization", "pre-processing before quantization")


def _no_notice(record: logging.LogRecord) -> bool:
    return not any(notice in record.getMessage() for notice in _NOTICES)


@contextlib.contextmanager
def _quantizer_notices_dropped():
    root = logging.getLogger()  # onnxruntime's quantizer logs through the root logger
    root.addFilter(_no_notice)
    try:
        yield
    finally:
        root.removeFilter(_no_notice)


def export_int8_ptq(fp32_path: Path, calibration: list[np.ndarray], path: Path, op_types: list[str] | None = None) -> Path:
    """Post-training static quantization with onnxruntime: the baseline QAT is compared against."""
    input_name = onnx.load(str(fp32_path), load_external_data=False).graph.input[0].name
    tmp, prepared = path.with_suffix(".ptq.tmp"), path.with_suffix(".pre.tmp")
    quant_pre_process(str(fp32_path), str(prepared))  # shape inference + folding, as ORT recommends
    # op_types (recipe quantization.ptq_op_types): BERT recipes list only the weight-bearing ops; quantizing the
    # attention-mask Add too (its input spans -3.4e38..x) collapsed attention and bert-tiny fell from 95% to 54%.
    with _quantizer_notices_dropped():
        quantize_static(str(prepared), str(tmp), _Calibration(input_name, calibration), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                        reduce_range=True, calibrate_method=CalibrationMethod.MinMax, op_types_to_quantize=op_types)
    prepared.unlink()
    save_onnx(quantize_embeddings(onnx.load(str(tmp))), path)
    tmp.unlink()
    return path


def export_fp16(fp32_path: Path, path: Path) -> Path:
    """fp16 weights and compute, fp32 inputs/outputs (Cast at the edges) so callers feed the same arrays."""
    with quiet("onnxruntime.transformers"):
        model = convert_float_to_float16(onnx.load(str(fp32_path)), keep_io_types=True)
    topological_sort(model.graph)  # the converter appends its input Casts at the end
    return save_onnx(model, path)


# What onnxruntime's dynamic quantization has integer CPU kernels for with s8 weights (ConvInteger takes u8 weights
# only, and Gemm has no dynamic kernel: Gemms are rewritten as MatMul + Add first).
DYNAMIC_OP_TYPES = ["MatMul", "Attention", "LSTM"]
DYNAMIC_KERNELS = {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM",
                   "QAttention"}


def optimize_transformer(fp32_path: Path, path: Path) -> dict[str, int]:
    """onnxruntime's offline transformer optimizer (model_type bert, after its basic graph optimizations): one
    Attention op per self-attention block (q/k/v projections, mask, softmax), SkipLayerNormalization, BiasGelu.
    Heads and width are read from the graph's reshapes. Returns the fusions made (none means the export's pattern
    no longer matches what onnxruntime knows: the caller refuses)."""
    with quiet("onnxruntime.transformers"):  # it logs every fusion it tries at WARNING
        optimized = optimize_model(str(fp32_path), model_type="bert", num_heads=0, hidden_size=0, opt_level=1)
    optimized.save_model_to_file(str(path))
    return {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}


def export_int8_dynamic(fp32_path: Path, path: Path, transformer: bool = False) -> Path:
    """Dynamic quantization with onnxruntime: int8 weights of the MatMul-type ops, activations quantized per batch
    inside the integer kernels (no calibration data), embedding tables as in the other int8 files. Transformers are
    first fused by onnxruntime's transformer optimizer, so each attention block becomes one QAttention kernel."""
    tmp, prepared = path.with_suffix(".dyn.tmp"), path.with_suffix(".pre.tmp")
    if transformer:
        fused = optimize_transformer(fp32_path, prepared)
        if not fused.get("Attention"):
            prepared.unlink(missing_ok=True)
            raise ZooError(f"{fp32_path.name}: onnxruntime's transformer optimizer fused no Attention op "
                           f"(fusions: {fused or 'none'}); the export's attention pattern changed")
    else:
        quant_pre_process(str(fp32_path), str(prepared))
    save_onnx(gemm_as_matmul(onnx.load(str(prepared))), prepared)
    # Fused ops (com.microsoft domain) have no ONNX shape inference: their outputs are float tensors.
    with quiet("onnxruntime.transformers"), _quantizer_notices_dropped():
        quantize_dynamic(str(prepared), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=DYNAMIC_OP_TYPES, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    prepared.unlink()
    model = onnx.load(str(tmp))
    tmp.unlink()
    if not {n.op_type for n in model.graph.node} & DYNAMIC_KERNELS:
        raise ZooError(f"{fp32_path.name} has no {'/'.join(DYNAMIC_OP_TYPES)} or Linear layer for dynamic quantization "
                       "to make int8 (its Conv layers need calibration: int8-ptq)")
    save_onnx(quantize_embeddings(model), path)
    return path
