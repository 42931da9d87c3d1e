"""MLflow tracking, rank 0 only (other ranks never import mlflow).

Default store: an sqlite database under $ZOO_HOME (MLflow's own default is ./mlflow.db in whatever
directory you happen to be in). Metrics are buffered and sent with log_batch (one call per flush).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from zoo.config import zoo_home


def default_tracking_uri() -> str:
    home = zoo_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


def _flatten(data: dict, prefix: str = "") -> dict[str, str]:
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, list) else str(value)
    return flat


class Tracker:
    """Buffers metrics; does nothing on ranks other than 0 or when tracking is off."""

    def __init__(self, enabled: bool, uri: str | None, experiment: str, run_name: str, params: dict, flush_every: int = 50):
        self.enabled = enabled
        self.buffer: list = []
        self.flush_every = flush_every
        self.run_id = None
        self.uri = None
        if not enabled:
            return

        import mlflow  # lazy: mlflow (~1.5 s), only on the rank that tracks
        from mlflow.entities import Param  # lazy: as above
        from mlflow.tracking import MlflowClient  # lazy: as above

        self.uri = uri or default_tracking_uri()
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        experiment_obj = self.client.get_experiment_by_name(experiment)
        experiment_id = experiment_obj.experiment_id if experiment_obj else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id

        flat = _flatten(params)
        self.client.log_batch(self.run_id, params=[Param(k, v[:6000]) for k, v in sorted(flat.items())])

    def metric(self, key: str, value: float, step: int) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric  # lazy: only on the rank that tracks (imported there already)

        self.buffer.append(Metric(key, float(value), int(time.time() * 1000), step))
        if len(self.buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self.enabled and self.buffer:
            for start in range(0, len(self.buffer), 1000):  # MLflow's per-call metric limit
                self.client.log_batch(self.run_id, metrics=self.buffer[start:start + 1000])
            self.buffer = []

    def artifacts(self, paths: list[Path]) -> None:
        if self.enabled:
            for path in paths:
                self.client.log_artifact(self.run_id, str(path))

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self.flush()
            self.client.set_terminated(self.run_id, status)
