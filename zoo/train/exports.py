"""Export every variant a recipe asks for, stamp it, and measure it with onnxruntime.

fp32 and the kinds made by a training phase of their own (int8-qat: zoo.kinds `Kind.training`) come from the trained
torch models, each through its kind's exporter; every other kind the recipe
lists, and the fp32 weights at its other opsets, are made from the exported fp32 file by zoo.variants.make, exactly
as `zoo fetch` makes them when no store has them.
"""

from __future__ import annotations

from pathlib import Path
from pkgutil import resolve_name

import onnx
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from zoo import export, metadata
from zoo.data import Dataset
from zoo.evaluate import INT8_KERNELS, accuracy, kernel_types, predict
from zoo.provenance import source_commit
from zoo.recipes import Recipe
from zoo.pointer import pointer_for
from zoo.run_summary import ExtraOpset, VariantResult
from zoo.kinds import KINDS
from zoo.variants.make import make_file
from zoo.variants.opsets import Origin, opset_file, prediction_agreement, reexport_opset


def _result(path: Path, opset: int, acc: float) -> dict:
    pointer = pointer_for(path)
    return {"file": path.name, "sha256": pointer.oid, "size": pointer.size, "opset": opset, "accuracy": acc}


def export_variants(recipe: Recipe, model: torch.nn.Module, trained: dict[str, torch.nn.Module], data: Dataset,
                    out: Path) -> dict[str, VariantResult]:
    """`model`: the trained fp32 model; `trained`: the torch model of each kind its own training phase made."""
    split = data.split(recipe.eval_split, recipe.eval_examples)
    x, y = split.x.numpy(), split.y.numpy()
    example = data.train.x[:2]
    common = {"zoo.model": recipe.model, "zoo.recipe": recipe.name, "zoo.recipe_sha256": recipe.digest(),
              "zoo.git_commit": source_commit(), **data.onnx_metadata}
    wanted = recipe.export.variants
    opsets = sorted(set(recipe.export.opsets))
    primary = opsets[-1]
    origin = Origin(recipe.model, recipe.name, data.name, recipe.export.trainable)
    results: dict[str, VariantResult] = {}
    others = [key for key in KINDS if key in wanted and key != "fp32"]
    # Exporting and measuring take minutes for a BERT (its QAT graph through the dynamo exporter most): the display
    # says which file is under way. This runs on the one process that exports (rank 0).
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(f"export fp32 (opset {primary})", total=len(opsets) + len(others))

        fp32 = export.export_fp32(model, example, out / KINDS["fp32"].file, primary)
        fp32 = metadata.stamp(fp32, "fp32", {**common, **export.fp32_metadata(onnx.load(str(fp32)), model,
                                                                            recipe.export.trainable)})
        extra = {}
        reference = predict(fp32, x).argmax(axis=1)
        for opset in opsets[:-1]:
            bar.update(task, advance=1, description=f"export fp32 (opset {opset})")
            path = reexport_opset(fp32, opset, out / opset_file(opset), origin, recipe.model_args)
            extra[str(opset)] = ExtraOpset(**_result(path, opset, accuracy(path, x, y)),
                                           agreement_with_primary=prediction_agreement(path, reference, x))
        results["fp32"] = VariantResult(**_result(fp32, primary, accuracy(fp32, x, y)), extra_opsets=extra)

        for key in others:  # the table's order: cards list variants in it
            kind = KINDS[key]
            bar.update(task, advance=1, description=f"export {key}")
            if kind.training:  # the torch model its training phase made, through the kind's exporter
                if key not in trained:
                    raise ValueError(f"{key} export needs its training phase (quantization.scheme: "
                                     f"{kind.training.scheme})")
                path = metadata.stamp(resolve_name(kind.training.exporter)(trained[key], example, out / kind.file), key,
                                      metadata.inherited_metadata(fp32), source=fp32)
            else:
                path = make_file(kind, fp32, out / kind.file, origin, recipe, data)
            results[key] = VariantResult(**_result(path, _opset(path), accuracy(path, x, y)))
        bar.update(task, advance=1, description="exported")

    for key, result in results.items():
        if KINDS[key].int8:
            result.int8_kernels = sorted(kernel_types(out / result.file) & INT8_KERNELS)
            result.accuracy_drop = results["fp32"].accuracy - result.accuracy
            result.within_bound = recipe.quantization.allows(result.accuracy_drop)
    return results


def _opset(path: Path) -> int:
    return int(metadata.read_metadata(path)["zoo.opset"])
