"""Federated learning over the zoo's ONNX models: FedAvg server and onnxruntime-training clients over HTTP.

Transport: plain HTTP on 127.0.0.1 (stdlib server, `requests` clients); weights travel as raw float32
vectors of the trainable parameters (onnxruntime-training's contiguous buffer). A dead client costs
the round its update, never the global model: the server aggregates whatever valid updates arrived
by the round deadline. Every update names the base model's sha256 and its quantization/precision
state; the server refuses mismatches. The server saves its state after each completed round and
resumes from the last one after a restart.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from zoo.errors import ZooError

STATE_KEYS = ("zoo.variant", "zoo.quantization", "zoo.precision.weights", "zoo.precision.activations",
              "zoo.precision.compute")


def model_state(path: Path) -> dict[str, str]:
    """The quantization/precision state every participant must share (from the file's zoo metadata)."""
    from zoo.export import read_metadata

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
    from zoo.models import model_spec

    return recipe.dataset or model_spec(recipe.model).dataset


def fleet_data(recipe, split: str):
    """The recipe's dataset split as the fleet sees it (with the recipe's shift, if any)."""
    from zoo.data import load_dataset
    from zoo.ondevice import shifted_split

    dataset = fleet_dataset(recipe)
    if recipe.federated.shift:
        return shifted_split(dataset, recipe.federated.shift, split)
    part = load_dataset(dataset).split(split)
    return part.x.numpy(), part.y.numpy()


# -- server ----------------------------------------------------------------------------------------------------

@dataclass
class Round:
    number: int
    updates: dict[int, tuple[np.ndarray, int]] = field(default_factory=dict)  # client -> (params, samples)
    refused: list[str] = field(default_factory=list)
    first_update: float | None = None  # monotonic time of the round's first accepted update


class FedAvgServer:
    def __init__(self, recipe, base: Path, output_dir: Path, log=print, tracker=None):
        from zoo.ondevice import OnnxTrainer, quiet_onnxruntime, training_artifacts
        from zoo.store.pointer import sha256_file

        quiet_onnxruntime()
        self.recipe, self.cfg, self.base, self.out, self.log, self.tracker = (
            recipe, recipe.federated, Path(base), Path(output_dir), log, tracker)
        self.out.mkdir(parents=True, exist_ok=True)
        self.base_sha = sha256_file(self.base)
        self.state = model_state(self.base)
        training_artifacts(self.base, self.out / "artifacts")
        self.model = OnnxTrainer(self.out / "artifacts", lr=self.cfg.lr)  # holds the global weights
        self.global_params = self.model.parameters()
        self.history: list[dict] = []
        self.lock = threading.Condition()
        self.x_test, self.y_test = fleet_data(recipe, "test")
        self._resume()
        self.current = Round(len(self.history) + 1)

    # state --------------------------------------------------------------------------------------------------
    def _resume(self) -> None:
        state = self.out / "server_state.npz"
        if not state.exists():
            return
        with np.load(state) as saved:
            if str(saved["base_sha256"]) != self.base_sha:
                raise ZooError(f"{state} belongs to another base model; use a fresh --output-dir")
            self.global_params = saved["params"]
        self.history = json.loads((self.out / "history.json").read_text())
        self.log(f"server: resumed after round {len(self.history)} from {state}")

    def _save(self) -> None:
        from zoo.store.cache import atomic_write_bytes, atomic_write_text

        buffer = io.BytesIO()
        np.savez(buffer, params=self.global_params, base_sha256=np.array(self.base_sha))
        atomic_write_bytes(self.out / "server_state.npz", buffer.getvalue())
        atomic_write_text(self.out / "history.json", json.dumps(self.history, indent=2) + "\n")

    # protocol -----------------------------------------------------------------------------------------------
    def status(self) -> dict:
        return {"round": self.current.number, "rounds": self.cfg.rounds, "done": self.current.number > self.cfg.rounds,
                "base_sha256": self.base_sha, "state": self.state, "parameters": int(self.global_params.size)}

    def submit(self, client: int, round_number: int, base_sha: str, state: dict, samples: int,
               params: np.ndarray) -> tuple[bool, str]:
        with self.lock:
            problems = []
            if base_sha != self.base_sha:
                problems.append(f"base sha256 {base_sha[:12]}… != {self.base_sha[:12]}…")
            if state != self.state:
                diff = {k: (state.get(k), v) for k, v in self.state.items() if state.get(k) != v}
                problems.append(f"quantization state differs {diff}")
            if round_number != self.current.number:
                problems.append(f"update for round {round_number}, the server is at round {self.current.number}")
            if params.size != self.global_params.size:
                problems.append(f"{params.size} parameters, expected {self.global_params.size}")
            if problems:
                reason = f"refused update from client {client} (round {round_number}): " + "; ".join(problems)
                self.current.refused.append(reason)
                self.log(f"server: {reason}")
                return False, reason
            self.current.updates[client] = (params, samples)
            if self.current.first_update is None:
                self.current.first_update = time.monotonic()
            self.lock.notify_all()
            return True, "accepted"

    def run_round(self) -> dict:
        """Wait for the clients (or the deadline), FedAvg the valid updates, evaluate, save."""
        opened = time.monotonic()
        with self.lock:
            while len(self.current.updates) < self.cfg.clients:
                # A client is dropped once it is round_timeout_s behind the first update of the round (or, when
                # nobody answers, behind the round's opening): slow starters are not punished, dead ones are.
                started = self.current.first_update or opened
                if time.monotonic() >= started + self.cfg.round_timeout_s:
                    break
                self.lock.wait(timeout=0.2)
            r = self.current
            received = sorted(r.updates)
            if len(received) >= self.cfg.min_clients:
                total = sum(samples for _, samples in r.updates.values())
                # Summed in client order, not arrival order: the same updates always give the same bytes.
                self.global_params = sum(p * (samples / total) for _, (p, samples) in sorted(r.updates.items())
                                         ).astype(np.float32)
            else:
                self.log(f"server: round {r.number}: {len(received)} update(s) < min_clients "
                         f"{self.cfg.min_clients}; the global model is kept")
            accuracy = self.evaluate()
            record = {"round": r.number, "clients": received,
                      "dropped": sorted(set(range(self.cfg.clients)) - set(received)),
                      "refused": r.refused, "samples": {str(c): s for c, (_, s) in r.updates.items()},
                      "accuracy": accuracy}
            self.history.append(record)
            self._save()
            self.current = Round(r.number + 1)
            self.lock.notify_all()
        self.log(f"server: round {record['round']}: updates from {received}, dropped {record['dropped']}, "
                 f"global accuracy {accuracy:.4f}")
        if self.tracker:
            self.tracker.metric("federated/global_accuracy", accuracy, record["round"])
        return record

    def evaluate(self, params: np.ndarray | None = None) -> float:
        from zoo.evaluate import accuracy

        self.model.load_parameters(self.global_params if params is None else params)
        path = self.model.export(self.out / ".evaluate.onnx")
        try:
            return accuracy(path, self.x_test, self.y_test)
        finally:
            path.unlink(missing_ok=True)

    def export_global(self) -> Path:
        """The final global model as an inference ONNX with the zoo's metadata."""
        import onnx

        from zoo.export import read_metadata, write_metadata

        self.model.load_parameters(self.global_params)
        raw = self.model.export(self.out / ".model.federated.raw.onnx")
        props = {**read_metadata(self.base), "zoo.finetuned_from_sha256": self.base_sha,
                 "zoo.federated": json.dumps({"rounds": len(self.history), "clients": self.cfg.clients,
                                              "recipe": self.recipe.name, "aggregation": "FedAvg (sample-weighted)"})}
        final = write_metadata(onnx.load(str(raw)), props, self.out / "model.federated.onnx")
        raw.unlink()
        return final

    def serve(self, port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def _handler(fed: FedAvgServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # the server logs rounds, not requests
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/status":
                self._send(200, json.dumps(fed.status()).encode())
            elif self.path == "/params":
                with fed.lock:
                    body = fed.global_params.astype("<f4").tobytes()
                self._send(200, body, "application/octet-stream")
            else:
                self._send(404, b'{"error": "unknown path"}')

        def do_POST(self):
            if self.path != "/update":
                return self._send(404, b'{"error": "unknown path"}')
            body = self.rfile.read(int(self.headers["Content-Length"]))
            ok, reason = fed.submit(int(self.headers["X-Zoo-Client"]), int(self.headers["X-Zoo-Round"]),
                                    self.headers["X-Zoo-Base-Sha256"], json.loads(self.headers["X-Zoo-State"]),
                                    int(self.headers["X-Zoo-Samples"]), np.frombuffer(body, dtype="<f4").copy())
            self._send(200 if ok else 409, json.dumps({"accepted": ok, "reason": reason}).encode())

    return Handler


# -- client ----------------------------------------------------------------------------------------------------

class FederatedClient:
    """Trains its shard of the data from the ONNX file it holds; nothing but onnxruntime-training."""

    def __init__(self, recipe, client: int, base: Path, server: str, workdir: Path, log=print):
        from zoo.ondevice import OnnxTrainer, quiet_onnxruntime, training_artifacts
        from zoo.store.pointer import sha256_file

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
        import requests

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
        import requests

        done_round = 0
        fault = _fault_round(self.client)
        while True:
            status = self._get("/status").json()
            if status["done"]:
                self.log(f"client {self.client}: server finished after round {status['rounds']}")
                return
            if status["round"] <= done_round:
                time.sleep(0.2)
                continue
            self.trainer.load_parameters(np.frombuffer(self._get("/params").content, dtype="<f4"))
            if fault == status["round"]:
                os._exit(17)  # fault injection: die mid-round (ZOO_FEDERATED_FAULT=client:round)
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


def _fault_round(client: int) -> int | None:
    spec = os.environ.get("ZOO_FEDERATED_FAULT")
    if not spec:
        return None
    who, round_number = (int(v) for v in spec.split(":"))
    return round_number if who == client else None


def central_baseline(recipe, base: Path, workdir: Path) -> float:
    """The same data trained in one place: all clients' shards, the same total number of examples seen."""
    from zoo.evaluate import accuracy
    from zoo.ondevice import OnnxTrainer, training_artifacts

    cfg = recipe.federated
    x, y = fleet_data(recipe, "train")
    training_artifacts(base, workdir / "central-artifacts")
    trainer = OnnxTrainer(workdir / "central-artifacts", lr=cfg.lr, seed=recipe.seed)
    trainer.train(x, y, cfg.rounds * cfg.local_steps * cfg.clients, cfg.local_batch_size)
    path = trainer.export(workdir / ".central.onnx")
    x_test, y_test = fleet_data(recipe, "test")
    try:
        return accuracy(path, x_test, y_test)
    finally:
        path.unlink(missing_ok=True)
