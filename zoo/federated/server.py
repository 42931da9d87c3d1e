"""The FedAvg server: aggregates client updates per round over HTTP, evaluates, saves, resumes after a restart."""

from __future__ import annotations

import io
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnx

from zoo.errors import ZooError
from zoo.evaluate import accuracy
from zoo.export import read_metadata, write_metadata
from zoo.federated import fleet_data, model_state
from zoo.fsutil import atomic_write_bytes, atomic_write_text
from zoo.ondevice.engine import OnnxTrainer, quiet_onnxruntime, training_artifacts
from zoo.store.pointer import sha256_file

@dataclass
class Round:
    number: int
    updates: dict[int, tuple[np.ndarray, int]] = field(default_factory=dict)  # client -> (params, samples)
    refused: list[str] = field(default_factory=list)
    first_update: float | None = None  # monotonic time of the round's first accepted update


class FedAvgServer:
    def __init__(self, recipe, base: Path, output_dir: Path, log=print, tracker=None):
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

    def save(self) -> None:
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
            self.save()
            self.current = Round(r.number + 1)
            self.lock.notify_all()
        self.log(f"server: round {record['round']}: updates from {received}, dropped {record['dropped']}, "
                 f"global accuracy {accuracy:.4f}")
        if self.tracker:
            self.tracker.metric("federated/global_accuracy", accuracy, record["round"])
        return record

    def evaluate(self, params: np.ndarray | None = None) -> float:
        self.model.load_parameters(self.global_params if params is None else params)
        path = self.model.export(self.out / ".evaluate.onnx")
        try:
            return accuracy(path, self.x_test, self.y_test)
        finally:
            path.unlink(missing_ok=True)

    def export_global(self) -> Path:
        """The final global model as an inference ONNX with the zoo's metadata."""
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


def central_baseline(recipe, base: Path, workdir: Path) -> float:
    """The same data trained in one place: all clients' shards, the same total number of examples seen."""
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
