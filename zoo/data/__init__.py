"""Offline datasets with deterministic splits: `load_dataset(name) -> Dataset` (train / val / test tensors)."""

from __future__ import annotations

import difflib

from zoo.data import digits, langid, mnist1d  # noqa: F401  (each registers its dataset)
from zoo.data.base import _LOADERS, Dataset, Split
from zoo.errors import ZooError

__all__ = ["Dataset", "Split", "dataset_names", "load_dataset"]


def dataset_names() -> list[str]:
    """Every dataset's name, sorted."""
    return sorted(_LOADERS)


def load_dataset(name: str) -> Dataset:
    if name not in _LOADERS:
        close = difflib.get_close_matches(name, list(_LOADERS), n=2)
        raise ZooError(f"unknown dataset '{name}'" + (f"; did you mean: {', '.join(close)}?" if close else
                                                       f"; known datasets: {', '.join(dataset_names())}"))
    return _LOADERS[name]()
