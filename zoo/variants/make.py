"""Making files of a kind from an entry's fp32 file, and measuring them for the card.

`TOOLS` holds one function per `Kind.tool` (zoo.kinds): each writes the bytes of its kind at `target` from the fp32
file, stamped with the fp32 file's provenance, deterministic for a given CPU and library versions. `zoo build`
(after training), `zoo export` (from a fetched fp32 file) and `zoo fetch` (when no store has the file) all call
`make_file`, so they make the same bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import torch

from zoo import metadata, ort_quantize
from zoo.cards import ModelCard, Variant, check_inside
from zoo.config import REPO_ROOT
from zoo.data import Dataset, load_dataset
from zoo.errors import ZooError
from zoo.evaluate import accuracy
from zoo.fleet import fleet_data, fleet_dataset
from zoo.fsutil import atomic_copy
from zoo.models import model_spec
from zoo.ondevice.engine import OnnxTrainer, pack_artifacts, read_split, training_artifacts, unpack_artifacts
from zoo.recipes import Recipe, load_recipe
from zoo.pointer import pointer_for
from zoo.kinds import KINDS, Kind, kind_of
from zoo.variants.opsets import Origin, reexport_opset


def calibration_batches(recipe: Recipe, data: Dataset) -> list[np.ndarray]:
    """The PTQ calibration set: `quantization.calibration_batches` seeded batches of 32 from the training split."""
    generator = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(data.train), generator=generator)
    q = recipe.quantization
    return [data.train.x[order[i * 32:(i + 1) * 32]].numpy() for i in range(q.calibration_batches)]


def _quantize_static(fp32: Path, target: Path, recipe: Recipe | None, data: Dataset | None, origin: Origin) -> Path:
    # Only calibration needs the recipe and the data: the caller's when it has them loaded, else the origin's.
    recipe = recipe or load_recipe(origin.recipe, model=origin.architecture)
    data = data or load_dataset(origin.dataset)
    return ort_quantize.export_int8_ptq(fp32, calibration_batches(recipe, data), target, recipe.quantization.ptq_op_types)


def _quantize_dynamic(fp32: Path, target: Path, recipe: Recipe | None, data: Dataset | None, origin: Origin) -> Path:
    return ort_quantize.export_int8_dynamic(fp32, target, transformer=model_spec(origin.architecture).transformer)


def _float16(fp32: Path, target: Path, recipe: Recipe | None, data: Dataset | None, origin: Origin) -> Path:
    return ort_quantize.export_fp16(fp32, target)


def _ort_training(fp32: Path, target: Path, recipe: Recipe | None, data: Dataset | None, origin: Origin) -> Path:
    with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
        training_artifacts(fp32, Path(tmp) / "artifacts", trainable_globs=origin.trainable)
        return pack_artifacts(Path(tmp) / "artifacts", target)


# Kind.tool -> the function that makes that kind's bytes from the fp32 file.
TOOLS: dict[str, Callable[[Path, Path, Recipe | None, Dataset | None, Origin], Path]] = {
    "quantize_static": _quantize_static, "quantize_dynamic": _quantize_dynamic, "float16": _float16,
    "ort_training": _ort_training,
}


def make_file(kind: Kind, fp32: Path, target: Path, origin: Origin, recipe: Recipe | None = None,
              data: Dataset | None = None) -> Path:
    """The file of `kind` made from `fp32` at `target`; ONNX files are stamped with the fp32 file's provenance.
    `recipe`/`data`: already loaded ones (the trainer's), else the origin's. Bytes only: measuring is the caller's."""
    if kind.made != "from-fp32":
        raise ZooError(f"'{kind.key}' is not made from the fp32 file: {kind.summary}")
    target.parent.mkdir(parents=True, exist_ok=True)
    inherited = metadata.inherited_metadata(fp32)
    path = TOOLS[kind.tool](fp32, target, recipe, data, origin)
    return metadata.stamp(path, kind.key, inherited, source=fp32) if kind.format == "onnx" else path


def derive(key: str, variant: Variant, fp32: Path, target: Path, origin: Origin, opset: int | None = None) -> Path:
    """Any file `zoo fetch` and `zoo validate` make from fp32: the card's variant `key`, or with `opset` the fp32
    weights at that opset."""
    if opset is not None:
        return reexport_opset(fp32, opset, target, origin)
    return make_file(kind_of(key, variant), fp32, target, origin)


def evaluation_data(card: ModelCard, variant: Variant, split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """The data a variant's metrics are measured on: the card's dataset, or its retraining recipe's data."""
    if variant.recipe is not None:
        return fleet_data(_retraining_recipe(variant.recipe, card.dataset.name), split)
    part = load_dataset(card.dataset.name).split(split)
    return part.x.numpy(), part.y.numpy()


@contextmanager
def inference_model(path: Path, kind: Kind) -> Iterator[Path]:
    """The ONNX file a variant predicts with: itself, or for training artifacts the inference model they export
    before any training step."""
    if kind.reference != "artifacts":
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
        folder = unpack_artifacts(path, Path(tmp) / "artifacts")
        yield OnnxTrainer(folder, lr=0.0).export(Path(tmp) / "untouched.onnx")


def spec_for(name: str, key: str, variants: dict) -> dict:
    """A variant's card fields to make it with: the card's declaration, or the kind's defaults (`zoo export` adds a
    kind the card does not declare yet)."""
    if key in variants:
        return variants[key]
    if key not in KINDS or KINDS[key].made != "from-fp32":
        addable = [k for k, kind in KINDS.items() if kind.made == "from-fp32"]
        raise ZooError(f"'{name}' has no variant '{key}': declare it on its card (`recipe: <federated recipe>` for "
                       f"retraining), or export one of: {', '.join(addable)}")
    return {k: v for k, v in KINDS[key].card_fields(0).items() if k != "opset"}


def make_variant(key: str, spec: dict, fp32: Path, entry_dir: Path, origin: Origin, log=print,
                 env: dict | None = None) -> dict:
    """Make variant `key` from `fp32` into the entry folder; returns its card fields, measured. `env`: for the
    processes a retraining starts (federated server and clients)."""
    kind = kind_of(key, spec)
    target = check_inside(entry_dir, spec.get("file") or kind.file, f"{entry_dir / 'card.yaml'}: variants.{key}.file")
    spec = {k: v for k, v in spec.items() if k not in ("sha256", "size", "metrics")}  # measured again below
    if kind.made == "retraining":
        log(f"[{entry_dir.name}] {key}: {kind.summary} (recipe {spec['recipe']})")
        measured = _retrain(fp32, target, spec["recipe"], origin.dataset, env)
    elif kind.made == "from-fp32":
        log(f"[{entry_dir.name}] {key}: {kind.summary}")
        make_file(kind, fp32, target, origin)
        measured = _measure(kind, target, fp32, origin)
    else:
        raise ZooError(f"variant '{key}' is trained with the entry's recipe, not made from fp32: "
                       f"`zoo build {entry_dir.name}`")
    pointer = pointer_for(target)
    return {**kind.card_fields(measured["opset"]), **spec, **measured, "sha256": pointer.oid, "size": pointer.size}


def _measure(kind: Kind, path: Path, fp32: Path, origin: Origin) -> dict:
    """Card fields of a file made from fp32: accuracy on the test split (of the inference model the artifacts
    export, for ort-training, with the trainable split's parameter counts)."""
    test = load_dataset(origin.dataset).test
    with inference_model(path, kind) as model:
        metrics = {"accuracy": accuracy(model, test.x.numpy(), test.y.numpy())}
    if kind.reference != "artifacts":
        return {"opset": int(metadata.read_metadata(path)["zoo.opset"]), "tolerance": kind.tolerance, "metrics": metrics}
    with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
        folder = unpack_artifacts(path, Path(tmp) / "artifacts")
        split = read_split(folder)
        opset = next(o.version for o in onnx.load(str(folder / "training_model.onnx")).opset_import
                     if o.domain in ("", "ai.onnx"))
    sizes = {i.name: int(np.prod(i.dims)) for i in onnx.load(str(fp32)).graph.initializer}
    metrics["trainable_parameters"] = float(sum(sizes[n] for n in split["trainable"]))
    metrics["frozen_parameters"] = float(sum(sizes[n] for n in split["frozen"]))
    return {"opset": opset, "tolerance": kind.tolerance, "metrics": metrics}


def _retraining_recipe(name: str, dataset: str) -> Recipe:
    recipe = load_recipe(name)
    if recipe.federated is None:
        raise ZooError(f"recipe '{name}' has no federated section: a retraining variant names a federated recipe")
    if fleet_dataset(recipe) != dataset:
        raise ZooError(f"recipe '{name}' trains on {fleet_dataset(recipe)}, the entry's dataset is {dataset}")
    return recipe


def _retrain(fp32: Path, target: Path, recipe_name: str, dataset: str, env: dict | None) -> dict:
    """A federated run (real server and client processes) from the fp32 file."""
    _retraining_recipe(recipe_name, dataset)
    with tempfile.TemporaryDirectory(prefix="zoo-federated-") as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, str(REPO_ROOT / "launchers" / "federated.py"), "run", "--recipe", recipe_name,
                   "--onnx", str(fp32), "--output-dir", str(out)]
        if subprocess.run(command, cwd=REPO_ROOT, env=env).returncode != 0:
            raise ZooError(f"federated run for recipe '{recipe_name}' failed (its output is above)")
        summary = json.loads((out / "federated.json").read_text())
        atomic_copy(out / summary["variant"]["file"], target)
    return {"opset": int(metadata.read_metadata(target)["zoo.opset"]), "tolerance": KINDS["federated"].tolerance,
            "metrics": {"accuracy": summary["rounds"][-1]["accuracy"], "initial_accuracy": summary["initial_accuracy"],
                        "central_accuracy": summary["central_accuracy"], "rounds": float(len(summary["rounds"]))}}
