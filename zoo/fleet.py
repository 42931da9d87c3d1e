"""The fleet's data, on the side that has the dataset (the launcher, the server, the simulation): the recipe's split
as the fleet sees it, and each SuperNode's shard written as the node's own data file."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from zoo.data import load_dataset
from zoo.data.shifts import shifted_split
from zoo.fsutil import atomic_write_bytes
from zoo.models import model_spec


def client_split(y: np.ndarray, clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Non-IID split: for each class, Dirichlet(alpha) proportions decide how its examples spread over clients."""
    rng = np.random.default_rng(seed)
    shards: list[list[int]] = [[] for _ in range(clients)]
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label))
        cuts = (np.cumsum(rng.dirichlet([alpha] * clients)) * len(idx)).astype(int)[:-1]
        for shard, part in zip(shards, np.split(idx, cuts)):
            shard += part.tolist()
    return [np.sort(np.array(s, dtype=np.int64)) for s in shards]


def fleet_dataset(recipe) -> str:
    return recipe.dataset or model_spec(recipe.model).dataset


def fleet_data(recipe, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The recipe's dataset split as the fleet sees it (with the recipe's shift, if any)."""
    dataset = fleet_dataset(recipe)
    if recipe.federated.shift:
        return shifted_split(dataset, recipe.federated.shift, split)
    part = load_dataset(dataset).split(split)
    return part.x.numpy(), part.y.numpy()


def client_shard(recipe, client: int) -> tuple[np.ndarray, np.ndarray]:
    """Client `client`'s non-IID shard of the training split."""
    x, y = fleet_data(recipe, "train")
    shard = client_split(y, recipe.federated.clients, recipe.federated.dirichlet_alpha, recipe.seed)[client]
    return x[shard], y[shard]


def write_shard(recipe, client: int, path: Path) -> Path:
    """A SuperNode's local data (`x`, `y` in an .npz): what a device of the fleet would hold."""
    x, y = client_shard(recipe, client)
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    atomic_write_bytes(path, buffer.getvalue())
    return path
