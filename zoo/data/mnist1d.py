"""MNIST-1D (Greydanus 2020), generated offline with the `mnist1d` package's own generator."""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from zoo.data.base import Dataset, Split, cached_arrays, package_version, register_dataset, require

ARGS = ("num_samples", "train_split", "seed")  # the generator's arguments the provenance names, cached with the arrays


def _generate() -> dict:
    """The paper's defaults (5,000 samples, the standard 4000/1000 train/test split, seed 42) through the package's
    own generator; the `mnist1d` package (about a second to import) is imported only here, once per data cache. The
    arguments ride along, so the provenance below needs no import either."""
    data = require("mnist1d.data", "mnist1d")
    args = data.get_dataset_args()
    made = data.make_dataset(args)  # get_dataset() would try a download first
    return {**{k: made[k] for k in ("x", "y", "x_test", "y_test")},
            **{f"args_{k}": np.array(getattr(args, k)) for k in ARGS}}


@register_dataset("mnist1d")
@cache
def load() -> Dataset:
    raw = cached_arrays("mnist1d", f"{package_version('mnist1d')}-defaults", _generate)
    args = {k: raw[f"args_{k}"].item() for k in ARGS}
    x_train, y_train = raw["x"].astype(np.float32), raw["y"].astype(np.int64)
    x_test, y_test = raw["x_test"].astype(np.float32), raw["y_test"].astype(np.int64)
    # Validation: the last 500 of the 4000 training samples (the generator's order is fixed by its seed).
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return Dataset(
        name="mnist1d",
        train=Split(t(x_train[:3500, None, :]), t(y_train[:3500])),
        val=Split(t(x_train[3500:, None, :]), t(y_train[3500:])),
        test=Split(t(x_test[:, None, :]), t(y_test)),
        labels=[str(i) for i in range(10)],
        source=f"mnist1d mnist1d.utils make_dataset(get_dataset_args()) "
               f"(num_samples={args['num_samples']}, train_split={args['train_split']}, seed={args['seed']})",
        license="Apache-2.0 (mnist1d)",
        preprocessing=["generator output used as is (already standardized by make_dataset)",
                       "shape [batch, 1, 40]", "train 3500 / val 500 (last 500 of the standard 4000) / test 1000"],
        usage='''from mnist1d.data import get_dataset_args, make_dataset

signals = make_dataset(get_dataset_args())["x_test"][:4]  # the generator's standardized 40-point signals
x = signals.astype(np.float32)[:, None, :]  # [batch, 1, 40]''',
    )
