"""Federated learning over the zoo's ONNX models on Flower: onnxruntime-training clients, FedAvg server.

The fleet trains the fp32 ONNX file the zoo publishes, without torch: each Flower ClientApp takes local steps on its
shard with onnxruntime-training; the ServerApp averages the updates (sample-weighted FedAvg, Flower's strategy) and
refuses updates made from another base model (sha256) or quantization/precision state. A failed client costs the
round its update, never the global model; the server saves after each round and a restarted run resumes.

Modules: this one (the fleet's data and the state every participant shares), `server` (the global model: the rule,
evaluation, per-round saving and resuming, export), `flower` (the ClientApp, the ServerApp and its strategy) and
`run` (what launchers/federated.py runs: a local Flower deployment with TLS and node authentication).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zoo.data import load_dataset
from zoo.data.shifts import shifted_split
from zoo.export import read_metadata
from zoo.models import model_spec

STATE_KEYS = ("zoo.variant", "zoo.quantization", "zoo.precision.weights", "zoo.precision.activations",
              "zoo.precision.compute")


def model_state(path: Path) -> dict[str, str]:
    """The quantization/precision state every participant must share (from the file's zoo metadata)."""
    meta = read_metadata(path)
    return {k: meta.get(k, "unset") for k in STATE_KEYS}


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


def fleet_data(recipe, split: str):
    """The recipe's dataset split as the fleet sees it (with the recipe's shift, if any)."""
    dataset = fleet_dataset(recipe)
    if recipe.federated.shift:
        return shifted_split(dataset, recipe.federated.shift, split)
    part = load_dataset(dataset).split(split)
    return part.x.numpy(), part.y.numpy()
