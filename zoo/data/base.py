"""What every dataset is: train / val / test tensors with provenance, registered by name (`@register_dataset`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import importlib
import importlib.metadata
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

from zoo.config import data_dir
from zoo.errors import ZooError
from zoo.fsutil import atomic_folder


@dataclass
class Split:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    @classmethod
    def from_arrays(cls, arrays: dict, name: str) -> "Split":
        """The split `name` of cached arrays stored as `<name>_x` / `<name>_y` (cached_arrays)."""
        return cls(torch.from_numpy(arrays[f"{name}_x"]), torch.from_numpy(arrays[f"{name}_y"]))


@dataclass
class Dataset:
    name: str
    train: Split
    val: Split
    test: Split
    labels: list[str]
    source: str  # provenance
    license: str
    preprocessing: list[str] = field(default_factory=list)
    # Python that turns raw examples into the model's input array `x` (numpy imported as np), exactly as the data
    # above was prepared: the docs' "Use it" section runs it before onnxruntime, and a test executes that section.
    usage: str = ""
    # Further test sets out of the training domain ({name: split}), measured by benchmarks/baselines.py.
    test_sets: dict[str, Split] = field(default_factory=dict)
    # Metadata every ONNX file of a model trained on this dataset carries (e.g. zoo.tokenizer for text).
    onnx_metadata: dict[str, str] = field(default_factory=dict)
    # Model arguments the data fixes (e.g. a text dataset's vocabulary size); a recipe's model_args come on top.
    model_args: dict = field(default_factory=dict)
    # Token sequences padded at the end with this id, which the models mask out (text); None: fixed-shape inputs.
    # A recipe's group_by_length cuts each training batch to its longest sequence (`cut_padding`).
    padding_id: int | None = None

    @property
    def input_shape(self) -> list[int]:
        return list(self.train.x.shape[1:])

    def split(self, name: str, examples: int | None = None) -> Split:
        """The split `name`; with `examples`, that many of its examples at evenly spaced positions (splits are stored
        in label order, so a prefix could hold one label only)."""
        if name not in ("train", "val", "test"):
            raise ZooError(f"unknown split '{name}'; use train, val or test")
        split = getattr(self, name)
        if examples is None or examples >= len(split):
            return split
        picked = torch.linspace(0, len(split) - 1, examples).round().long()
        return Split(split.x[picked], split.y[picked])

    def class_balance(self) -> dict[str, int]:
        counts = torch.bincount(self.train.y, minlength=len(self.labels)).tolist()
        return dict(zip(self.labels, counts))


def sequence_lengths(x: torch.Tensor, padding_id: int) -> torch.Tensor:
    """Each row's length up to its last token that is not padding."""
    real = x != padding_id
    return torch.where(real.any(dim=1), x.shape[1] - real.flip(1).int().argmax(dim=1), 0)


def cut_padding(x: torch.Tensor, padding_id: int) -> torch.Tensor:
    """The batch without the padding columns every row ends with (at least one column)."""
    return x[:, :max(1, int(sequence_lengths(x, padding_id).max()))]


_LOADERS: dict[str, Callable[[], Dataset]] = {}


def register_dataset(name: str):
    def decorate(loader: Callable[[], Dataset]):
        _LOADERS[name] = loader
        return loader

    return decorate


def _missing(package: str) -> ZooError:
    return ZooError(f"this dataset needs the '{package}' package: run `make setup` or `pip install {package}`")


def require(module: str, package: str):
    """Import a dataset's source package, or fail naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise _missing(package) from None


def package_version(package: str) -> str:
    """The installed version of a dataset's source package (part of its cache key), without importing it."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(package) from None


def made_once(path: Path, write: Callable[[], None]) -> bool:
    """Run `write` (which writes `path` atomically) unless `path` exists; True when this call wrote it. Once it exists
    it is read without a lock (a prepared, read-only cache needs none); processes that want it at once wait on one lock
    and the first writes it. The data cache's one pattern for what is built once (cached_arrays, langid's texts)."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        if path.exists():
            return False
        write()
        return True


def cached_arrays(name: str, version: str, build: Callable[[], dict]) -> dict:
    """Arrays built once and kept under the data cache (zoo.config.data_dir), so every rank and every later run reuses
    them. Processes that want the same arrays at once (the ranks of one torchrun) wait on a file lock for the first to
    build them, so all of them train on the same arrays.

    Stored as one uncompressed .npy file per array in a folder written atomically, and read memory-mapped
    (copy-on-write): a process opens the language-ID arrays (370 MB) at once instead of reading them (0.7-1.4 s
    from an .npz), and the ranks of one machine share one copy of them in the page cache instead of each holding its own."""
    folder = data_dir() / f"{name}-{version}"

    def write() -> None:
        legacy = folder.with_name(f"{folder.name}.npz")  # the single-file cache of zoo before 2026-12-06
        if legacy.is_file():
            with np.load(legacy) as stored:
                arrays = {k: stored[k] for k in stored.files}
        else:
            arrays = build()
        with atomic_folder(folder) as tmp:
            for key, array in arrays.items():
                np.save(tmp / f"{key}.npy", np.ascontiguousarray(array), allow_pickle=False)
        legacy.unlink(missing_ok=True)

    made_once(folder, write)
    return {path.stem: np.load(path, mmap_mode="c", allow_pickle=False) for path in sorted(folder.glob("*.npy"))}
