"""The fleet's client: a Flower ClientApp that trains the fp32 ONNX file its node holds with onnxruntime-training.

What a device needs and nothing more — numpy, onnx, onnxruntime-training, flwr, and the zoo's recipe schema: no torch
(zoo.ondevice.engine loads onnxruntime-training's api without its torch-importing package `__init__`). A SuperNode's
node config names its copy of the fp32 file (`base-onnx`), its shard of the data (`data`: an .npz with `x` and `y`,
what the device holds) and `partition-id`; virtual SuperNodes of the simulation runtime have no data file, and their
shard is computed from the recipe's dataset (zoo.fleet, which does use torch).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from zoo import faults
from zoo.config import zoo_home
from zoo.errors import ZooError
from zoo.metadata import read_metadata
from zoo.ondevice.engine import OnnxTrainer, quiet_onnxruntime, training_artifacts
from zoo.recipes import Recipe, load_recipe
from zoo.pointer import sha256_file

# The quantization/precision state every participant must share: these keys of the zoo's ONNX metadata.
STATE_KEYS = ("zoo.variant", "zoo.quantization", "zoo.precision.weights", "zoo.precision.activations",
              "zoo.precision.compute")

client_app = ClientApp()


def model_state(path: Path) -> dict[str, str]:
    """The quantization/precision state of an ONNX file (from its zoo metadata)."""
    meta = read_metadata(path)
    return {k: meta.get(k, "unset") for k in STATE_KEYS}


def recipe_of(run_config) -> Recipe:
    recipe = load_recipe(str(run_config["recipe"]), json.loads(str(run_config.get("overrides", "[]"))))
    if recipe.federated is None:
        raise ZooError(f"recipe '{recipe.name}' has no federated section (see recipes/federated-digits.yaml)")
    return recipe


def local_update(recipe: Recipe, client: int, round_number: int, base: Path, params: np.ndarray, x: np.ndarray,
                 y: np.ndarray, workdir: Path) -> tuple[np.ndarray, list[float]]:
    """One round on one client: the global weights in, `local_steps` of AdamW on (x, y), the new weights out."""
    cfg = recipe.federated
    artifacts = node_artifacts(workdir, base, sha256_file(base))
    # One seed per client and round: a ClientApp process lives for one message.
    trainer = OnnxTrainer(artifacts, lr=cfg.lr, seed=recipe.seed * 100_000 + client * 1_000 + round_number)
    trainer.load_parameters(params)
    if faults.armed("federated-client") == (client, round_number):
        faults.die("federated-client", f"client {client} dies mid-round {round_number}")
    losses = trainer.train(x, y, cfg.local_steps, cfg.local_batch_size)
    return trainer.parameters().astype(np.float32), losses


def node_artifacts(workdir: Path, base: Path, base_sha: str) -> Path:
    """The onnxruntime-training artifacts of `base`, made once per node folder and kept between rounds; made aside
    and renamed, so concurrent ClientApps (virtual nodes) never see a half-made folder."""
    folder = workdir / base_sha[:16]
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".artifacts-", dir=folder.parent))
        training_artifacts(base, scratch / "artifacts")
        try:
            os.replace(scratch / "artifacts", folder)
        except OSError:  # another ClientApp made it first
            pass
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def node_data(context: Context, recipe: Recipe, client: int) -> tuple[np.ndarray, np.ndarray]:
    """The node's own data file, or (a virtual node of the simulation runtime) its shard of the recipe's dataset."""
    data = context.node_config.get("data")
    if data:
        with np.load(str(data)) as held:
            return held["x"], held["y"]
    from zoo.fleet import client_shard  # lazy: the simulation's virtual nodes only (torch datasets)

    return client_shard(recipe, client)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """One round on this node; the reply names the base file's sha256 and state, which the server checks."""
    quiet_onnxruntime()
    recipe = recipe_of(context.run_config)
    client = int(context.node_config["partition-id"])
    # A SuperNode names its own copy of the fp32 file; virtual ones (simulation) share the run's.
    base = Path(str(context.node_config.get("base-onnx") or context.run_config["base-onnx"]))
    x, y = node_data(context, recipe, client)
    workdir = Path(str(context.node_config.get("workdir") or zoo_home() / "federated-nodes"))
    params, losses = local_update(recipe, client, int(msg.content["config"]["server-round"]), base,
                                  msg.content["arrays"].to_numpy_ndarrays()[0], x, y, workdir)
    reply = RecordDict({
        "arrays": ArrayRecord([params]),
        "metrics": MetricRecord({"num-examples": len(y), "loss-first": float(losses[0]),
                                 "loss-last": float(losses[-1])}),
        "zoo": ConfigRecord({"client": client, "base-sha256": sha256_file(base), "state": json.dumps(model_state(base))}),
    })
    return Message(content=reply, reply_to=msg)
