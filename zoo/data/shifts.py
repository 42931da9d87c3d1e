"""Distribution shifts of a dataset: the same classes seen differently (a real domain shift for on-device and
federated training), and a user's own data as one .npz file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from zoo.data import Dataset, Split, load_dataset
from zoo.errors import ZooError

SHIFTS = {
    # Distribution shifts for image datasets: the same classes seen differently (a real domain shift).
    "rot90": lambda x: np.rot90(x, k=1, axes=(-2, -1)),
    "flip": lambda x: x[..., ::-1],
    "invert": lambda x: x.max() - x,
}


def _pixel_shifts(x: torch.Tensor) -> torch.Tensor:
    """The images and their 8 translations by one pixel (zeros shifted in), in that order."""
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    h, w = x.shape[-2:]
    return torch.cat([x] + [padded[..., 1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
                            for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)])


# Training-split augmentations a recipe can ask for (recipe `augment`): name -> (inputs -> inputs + copies).
AUGMENTATIONS = {"pixel-shifts": _pixel_shifts}


def augmented(data: Dataset, names: list[str]) -> Dataset:
    """`data` with its training split extended by each augmentation in turn (the originals stay first, so the
    calibration and example rows the exporters take are unchanged); val and test untouched."""
    train = data.train
    for name in names:
        if train.x.ndim != 4:
            raise ZooError(f"augmentation '{name}' applies to image datasets; {data.name} inputs have shape "
                           f"{list(train.x.shape[1:])}")
        x = AUGMENTATIONS[name](train.x)
        train = Split(x, train.y.repeat(len(x) // len(train.y)))
    return replace(data, train=train)


def shifted_split(dataset: str, shift: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    if shift not in SHIFTS:
        raise ZooError(f"unknown shift '{shift}'; known: {', '.join(SHIFTS)}")
    part = load_dataset(dataset).split(split)
    x = part.x.numpy()
    if x.ndim != 4:
        raise ZooError(f"shift '{shift}' applies to image datasets; {dataset} inputs have shape {list(x.shape[1:])}")
    return np.ascontiguousarray(SHIFTS[shift](x), dtype=np.float32), part.y.numpy()


def load_npz(path: Path) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A user's data: x_train, y_train, x_test, y_test arrays in one .npz file."""
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, ValueError) as exc:
        raise ZooError(f"{path}: not a readable .npz file ({exc})") from None
    except KeyError as exc:
        raise ZooError(f"{path}: missing array {exc}; expected x_train, y_train, x_test, y_test") from None
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])
