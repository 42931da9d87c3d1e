"""MLflow tracking, rank 0 only (other ranks never import mlflow).

Default store: an sqlite database under $ZOO_HOME (MLflow's own default is ./mlflow.db in whatever
directory you happen to be in), its experiments' files beside it (`artifact_location`). Metrics are buffered and sent
with log_batch (one call per flush).
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


def artifact_location(uri: str) -> str | None:
    """Where a new experiment of the store at `uri` keeps its runs' files: beside a local sqlite database (for the
    default store, $ZOO_HOME/mlartifacts). MLflow's own default is ./mlruns of whichever folder the experiment happened
    to be created in, recorded for good: the checkout a build runs in, or the temporary worktree `zoo reproduce`
    deletes after its build, which every later run of that experiment then wrote into again. None: the store decides
    (an MLflow server's artifact root, a file store's own folder)."""
    if not uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url  # lazy: an MLflow dependency, only where tracking is on

    database = make_url(uri).database
    if not database or database == ":memory:":
        return None
    return (Path(database).resolve().parent / "mlartifacts").as_uri()


def experiment_id(client, uri: str, name: str) -> str:
    """The experiment `name` of the store at `uri`, made (with its files at `artifact_location`) when missing."""
    from mlflow.exceptions import MlflowException  # lazy: only where tracking is on

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri))
    except MlflowException:  # another process made it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


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
        self.run_id = self.client.create_run(experiment_id(self.client, self.uri, experiment),
                                             run_name=run_name).info.run_id

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
