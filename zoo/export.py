"""ONNX variants of a trained model, each stamped with the zoo's metadata.

fp32 is exported directly at each opset the recipe lists (onnx.version_converter fails for most
opset pairs); int8-qat comes from the torchao PT2E converted model through the dynamo exporter
(QDQ, u8 activations, s8 per-channel weights) with int32 biases so onnxruntime fuses QLinearConv/QGemm;
int8-ptq is onnxruntime's quantize_static baseline; fp16 keeps fp32 inputs and outputs.

Metadata keys (ModelProto.metadata_props, read back as ORT's custom_metadata_map). ONNX has no
standard key for compute or accumulation precision, so the zoo defines these:
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
from onnxruntime.transformers.float16 import convert_float_to_float16
from onnxruntime.transformers.optimizer import optimize_model

from zoo.metadata import read_metadata
from zoo.errors import ZooError
from zoo.fsutil import atomic_write_bytes, replace_into
from zoo.ondevice.trainable import TRAINABLE_GLOBS_KEY, TRAINABLE_KEY, trainable_initializers
from zoo.store.pointer import sha256_file
from zoo.variants import KINDS, onnx_kinds

# The dynamo exporter warns about every torchvision op it cannot register; torchvision is not a dependency.
logging.getLogger("torch.onnx").setLevel(logging.ERROR)
# onnxruntime's transformer optimizer logs every fusion it tries at WARNING.
logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)

METADATA_KEYS = {
    "zoo.model": "catalog / architecture name",
    "zoo.variant": "the variant kind (zoo.variants): " + " | ".join(onnx_kinds()),
    "zoo.precision.weights": "storage type of the weights (fp32, fp16, int8)",
    "zoo.precision.activations": "type of activations between ops (fp32, fp16, uint8)",
    "zoo.precision.compute": "arithmetic the kernels are meant to use (fp32, fp16, int8 u8xs8)",
    "zoo.precision.accumulation": "accumulator type (fp32, int32)",
    "zoo.quantization": "none, or the scheme: tool, granularity, symmetry, activation/weight types",
    "zoo.source_sha256": "for derived variants: sha256 of the fp32 ONNX file they were made from",
    "zoo.recipe": "recipe name",
    "zoo.recipe_sha256": "sha256 of the resolved recipe (after overrides)",
    "zoo.git_commit": "the clean commit `zoo build` recorded before it started (card: training.git_commit); "
                      "'-dirty' for builds allowed on a tree with uncommitted changes",
    "zoo.opset": "default-domain opset of the file",
    "zoo.trainable": "fp32 only: JSON list of the initializers on-device training may change (the rest stay frozen)",
    "zoo.trainable.globs": "fp32 only: the recipe's parameter-name patterns (export.trainable) behind zoo.trainable",
    "zoo.parameter_aliases": "fp32 only: JSON {parameter: initializer} for the parameters the exporter stored under "
                             "another initializer's name (it deduplicates value-identical tensors); every other "
                             "parameter is the initializer of its own name, so the file maps back onto the torch model",
    "zoo.finetuned_from_sha256": "fine-tuned or federated files: sha256 of the fp32 file they started from",
    "zoo.finetune": "files from `zoo finetune --onnx`: steps, learning rate, batch, seed (JSON)",
    "zoo.federated": "files from launchers/federated.py: rounds, clients, aggregation (JSON)",
    "zoo.tokenizer": "text models: the tokenizer that makes the input ids, as the `tokenizers` library's JSON "
                     "(`Tokenizer.from_str`), from the dataset (zoo.data)",
}
__doc__ += "\n".join(f"- `{k}`: {v}" for k, v in METADATA_KEYS.items())
# Keys only some files carry: fp32 exports (on-device training split) and files trained from a zoo file.
FP32_ONLY_KEYS = {"zoo.trainable", "zoo.trainable.globs", "zoo.parameter_aliases"}
# What a file made from the fp32 file inherits from it: the same model, recipe and build.
INHERITED_KEYS = ("zoo.model", "zoo.recipe", "zoo.recipe_sha256", "zoo.git_commit", "zoo.tokenizer")
RETRAINED_KEYS = {"zoo.finetuned_from_sha256", "zoo.finetune", "zoo.federated"}
# Keys only files of some datasets carry (their Dataset.onnx_metadata).
DATASET_KEYS = {"zoo.tokenizer"}

def inherited_metadata(fp32_path: Path) -> dict[str, str]:
    """The provenance keys a derived file copies from the fp32 file it was made from (so deriving it again, anywhere,
    stamps the same bytes)."""
    props = read_metadata(fp32_path)
    return {k: props[k] for k in INHERITED_KEYS if k in props}


def _atomic_save(model: onnx.ModelProto, path: Path) -> Path:
    atomic_write_bytes(path, model.SerializeToString())
    return path


def stamp(path: Path, variant: str, common: dict[str, str], source: Path | None = None) -> Path:
    """Write the zoo's metadata into an ONNX file (replacing any it had), then check the file."""
    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    props = {**common, **KINDS[variant].metadata, "zoo.variant": variant, "zoo.opset": str(opset)}
    if source is not None:
        props["zoo.source_sha256"] = sha256_file(source)
    return write_metadata(model, props, path)


def write_metadata(model: onnx.ModelProto, props: dict[str, str], path: Path) -> Path:
    """Replace the model's metadata with `props`, check it, and save it atomically to `path`."""
    del model.metadata_props[:]
    for key in sorted(props):
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=props[key]))
    onnx.checker.check_model(model, full_check=True)
    return _atomic_save(model, path)


ALIASES_KEY = "zoo.parameter_aliases"


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
    with warnings.catch_warnings():
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(converted, (example,), dynamo=True, input_names=[input_name],
                                    output_names=[output_name], dynamic_shapes=({0: batch},), verbose=False)
    return _atomic_save(quantize_embeddings(quantize_biases(strip_debug_info(program.model_proto))), path)


def strip_debug_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop the dynamo exporter's per-node debug metadata (Python stack traces with the exporting machine's file
    paths, FX node dumps): they differ between two checkouts of one commit, so they would break reproducible bytes,
    and they leak the builder's paths. The graph itself is untouched."""
    graphs = [model.graph, *(f for f in model.functions)]
    while graphs:
        graph = graphs.pop()
        if isinstance(graph, onnx.GraphProto):
            graph.doc_string = ""
            for info in [*graph.input, *graph.output, *graph.value_info]:
                del info.metadata_props[:]
                info.doc_string = ""
            for init in graph.initializer:
                del init.metadata_props[:]
        for node in graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
            graphs += [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]
    return model


def quantize_embeddings(model: onnx.ModelProto, min_rows: int = 64) -> onnx.ModelProto:
    """Store embedding tables (Gather over a float initializer of >= `min_rows` rows) as int8, one symmetric scale
    per row: Gather(int8 table) -> Cast -> Mul(Gather(scales)). The lookup reads int8 rows and scales only those,
    where a DequantizeLinear in front of the Gather would dequantize the whole table on every call. Tables are most
    of a BERT file (the word embeddings: 30,522 rows), which quantizing the weight-bearing ops leaves in fp32."""
    inits = {i.name: i for i in model.graph.initializer}
    users: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    added_inits, added_nodes, replaced = [], [], set()
    for node in list(model.graph.node):
        if node.op_type != "Gather" or node.input[0] not in inits or node.input[0] in replaced:
            continue
        table = inits[node.input[0]]
        if table.data_type != onnx.TensorProto.FLOAT or len(table.dims) != 2 or table.dims[0] < min_rows:
            continue
        if any(u.op_type != "Gather" or u.input[0] != table.name or dict((a.name, a.i) for a in u.attribute).get("axis", 0)
               for u in users[table.name]):
            continue  # used as something other than a row lookup: leave it as it is
        weights = numpy_helper.to_array(table)
        scale = (np.abs(weights).max(axis=1, keepdims=True) / 127.0).astype(np.float32)
        scale[scale == 0] = 1.0
        q = np.clip(np.round(weights / scale), -127, 127).astype(np.int8)
        name = table.name
        added_inits += [numpy_helper.from_array(q, f"{name}.int8"), numpy_helper.from_array(scale, f"{name}.row_scale")]
        for i, user in enumerate(users[name]):
            out, ids = user.output[0], user.input[1]
            tag = f"{name}.lookup{i}"
            user.input[0] = f"{name}.int8"
            user.output[0] = f"{tag}.int8"
            added_nodes += [
                helper.make_node("Cast", [f"{tag}.int8"], [f"{tag}.float"], to=onnx.TensorProto.FLOAT, name=f"{tag}.Cast"),
                helper.make_node("Gather", [f"{name}.row_scale", ids], [f"{tag}.scale"], axis=0, name=f"{tag}.GatherScale"),
                helper.make_node("Mul", [f"{tag}.float", f"{tag}.scale"], [out], name=f"{tag}.Mul"),
            ]
        replaced.add(name)
    if replaced:
        kept = [i for i in model.graph.initializer if i.name not in replaced]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept + added_inits)
        model.graph.node.extend(added_nodes)
        topological_sort(model.graph)
    return model


def quantize_biases(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give Conv/Gemm fp32 biases a DequantizeLinear from int32 (scale = x_scale * w_scale, zero point 0).

    onnxruntime only fuses DQ -> Conv/Gemm -> Q into QLinearConv / QGemm when the bias is int32 behind a
    DQ node (as its own quantizer writes it); PT2E leaves biases in fp32, which would keep fp32 kernels.
    """
    inits = {i.name: i for i in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    added_inits, added_nodes, rewired = [], [], []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or node.input[2] not in inits:
            continue
        dq_x, dq_w = producer.get(node.input[0]), producer.get(node.input[1])
        if not (dq_x and dq_w and dq_x.op_type == dq_w.op_type == "DequantizeLinear"):
            continue
        x_scale = numpy_helper.to_array(inits[dq_x.input[1]])
        w_scale = numpy_helper.to_array(inits[dq_w.input[1]])
        bias = numpy_helper.to_array(inits[node.input[2]])
        scale = np.broadcast_to((x_scale * w_scale).astype(np.float32), bias.shape).copy()
        q_bias = np.clip(np.round(bias / scale), -(2**31), 2**31 - 1).astype(np.int32)
        # A bias shared by several nodes (an unrolled RNN) meets a different input scale at each: one DQ per use.
        name = f"{node.input[2]}.{len(added_nodes)}"
        added_inits += [numpy_helper.from_array(q_bias, f"{name}.int32"), numpy_helper.from_array(scale, f"{name}.scale"),
                        numpy_helper.from_array(np.zeros(bias.shape, np.int32), f"{name}.zero_point")]
        added_nodes.append(helper.make_node("DequantizeLinear", [f"{name}.int32", f"{name}.scale", f"{name}.zero_point"],
                                            [f"{name}.dequantized"], axis=0, name=f"{name}.DequantizeLinear"))
        rewired.append(node.input[2])
        node.input[2] = f"{name}.dequantized"
    if added_nodes:
        still_used = {i for node in model.graph.node for i in node.input}
        kept = [i for i in model.graph.initializer if i.name not in set(rewired) or i.name in still_used]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept + added_inits)
        model.graph.node.extend(added_nodes)
        topological_sort(model.graph)
    return model


def topological_sort(graph: onnx.GraphProto) -> None:
    """Reorder nodes so each comes after the producers of its inputs (the checker requires it)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            raise ValueError("graph has a cycle or an input nobody produces")
        for node in ready:
            ordered.append(node)
            available.update(node.output)
        taken = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in taken]
    del graph.node[:]
    graph.node.extend(ordered)


class _Calibration:
    """onnxruntime CalibrationDataReader over fixed batches."""

    def __init__(self, input_name: str, batches: list[np.ndarray]):
        self._items: Iterator = iter([{input_name: b} for b in batches])

    def get_next(self):
        return next(self._items, None)


def fp32_metadata(onnx_model: onnx.ModelProto, model: torch.nn.Module, patterns: list[str] | None) -> dict[str, str]:
    """The keys only fp32 files carry: the on-device training split and the parameter aliases."""
    params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
    names = trainable_initializers(onnx_model, params, patterns)
    return {TRAINABLE_KEY: json.dumps(names), TRAINABLE_GLOBS_KEY: json.dumps(patterns or ["*"]),
            ALIASES_KEY: json.dumps(parameter_aliases(onnx_model, model), sort_keys=True)}


def _shared_bias_notice(record: logging.LogRecord) -> bool:
    """Drops the QDQ quantizer's "Bias ... has already been marked for quantization": it comes once per extra consumer
    of a shared bias (hundreds of lines for mnist1d-gru's unrolled steps) and needs nothing from the user."""
    return "has already been marked for quantization" not in record.getMessage()


def export_int8_ptq(fp32_path: Path, calibration: list[np.ndarray], path: Path, op_types: list[str] | None = None) -> Path:
    """Post-training static quantization with onnxruntime: the baseline QAT is compared against."""
    input_name = onnx.load(str(fp32_path), load_external_data=False).graph.input[0].name
    tmp, prepared = path.with_suffix(".ptq.tmp"), path.with_suffix(".pre.tmp")
    quant_pre_process(str(fp32_path), str(prepared))  # shape inference + folding, as ORT recommends
    # op_types (recipe quantization.ptq_op_types): BERT recipes list only the weight-bearing ops; quantizing the
    # attention-mask Add too (its input spans -3.4e38..x) collapsed attention and bert-tiny fell from 95% to 54%.
    root = logging.getLogger()  # onnxruntime's quantizer logs through the root logger
    root.addFilter(_shared_bias_notice)
    try:
        quantize_static(str(prepared), str(tmp), _Calibration(input_name, calibration), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                        reduce_range=True, calibrate_method=CalibrationMethod.MinMax, op_types_to_quantize=op_types)
    finally:
        root.removeFilter(_shared_bias_notice)
    prepared.unlink()
    _atomic_save(quantize_embeddings(onnx.load(str(tmp))), path)
    tmp.unlink()
    return path


def export_fp16(fp32_path: Path, path: Path) -> Path:
    """fp16 weights and compute, fp32 inputs/outputs (Cast at the edges) so callers feed the same arrays."""
    model = convert_float_to_float16(onnx.load(str(fp32_path)), keep_io_types=True)
    topological_sort(model.graph)  # the converter appends its input Casts at the end
    return _atomic_save(model, path)


# What onnxruntime's dynamic quantization has integer CPU kernels for with s8 weights (ConvInteger takes u8 weights
# only, and Gemm has no dynamic kernel: Gemms are rewritten as MatMul + Add first).
DYNAMIC_OP_TYPES = ["MatMul", "Attention", "LSTM"]
DYNAMIC_KERNELS = {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM",
                   "QAttention"}


def gemm_as_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite Gemm nodes over a weight initializer (a Linear layer on 2-D input) as MatMul + Add, the form dynamic
    quantization knows; the arithmetic is the same."""
    inits = {i.name: i for i in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        name = f"{node.input[1]}.matmul"
        model.graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(weight.T if attrs.get("transB", 0) else weight), name))
        product = node.output[0] if len(node.input) < 3 else f"{node.name or node.output[0]}.product"
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product], name=f"{node.name}.MatMul"))
        if len(node.input) >= 3:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}.Add"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {i for node in model.graph.node for i in node.input}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def optimize_transformer(fp32_path: Path, path: Path) -> dict[str, int]:
    """onnxruntime's offline transformer optimizer (model_type bert, after its basic graph optimizations): one
    Attention op per self-attention block (q/k/v projections, mask, softmax), SkipLayerNormalization, BiasGelu.
    Heads and width are read from the graph's reshapes. Returns the fusions made (none means the export's pattern
    no longer matches what onnxruntime knows: the caller refuses)."""
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
    _atomic_save(gemm_as_matmul(onnx.load(str(prepared))), prepared)
    # Fused ops (com.microsoft domain) have no ONNX shape inference: their outputs are float tensors.
    quantize_dynamic(str(prepared), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=DYNAMIC_OP_TYPES, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    prepared.unlink()
    model = onnx.load(str(tmp))
    tmp.unlink()
    if not {n.op_type for n in model.graph.node} & DYNAMIC_KERNELS:
        raise ZooError(f"{fp32_path.name} has no {'/'.join(DYNAMIC_OP_TYPES)} or Linear layer for dynamic quantization "
                       "to make int8 (its Conv layers need calibration: int8-ptq)")
    _atomic_save(quantize_embeddings(model), path)
    return path
