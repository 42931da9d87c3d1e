"""Export every variant a recipe asks for, stamp it, and measure it with onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import torch

from zoo import export
from zoo.data import Dataset
from zoo.evaluate import INT8_KERNELS, accuracy, kernel_types, predict
from zoo.recipes import Recipe
from zoo.store.pointer import pointer_for

FILES = {"fp32": "model.onnx", "int8-qat": "model.int8-qat.onnx", "int8-ptq": "model.int8-ptq.onnx",
         "fp16": "model.fp16.onnx"}


def _describe(path: Path, opset: int, acc: float) -> dict:
    pointer = pointer_for(path)
    return {"file": path.name, "sha256": pointer.oid, "size": pointer.size, "opset": opset, "accuracy": acc}


def trainable_metadata(onnx_model, model: torch.nn.Module, patterns: list[str] | None) -> dict[str, str]:
    """The fp32 file's record of what on-device training may change (zoo.ondevice)."""
    from zoo.ondevice import TRAINABLE_GLOBS_KEY, TRAINABLE_KEY, trainable_initializers

    params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
    names = trainable_initializers(onnx_model, params, patterns)
    return {TRAINABLE_KEY: json.dumps(names), TRAINABLE_GLOBS_KEY: json.dumps(patterns or ["*"])}


def export_variants(recipe: Recipe, model: torch.nn.Module, converted: torch.nn.Module | None, data: Dataset,
                    out: Path) -> dict[str, dict]:
    split = data.split(recipe.eval_split)
    x, y = split.x.numpy(), split.y.numpy()
    example = data.train.x[:2]
    common = {"zoo.model": recipe.model, "zoo.recipe": recipe.name, "zoo.recipe_sha256": recipe.digest(),
              "zoo.git_commit": export.git_commit()}
    wanted = recipe.export.variants
    opsets = sorted(set(recipe.export.opsets))
    primary = opsets[-1]
    results: dict[str, dict] = {}

    fp32 = export.export_fp32(model, example, out / FILES["fp32"], primary)
    common_fp32 = {**common, **trainable_metadata(onnx.load(str(fp32)), model, recipe.export.trainable)}
    fp32 = export.stamp(fp32, "fp32", common_fp32)
    results["fp32"] = _describe(fp32, primary, accuracy(fp32, x, y))
    reference = predict(fp32, x).argmax(axis=1)
    extra = {}
    for opset in opsets[:-1]:
        path = export.export_fp32(model, example, out / f"model.opset{opset}.onnx", opset)
        path = export.stamp(path, "fp32", {**common, **trainable_metadata(onnx.load(str(path)), model,
                                                                           recipe.export.trainable)})
        info = _describe(path, opset, accuracy(path, x, y))
        info["agreement_with_primary"] = float((predict(path, x).argmax(axis=1) == reference).mean())
        extra[str(opset)] = info
    results["fp32"]["extra_opsets"] = extra

    if "int8-qat" in wanted:
        if converted is None:
            raise ValueError("int8-qat export needs the QAT-converted model")
        path = export.stamp(export.export_int8_qat(converted, example, out / FILES["int8-qat"]), "int8-qat", common, source=fp32)
        results["int8-qat"] = _describe(path, _opset(path), accuracy(path, x, y))
    if "int8-ptq" in wanted:
        q = recipe.quantization
        generator = torch.Generator().manual_seed(recipe.seed)
        order = torch.randperm(len(data.train), generator=generator)
        calib = [data.train.x[order[i * 32:(i + 1) * 32]].numpy() for i in range(q.calibration_batches)]
        path = export.stamp(export.export_int8_ptq(fp32, calib, out / FILES["int8-ptq"], q.ptq_op_types), "int8-ptq", common, source=fp32)
        results["int8-ptq"] = _describe(path, _opset(path), accuracy(path, x, y))
    if "fp16" in wanted:
        path = export.stamp(export.export_fp16(fp32, out / FILES["fp16"]), "fp16", common, source=fp32)
        results["fp16"] = _describe(path, _opset(path), accuracy(path, x, y))

    bound = recipe.quantization.max_accuracy_drop
    for key in ("int8-qat", "int8-ptq"):
        if key in results:
            kernels = kernel_types(out / results[key]["file"])
            results[key]["int8_kernels"] = sorted(kernels & INT8_KERNELS)
            drop = results["fp32"]["accuracy"] - results[key]["accuracy"]
            results[key]["accuracy_drop"] = drop
            results[key]["within_bound"] = drop <= bound + 1e-12
    return results


def _opset(path: Path) -> int:
    return int(export.read_metadata(path)["zoo.opset"])
