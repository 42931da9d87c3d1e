"""The zoo's federated server as a Flower ServerApp: sample-weighted FedAvg with the zoo's fleet-consistency rule (the
ClientApp, which trains the fleet's fp32 ONNX with onnxruntime-training and no torch, is zoo.federated.client).

Run configuration (the app's pyproject.toml, overridden by `flwr run --run-config`): `recipe`, `overrides` (a JSON
list of key=value recipe overrides), `base-onnx` (the fp32 file the fleet starts from), `output-dir` (server state,
history, the federated model), `tracking-uri` and `tracking` (MLflow). Node configuration (`flower-supernode
--node-config`): `partition-id` (the client's shard of the recipe's Dirichlet split), `data` (that shard, the node's
own .npz) and `base-onnx` (that node's copy of the fp32 file: its sha256 and metadata are what the server checks).

- Clients reply with their update, its example count (`num-examples`, FedAvg's weight), their losses and a
  ConfigRecord `zoo` naming their base model's sha256 and quantization/precision state; `ZooFedAvg` refuses (and
  logs) replies from another base or state before Flower's FedAvg averages the rest, in client order (the same updates
  always give the same bytes).
- A failed or killed ClientApp, or a node that misses the round's timeout, costs only its update (Flower's error
  replies); rounds go on with the others (at least the recipe's `min_clients`, else the global model is kept).
- After every round the global model is evaluated on the fleet's test split, saved with the history (atomically) and
  logged to MLflow; a ServerApp started again with the same output dir resumes after the last saved round.
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from zoo import faults
from zoo.federated.client import recipe_of
from zoo.federated.server import FleetModel, central_baseline, summary_record
from zoo.fsutil import atomic_write_text, plural
from zoo.train.tracking import Tracker

server_app = ServerApp()

class ZooFedAvg(FedAvg):
    """Flower's sample-weighted FedAvg behind the zoo's fleet-consistency rule: updates made from another base model
    (sha256) or another quantization/precision state are refused and logged; the rest are averaged in client order."""

    def __init__(self, fleet: FleetModel, **kwargs):
        super().__init__(fraction_evaluate=0.0, **kwargs)
        self.fleet = fleet
        self.last: dict = {}

    def aggregate_train(self, server_round: int, replies):
        accepted, refused, failed = [], [], []
        for msg in replies:
            if msg.has_error():
                failed.append(f"node {msg.metadata.src_node_id}: {msg.error.reason}")
                continue
            zoo = msg.content.get("zoo")
            client = int(zoo["client"]) if zoo is not None and "client" in zoo else -1
            problem = self.fleet.check(zoo)
            if problem:
                reason = f"refused update from client {client} (round {self.fleet.round_number(server_round)}): {problem}"
                refused.append((client, reason))
                self.fleet.log(f"server: {reason}")
                continue
            accepted.append((client, msg))
        accepted.sort(key=lambda item: item[0])
        self.last = {"clients": [c for c, _ in accepted], "refused": [r for _, r in sorted(refused)], "failed": failed,
                     "samples": {str(c): int(m.content["metrics"]["num-examples"]) for c, m in accepted}}
        if len(accepted) < self.fleet.cfg.min_clients:
            self.fleet.log(f"server: round {self.fleet.round_number(server_round)}: {plural(len(accepted), 'update')} < "
                           f"min_clients {self.fleet.cfg.min_clients}; the global model is kept")
            return None, None
        return super().aggregate_train(server_round, [m for _, m in accepted])


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    run_config = context.run_config
    recipe = recipe_of(run_config)
    cfg = recipe.federated
    out = Path(str(run_config["output-dir"]))
    tracker = Tracker(bool(run_config.get("tracking", True)) and recipe.tracking.enabled,
                      str(run_config.get("tracking-uri", "")) or recipe.tracking.uri, recipe.tracking.experiment,
                      f"{recipe.model}-{recipe.name}", {"recipe": recipe.model_dump(mode="json"),
                                                        "launcher": "federated (Flower)"})
    try:
        fleet = FleetModel(recipe, Path(str(run_config["base-onnx"])), out, log=lambda m: print(m, flush=True),
                           tracker=tracker)
        strategy = ZooFedAvg(fleet, min_train_nodes=max(1, cfg.min_clients), min_available_nodes=cfg.clients)
        exit_after = faults.armed("federated-server")

        def after_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0:
                return MetricRecord({"accuracy": fleet.initial_accuracy()})
            record = fleet.complete_round(arrays.to_numpy_ndarrays()[0], strategy.last)
            if exit_after == (record["round"],):
                faults.die("federated-server", f"server: exiting after round {record['round']}")
            return MetricRecord({"accuracy": record["accuracy"]})

        remaining = cfg.rounds - len(fleet.history)
        if remaining > 0:
            strategy.start(grid, ArrayRecord([fleet.global_params]), num_rounds=remaining,
                           timeout=cfg.round_timeout_s, evaluate_fn=after_round)
        final = fleet.export_global()
        central = central_baseline(recipe, fleet.base, out / ".central")
        summary = summary_record(recipe, fleet, final, central)
        atomic_write_text(out / "federated.json", json.dumps(summary, indent=2) + "\n")
        rounds = ", ".join(f"{r['round']}: {r['accuracy']:.4f}" for r in summary["rounds"])
        print(f"federated: initial {summary['initial_accuracy']:.4f}; per round {rounds}; "
              f"central {central:.4f}", flush=True)
        tracker.metric("federated/central_accuracy", central, len(fleet.history))
        tracker.artifacts([final, out / "federated.json"])
        tracker.finish()
    except BaseException:
        tracker.finish("FAILED")
        raise
