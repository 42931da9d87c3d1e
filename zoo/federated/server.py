"""The federated server's model: the global weights of a fleet, the consistency rule, evaluation, per-round saving
and resuming, and the federated model's export (used by the Flower ServerApp, zoo.federated.flower)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx

from zoo.errors import ZooError
from zoo.evaluate import accuracy
from zoo.metadata import read_metadata, write_metadata
from zoo.federated.client import model_state
from zoo.fleet import fleet_data
from zoo.fsutil import atomic_write_bytes, atomic_write_text
from zoo.ondevice.engine import OnnxTrainer, quiet_onnxruntime, training_artifacts
from zoo.pointer import sha256_file


class FleetModel:
    """The global model of one federated run, saved after every round under `output_dir` and resumed from there."""

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
        self.x_test, self.y_test = fleet_data(recipe, "test")
        self._resume()
        self.resumed_rounds = len(self.history)

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

    # the rule and the rounds --------------------------------------------------------------------------------
    def check(self, zoo) -> str:
        """Why an update cannot join the average ('' when it can): its base model and quantization/precision state
        (the client's `zoo` ConfigRecord) must be the server's."""
        if zoo is None or "base-sha256" not in zoo or "state" not in zoo:
            return "the reply does not say which base model and quantization state it was trained from"
        problems = []
        if zoo["base-sha256"] != self.base_sha:
            problems.append(f"base sha256 {str(zoo['base-sha256'])[:12]}… != {self.base_sha[:12]}…")
        state = json.loads(str(zoo["state"]))
        if state != self.state:
            diff = {k: (state.get(k), v) for k, v in self.state.items() if state.get(k) != v}
            problems.append(f"quantization state differs {diff}")
        return "; ".join(problems)

    def round_number(self, server_round: int) -> int:
        """The fleet's round number of Flower's `server_round` (which restarts at 1 when a run resumes)."""
        return self.resumed_rounds + server_round

    def initial_accuracy(self) -> float:
        if self.history:
            return self.history[0]["initial_accuracy"]
        self._initial = self.evaluate(self.global_params)
        return self._initial

    def complete_round(self, params: np.ndarray, outcome: dict) -> dict:
        """Record a finished round (its aggregate, or the kept global model), evaluate, save, track."""
        self.global_params = np.asarray(params, dtype=np.float32)
        number = len(self.history) + 1
        received = outcome.get("clients", [])
        record = {"round": number, "clients": received,
                  "dropped": sorted(set(range(self.cfg.clients)) - set(received)),
                  "refused": outcome.get("refused", []), "failed": outcome.get("failed", []),
                  "samples": outcome.get("samples", {}), "accuracy": self.evaluate()}
        if number == 1:
            record["initial_accuracy"] = getattr(self, "_initial", None) or self.evaluate(self.model_start())
        self.history.append(record)
        self.save()
        self.log(f"server: round {number}: updates from {received}, dropped {record['dropped']}, "
                 f"global accuracy {record['accuracy']:.4f}")
        if self.tracker:
            self.tracker.metric("federated/global_accuracy", record["accuracy"], number)
        return record

    def model_start(self) -> np.ndarray:
        return OnnxTrainer(self.out / "artifacts", lr=self.cfg.lr).parameters()

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
                                              "recipe": self.recipe.name, "aggregation": "FedAvg (sample-weighted)",
                                              "engine": "Flower"})}
        final = write_metadata(onnx.load(str(raw)), props, self.out / "model.federated.onnx")
        raw.unlink()
        return final


def summary_record(recipe, fleet: FleetModel, final: Path, central: float) -> dict:
    """federated.json: the run's rounds next to central training, and the federated variant's card fields."""
    return {
        "recipe": recipe.name, "engine": "Flower", "base_sha256": fleet.base_sha, "state": fleet.state,
        "initial_accuracy": fleet.history[0]["initial_accuracy"] if fleet.history else fleet.evaluate(),
        "rounds": [{k: r.get(k) for k in ("round", "clients", "dropped", "refused", "failed", "accuracy")}
                   for r in fleet.history],
        "central_accuracy": central,
        "variant": {"file": final.name, "sha256": sha256_file(final), "size": final.stat().st_size,
                    "metrics": {"accuracy": fleet.history[-1]["accuracy"] if fleet.history else None}},
    }


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
