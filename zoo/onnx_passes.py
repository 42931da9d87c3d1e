"""Rewrites of an ONNX graph the zoo applies to its files: int8 embedding tables, int32 biases for onnxruntime's
fused int8 kernels, Gemm as MatMul for dynamic quantization, the exporter's debug metadata dropped, nodes in
topological order; and the one walk over a model's graphs, subgraphs and functions included (strip_debug_info,
zoo.evaluate's op types)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper


def graphs_of(model: onnx.ModelProto) -> Iterator[onnx.GraphProto | onnx.FunctionProto]:
    """The model's graph, its functions and every subgraph under them (If, Loop, Scan bodies)."""
    pending = [model.graph, *model.functions]
    while pending:
        graph = pending.pop()
        yield graph
        for node in graph.node:
            pending += [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]


def op_types(model: onnx.ModelProto) -> set[str]:
    """Every node type of the model, in all its graphs."""
    return {node.op_type for graph in graphs_of(model) for node in graph.node}


def strip_debug_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop the dynamo exporter's per-node debug metadata (Python stack traces with the exporting machine's file
    paths, FX node dumps): they differ between two checkouts of one commit, so they would break reproducible bytes,
    and they leak the builder's paths. The graph itself is untouched."""
    for graph in graphs_of(model):
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
