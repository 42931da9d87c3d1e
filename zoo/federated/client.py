"""A federated client: trains its shard of the fleet's data from the ONNX file it holds (onnxruntime-training)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import requests

from zoo import faults
from zoo.errors import ZooError
from zoo.federated import client_split, fleet_data, model_state
from zoo.ondevice.engine import OnnxTrainer, quiet_onnxruntime, training_artifacts
from zoo.store.pointer import sha256_file

class FederatedClient:
    """Trains its shard of the data from the ONNX file it holds; nothing but onnxruntime-training."""

    def __init__(self, recipe, client: int, base: Path, server: str, workdir: Path, log=print):
        quiet_onnxruntime()
        self.recipe, self.cfg, self.client, self.server, self.log = recipe, recipe.federated, client, server, log
        self.base_sha, self.state = sha256_file(base), model_state(base)
        training_artifacts(base, workdir / "artifacts")
        self.trainer = OnnxTrainer(workdir / "artifacts", lr=self.cfg.lr, seed=recipe.seed * 1000 + client)
        x, y = fleet_data(recipe, "train")
        shard = client_split(y, self.cfg.clients, self.cfg.dirichlet_alpha, recipe.seed)[client]
        self.x, self.y = x[shard], y[shard]
        counts = np.bincount(self.y, minlength=int(y.max()) + 1).tolist()
        log(f"client {client}: {len(shard)} examples, per class {counts}")

    def _get(self, path: str, patience: float = 300.0):
        deadline = time.monotonic() + patience
        while True:  # the server may be restarting: keep trying for a while
            try:
                response = requests.get(self.server + path, timeout=30)
                response.raise_for_status()
                return response
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise ZooError(f"client {self.client}: server {self.server} unreachable for {patience:.0f} s") from None
                time.sleep(0.5)

    def run(self) -> None:
        done_round = 0
        fault = faults.armed("federated-client")
        while True:
            status = self._get("/status").json()
            if status["done"]:
                self.log(f"client {self.client}: server finished after round {status['rounds']}")
                return
            if status["round"] <= done_round:
                time.sleep(0.2)
                continue
            self.trainer.load_parameters(np.frombuffer(self._get("/params").content, dtype="<f4"))
            if fault == (self.client, status["round"]):
                faults.die("federated-client", f"client {self.client} dies mid-round {status['round']}")
            losses = self.trainer.train(self.x, self.y, self.cfg.local_steps, self.cfg.local_batch_size)
            headers = {"X-Zoo-Client": str(self.client), "X-Zoo-Round": str(status["round"]),
                       "X-Zoo-Base-Sha256": self.base_sha, "X-Zoo-State": json.dumps(self.state),
                       "X-Zoo-Samples": str(len(self.x)), "Content-Type": "application/octet-stream"}
            reply = requests.post(self.server + "/update", data=self.trainer.parameters().astype("<f4").tobytes(),
                                  headers=headers, timeout=60)
            answer = reply.json()
            self.log(f"client {self.client}: round {status['round']} loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
                     f"{'accepted' if answer['accepted'] else answer['reason']}")
            if not answer["accepted"]:
                raise ZooError(answer["reason"])
            done_round = status["round"]
