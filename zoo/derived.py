"""Variants made from an entry's built fp32 file without PyTorch, the way a device or a fleet would make them.

- `format: ort-training`: onnxruntime-training artifacts (training, eval and optimizer models, checkpoint) for the
  card's trainable split, packed in one deterministic zip. Measured: the inference model exported from the
  untouched artifacts must score what fp32 scores.
- `recipe: <federated recipe>`: the fp32 weights retrained by a federated run (`launchers/federated.py run`, real
  server and client processes); measured on that recipe's evaluation data (e.g. the rotated digits it adapts to).

`zoo build` makes every derived variant its card declares after training; `zoo export NAME --variant KEY` remakes one
from the fetched fp32 file without retraining.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx

from zoo.cards import ModelCard, Variant
from zoo.config import REPO_ROOT
from zoo.errors import ZooError

# A variant key `zoo export` can add to a card that does not declare it yet.
DEFAULT_SPECS = {"ort-training": {"file": "model.ort-training.zip", "precision": "fp32", "quantization": "none",
                                  "format": "ort-training"}}
ORT_TRAINING_TOLERANCE = 0.001  # the fp32 weights themselves: they score what fp32 scores
FEDERATED_TOLERANCE = 0.02  # a federated run re-made elsewhere: other CPU kernels, same rounds and shards


def is_derived(spec: dict) -> bool:
    return spec.get("format", "onnx") != "onnx" or spec.get("recipe") is not None


def evaluation_data(card: ModelCard, variant: Variant, split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """The data a variant's metrics are measured on: the card's dataset, or its retraining recipe's data."""
    if variant.recipe is not None:
        from zoo.federated import fleet_data

        return fleet_data(_federated_recipe(variant.recipe, card.dataset.name), split)
    from zoo.data import load_dataset

    part = load_dataset(card.dataset.name).split(split)
    return part.x.numpy(), part.y.numpy()


@contextmanager
def inference_model(path: Path, variant: Variant):
    """The ONNX file a variant predicts with: itself, or for training artifacts the inference model they export
    before any training step."""
    if variant.format != "ort-training":
        yield Path(path)
        return
    from zoo.ondevice import OnnxTrainer, unpack_artifacts

    with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
        folder = unpack_artifacts(path, Path(tmp) / "artifacts")
        yield OnnxTrainer(folder, lr=0.0).export(Path(tmp) / "untouched.onnx")


def make_derived(key: str, spec: dict, fp32: Path, entry_dir: Path, trainable: list[str] | None, dataset: str,
                 log=print, env: dict | None = None) -> dict:
    """Make variant `key` from `fp32` into the entry folder; returns its card fields, measured. `env`: for the
    processes it starts (federated server and clients)."""
    target = entry_dir / spec["file"]
    spec = {k: v for k, v in spec.items() if k not in ("sha256", "size", "metrics")}  # measured again below
    if spec.get("format", "onnx") == "ort-training":
        log(f"[{entry_dir.name}] {key}: onnxruntime-training artifacts from {fp32.name} (trainable {trainable or ['*']})")
        measured = _ort_training(fp32, target, trainable, dataset)
    elif spec.get("recipe"):
        log(f"[{entry_dir.name}] {key}: federated retraining with recipe {spec['recipe']}")
        measured = _federated(fp32, target, spec["recipe"], dataset, env)
    else:
        raise ZooError(f"variant '{key}' is trained with the entry's recipe, not derived: `zoo build {entry_dir.name}`")
    from zoo.store.pointer import pointer_for

    pointer = pointer_for(target)
    return {**spec, **measured, "sha256": pointer.oid, "size": pointer.size}


def _ort_training(fp32: Path, target: Path, trainable: list[str] | None, dataset: str) -> dict:
    from zoo.data import load_dataset
    from zoo.evaluate import accuracy
    from zoo.ondevice import OnnxTrainer, pack_artifacts, read_split, training_artifacts

    with tempfile.TemporaryDirectory(prefix="zoo-artifacts-") as tmp:
        folder = Path(tmp) / "artifacts"
        training_artifacts(fp32, folder, trainable_globs=trainable)
        pack_artifacts(folder, target)
        split = read_split(folder)
        untouched = OnnxTrainer(folder, lr=0.0).export(Path(tmp) / "untouched.onnx")
        test = load_dataset(dataset).test
        measured = accuracy(untouched, test.x.numpy(), test.y.numpy())
        opset = next(o.version for o in onnx.load(str(folder / "training_model.onnx")).opset_import if o.domain in ("", "ai.onnx"))
    sizes = {i.name: int(np.prod(i.dims)) for i in onnx.load(str(fp32)).graph.initializer}
    return {"opset": opset, "tolerance": ORT_TRAINING_TOLERANCE, "metrics": {"accuracy": measured,
                                        "trainable_parameters": float(sum(sizes[n] for n in split["trainable"])),
                                        "frozen_parameters": float(sum(sizes[n] for n in split["frozen"]))}}


def _federated_recipe(name: str, dataset: str):
    from zoo.federated import fleet_dataset
    from zoo.recipes import load_recipe

    recipe = load_recipe(name)
    if recipe.federated is None:
        raise ZooError(f"recipe '{name}' has no federated section: a retraining variant names a federated recipe")
    if fleet_dataset(recipe) != dataset:
        raise ZooError(f"recipe '{name}' trains on {fleet_dataset(recipe)}, the entry's dataset is {dataset}")
    return recipe


def _federated(fp32: Path, target: Path, recipe_name: str, dataset: str, env: dict | None) -> dict:
    from zoo.export import read_metadata
    from zoo.store.cache import atomic_copy

    _federated_recipe(recipe_name, dataset)
    with tempfile.TemporaryDirectory(prefix="zoo-federated-") as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, str(REPO_ROOT / "launchers" / "federated.py"), "run", "--recipe", recipe_name,
                   "--onnx", str(fp32), "--output-dir", str(out)]
        if subprocess.run(command, cwd=REPO_ROOT, env=env).returncode != 0:
            raise ZooError(f"federated run for recipe '{recipe_name}' failed (its output is above)")
        summary = json.loads((out / "federated.json").read_text())
        atomic_copy(out / summary["variant"]["file"], target)
    return {"opset": int(read_metadata(target)["zoo.opset"]), "tolerance": FEDERATED_TOLERANCE,
            "metrics": {"accuracy": summary["rounds"][-1]["accuracy"], "initial_accuracy": summary["initial_accuracy"],
                        "central_accuracy": summary["central_accuracy"], "rounds": float(len(summary["rounds"]))}}
