"""scikit-learn's bundled digits: 1,797 real 8x8 grey-scale handwritten digits (UCI), no download."""

from __future__ import annotations

from functools import cache

import numpy as np

from zoo.data.base import Dataset, Split, cached_arrays, package_version, register_dataset, require

SEED = 0


def _split() -> dict:
    """The arrays, split: scikit-learn is imported only here (about a second per process), once per data cache."""
    datasets = require("sklearn.datasets", "scikit-learn")
    model_selection = require("sklearn.model_selection", "scikit-learn")
    bunch = datasets.load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]  # [N, 1, 8, 8] in [0, 1]
    y = bunch.target.astype(np.int64)
    # Stratified 70/10/20 split, fixed seed.
    x_trval, x_test, y_trval, y_test = model_selection.train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
    x_train, x_val, y_train, y_val = model_selection.train_test_split(
        x_trval, y_trval, test_size=0.125, random_state=SEED, stratify=y_trval)
    return {"train_x": x_train, "train_y": y_train, "val_x": x_val, "val_y": y_val, "test_x": x_test, "test_y": y_test}


@register_dataset("digits")
@cache
def load() -> Dataset:
    # Cached by the version of the package that ships the images and splits them, and the split's seed.
    arrays = cached_arrays("digits", f"sklearn{package_version('scikit-learn')}-seed{SEED}", _split)
    return Dataset(
        name="digits",
        train=Split.from_arrays(arrays, "train"), val=Split.from_arrays(arrays, "val"),
        test=Split.from_arrays(arrays, "test"),
        labels=[str(i) for i in range(10)],
        source="scikit-learn sklearn.datasets.load_digits (UCI ML hand-written digits, test set of Alpaydin & Kaynak 1998)",
        license="CC BY 4.0 (UCI Machine Learning Repository)",
        preprocessing=["pixel values 0..16 divided by 16.0 -> float32 in [0, 1]", "shape [batch, 1, 8, 8]",
                       f"stratified split 70/10/20 (train/val/test), sklearn train_test_split random_state={SEED}"],
        usage='''from sklearn.datasets import load_digits

images = load_digits().images[:4]  # 8x8 grey levels 0..16 (use your own the same way)
x = (images.astype(np.float32) / 16.0)[:, None, :, :]  # [batch, 1, 8, 8] in [0, 1]''',
    )
