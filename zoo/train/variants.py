"""Export every variant a recipe asks for, stamp it, and measure it with onnxruntime.

Only fp32 and int8-qat come from the trained torch models; every other file (other opsets, int8-ptq, fp16) is made
from the exported fp32 file by `zoo.derived`, exactly as `zoo fetch` makes it when no store has it.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

from zoo import derived, export
from zoo.data import Dataset
from zoo.evaluate import INT8_KERNELS, accuracy, kernel_types, predict
from zoo.provenance import source_commit
from zoo.recipes import Recipe
from zoo.store.pointer import pointer_for

FILES = {"fp32": "model.onnx", "int8-qat": "model.int8-qat.onnx", "int8-ptq": "model.int8-ptq.onnx",
         "fp16": "model.fp16.onnx"}


def opset_file(opset: int) -> str:
    return f"model.opset{opset}.onnx"


def _describe(path: Path, opset: int, acc: float) -> dict:
    pointer = pointer_for(path)
    return {"file": path.name, "sha256": pointer.oid, "size": pointer.size, "opset": opset, "accuracy": acc}


def export_variants(recipe: Recipe, model: torch.nn.Module, converted: torch.nn.Module | None, data: Dataset,
                    out: Path) -> dict[str, dict]:
    split = data.split(recipe.eval_split)
    x, y = split.x.numpy(), split.y.numpy()
    example = data.train.x[:2]
    common = {"zoo.model": recipe.model, "zoo.recipe": recipe.name, "zoo.recipe_sha256": recipe.digest(),
              "zoo.git_commit": source_commit()}
    wanted = recipe.export.variants
    opsets = sorted(set(recipe.export.opsets))
    primary = opsets[-1]
    origin = derived.Origin(recipe.model, recipe.name, data.name, recipe.export.trainable)
    results: dict[str, dict] = {}

    fp32 = export.export_fp32(model, example, out / FILES["fp32"], primary)
    fp32 = export.stamp(fp32, "fp32", {**common, **derived.fp32_metadata(onnx.load(str(fp32)), model,
                                                                          recipe.export.trainable)})
    results["fp32"] = _describe(fp32, primary, accuracy(fp32, x, y))
    reference = predict(fp32, x).argmax(axis=1)
    extra = {}
    for opset in opsets[:-1]:
        path = derived.reexport_opset(fp32, opset, out / opset_file(opset), origin, recipe.model_args)
        info = _describe(path, opset, accuracy(path, x, y))
        info["agreement_with_primary"] = derived.prediction_agreement(path, reference, x)
        extra[str(opset)] = info
    results["fp32"]["extra_opsets"] = extra

    if "int8-qat" in wanted:
        if converted is None:
            raise ValueError("int8-qat export needs the QAT-converted model")
        path = export.stamp(export.export_int8_qat(converted, example, out / FILES["int8-qat"]), "int8-qat",
                            export.inherited_metadata(fp32), source=fp32)
        results["int8-qat"] = _describe(path, _opset(path), accuracy(path, x, y))
    for key in ("int8-ptq", "fp16"):
        if key in wanted:
            path = derived.derive_file(key, fp32, out / FILES[key], origin, recipe, data)
            results[key] = _describe(path, _opset(path), accuracy(path, x, y))

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
