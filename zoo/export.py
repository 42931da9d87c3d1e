"""torch -> ONNX: the trained fp32 model at each opset the recipe lists (exported directly: onnx.version_converter
fails for most opset pairs), int8-qat from the torchao PT2E converted model through the dynamo exporter (QDQ, u8
activations, s8 per-channel weights, int32 biases so onnxruntime fuses QLinearConv/QGemm), the keys only fp32 files
carry, and the way back (an fp32 file's weights into its torch model, for re-export at other opsets). The variants
onnxruntime's tools make from the fp32 file are in zoo.ort_quantize; the metadata in zoo.metadata."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper

from zoo.fsutil import replace_into
from zoo.logs import quiet
from zoo.metadata import ALIASES_KEY, read_metadata, save_onnx
from zoo.ondevice.trainable import TRAINABLE_GLOBS_KEY, TRAINABLE_KEY, trainable_initializers
from zoo.onnx_passes import quantize_biases, quantize_embeddings, strip_debug_info

def parameter_aliases(onnx_model: onnx.ModelProto, model: torch.nn.Module) -> dict[str, str | None]:
    """{parameter: initializer} for the parameters not stored under their own name (found by identical bytes);
    None for parameters the graph does not use at all (e.g. a pooler under mean pooling)."""
    inits = {i.name: i for i in onnx_model.graph.initializer}
    by_bytes = {numpy_helper.to_array(i).tobytes() + str(tuple(i.dims)).encode(): i.name for i in inits.values()}
    aliases = {}
    for name, param in model.state_dict().items():
        if name in inits:
            continue
        value = param.detach().cpu().numpy()
        key = value.tobytes() + str(tuple(value.shape)).encode()
        aliases[name] = by_bytes.get(key)
    return aliases


def load_onnx_weights(path: Path, model: torch.nn.Module) -> torch.nn.Module:
    """Put an fp32 file's initializers back into the torch model it was exported from (by name, then by the
    file's recorded aliases); every parameter must be found or recorded as unused by the graph (those, like the
    buffers the exporter folded, keep the model's own values: no output depends on them)."""
    onnx_model = onnx.load(str(path))
    inits = {i.name: i for i in onnx_model.graph.initializer}
    aliases = json.loads(read_metadata(path).get(ALIASES_KEY, "{}"))
    state = model.state_dict()
    params = {n for n, _ in model.named_parameters()}
    missing = []
    for name, tensor in state.items():
        source = name if name in inits else aliases.get(name)
        if source is None:
            if name in params and name not in aliases:
                missing.append(name)
            continue
        value = torch.from_numpy(numpy_helper.to_array(inits[source]).copy())
        if value.shape != tensor.shape:
            raise ValueError(f"{path.name}: initializer {source} has shape {tuple(value.shape)}, parameter {name} "
                             f"expects {tuple(tensor.shape)}")
        state[name] = value
    if missing:
        raise ValueError(f"{path.name} does not map onto the model: no initializer for {', '.join(missing[:5])} "
                         "(files exported before the zoo kept parameter names cannot be re-exported)")
    model.load_state_dict(state)
    return model


def export_fp32(model: torch.nn.Module, example: torch.Tensor, path: Path, opset: int,
                input_name: str = "input", output_name: str = "logits") -> Path:
    """The TorchScript exporter writes exactly the requested opset (the dynamo one starts at 18 and converts).

    No constant folding: initializers keep the state_dict's names (folding renamed Linear weights into transposed
    `onnx::MatMul_*` tensors), so the file maps back onto the torch model for re-export at other opsets; onnxruntime
    folds the Transposes when it loads the file."""
    model.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".export.tmp")
    with warnings.catch_warnings(), quiet("torch.onnx"):  # it warns about every torchvision op it cannot register
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(tmp), dynamo=False, opset_version=opset, do_constant_folding=False,
                          input_names=[input_name], output_names=[output_name],
                          dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}})
    replace_into(tmp, path)
    return path


def export_int8_qat(converted: torch.nn.Module, example: torch.Tensor, path: Path,
                    input_name: str = "input", output_name: str = "logits") -> Path:
    """The PT2E-converted model through the dynamo exporter (QDQ), biases then quantized to int32."""
    batch = torch.export.Dim("batch", min=1)
    with warnings.catch_warnings(), quiet("torch.onnx"):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(converted, (example,), dynamo=True, input_names=[input_name],
                                    output_names=[output_name], dynamic_shapes=({0: batch},), verbose=False)
    return save_onnx(quantize_embeddings(quantize_biases(strip_debug_info(program.model_proto))), path)


def fp32_metadata(onnx_model: onnx.ModelProto, model: torch.nn.Module, patterns: list[str] | None) -> dict[str, str]:
    """The keys only fp32 files carry: the on-device training split and the parameter aliases."""
    params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
    names = trainable_initializers(onnx_model, params, patterns)
    return {TRAINABLE_KEY: json.dumps(names), TRAINABLE_GLOBS_KEY: json.dumps(patterns or ["*"]),
            ALIASES_KEY: json.dumps(parameter_aliases(onnx_model, model), sort_keys=True)}
