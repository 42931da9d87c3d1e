"""The fp32 weights at other opsets: exported again through the family's torch definition (never
onnx.version_converter, which fails for most opset pairs), and the range of opsets that works for an entry."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from zoo import export, metadata
from zoo.cards import ModelCard
from zoo.data import load_dataset
from zoo.errors import IntegrityError, ZooError
from zoo.evaluate import predict
from zoo.metrics import label_accuracy
from zoo.models import model_for
from zoo.ondevice.trainable import TRAINABLE_GLOBS_KEY
from zoo.recipes import load_recipe

# The lowest and highest opsets probed when `zoo build` measures which opsets a family exports correctly.
OPSET_PROBE = (7, 20)
AGREEMENT = 0.999  # another opset of the same weights must predict fp32's labels (rounding may flip a near-tie)


def opset_file(opset: int) -> str:
    return f"model.opset{opset}.onnx"


@dataclass(frozen=True)
class Origin:
    """What a file made from the fp32 file needs besides it: the entry's model, recipe, data and on-device split."""

    architecture: str
    recipe: str
    dataset: str
    trainable: list[str] | None = None

    @classmethod
    def of(cls, card: ModelCard) -> "Origin":
        if not card.training.recipe:
            raise ZooError(f"'{card.name}' names no recipe: its derived variants cannot be made here")
        return cls(card.architecture, card.training.recipe, card.dataset.name, card.trainable)


def torch_module(fp32: Path, origin: Origin, model_args: dict | None = None):
    """The fp32 file's weights in the family's PyTorch module (mapped by name), in eval mode."""
    if model_args is None:
        model_args = load_recipe(origin.recipe, model=origin.architecture).model_args
    data = load_dataset(origin.dataset)
    return export.load_onnx_weights(fp32, model_for(origin.architecture, data, **model_args)).eval()


def reexport_opset(fp32: Path, opset: int, target: Path, origin: Origin, model_args: dict | None = None) -> Path:
    """The fp32 weights exported again at `opset` through the family's torch definition."""
    data = load_dataset(origin.dataset)
    model = torch_module(fp32, origin, model_args)
    globs = json.loads(metadata.read_metadata(fp32).get(TRAINABLE_GLOBS_KEY, '["*"]'))
    path = export.export_fp32(model, data.train.x[:2], target, opset)
    fp32_keys = export.fp32_metadata(onnx.load(str(path)), model, None if globs == ["*"] else globs)
    return metadata.stamp(path, "fp32", {**metadata.inherited_metadata(fp32), **fp32_keys})


def reexport_checked(fp32: Path, opset: int, target: Path, origin: Origin, label: str) -> tuple[Path, float, int]:
    """The fp32 weights at an opset the card does not list, served only if they predict fp32's labels on the entry's
    test set: (file, agreement, examples), or an IntegrityError (the caller caches nothing)."""
    made = reexport_opset(fp32, opset, target, origin)
    x = load_dataset(origin.dataset).test.x.numpy()
    agreement = prediction_agreement(made, predict(fp32, x).argmax(1), x)
    if agreement < AGREEMENT:
        raise IntegrityError(f"{label}: re-exported weights predict fp32's label on only {agreement:.2%} of the "
                             f"{len(x)} test examples (needs {AGREEMENT:.1%}); nothing was cached")
    return made, agreement, len(x)


def prediction_agreement(candidate: Path, reference: np.ndarray, x: np.ndarray) -> float:
    """Share of examples on which `candidate` predicts the `reference` labels (fp32's)."""
    return label_accuracy(predict(candidate, x), reference)


def opset_range(fp32: Path, origin: Origin, primary: int, model_args: dict | None = None,
                examples: int = 256) -> tuple[int, int]:
    """The contiguous opsets around `primary` at which the family exports these weights with fp32's predictions
    (measured on the first `examples` test examples): what `zoo fetch --opset N` can serve."""
    x = load_dataset(origin.dataset).test.x[:examples].numpy()
    reference = predict(fp32, x).argmax(1)
    works = {}
    with tempfile.TemporaryDirectory(prefix="zoo-opsets-") as tmp:
        def ok(opset: int) -> bool:
            if opset not in works:
                try:
                    path = reexport_opset(fp32, opset, Path(tmp) / f"opset{opset}.onnx", origin, model_args)
                    works[opset] = prediction_agreement(path, reference, x) >= AGREEMENT
                except Exception:  # noqa: BLE001 - an op the exporter or runtime lacks at that opset
                    works[opset] = False
            return works[opset]

        low = primary
        while low - 1 >= OPSET_PROBE[0] and ok(low - 1):
            low -= 1
        high = primary
        while high + 1 <= OPSET_PROBE[1] and ok(high + 1):
            high += 1
    return low, high
