"""MLflow against one real `mlflow server` on 127.0.0.1: a training run's tracking, and `zoo register` (versions made
from the verified files, loadable with `mlflow.pyfunc.load_model("models:/zoo.NAME@alias")` in a fresh process, the
card as tags, idempotent by sha256, aliases held by other files reported and left alone)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import requests

from tests.helpers import zoo_cli
from tests.test_training import train
from zoo import catalog
from zoo.ort import ort
from zoo.pointer import sha256_file
from zoo.registry import EXPERIMENT, SHA_TAG, model_name, reference_data
from zoo.store.fetch import fetch

ENTRIES = ("digits-cnn", "bert-tiny")  # a CNN and a BERT entry of the catalog, from the repository's store
# A user's fresh process (one for all the models: importing MLflow is the slow part): each registered model loaded
# by its URI, its outputs on the given inputs saved.
LOAD = """
import json, sys
import mlflow
import numpy as np
import pytest
mlflow.set_tracking_uri(sys.argv[1])
for uri, inputs, input_name, out in json.loads(sys.argv[2]):
    outputs = mlflow.pyfunc.load_model(uri).predict({input_name: np.load(inputs)})
    np.save(out, np.asarray(next(iter(outputs.values())) if isinstance(outputs, dict) else outputs))
"""


def register(url: str, *args: str, home) -> subprocess.CompletedProcess:
    return zoo_cli("register", *args, "--tracking-uri", url, env={"ZOO_HOME": str(home)})


def test_register_loads_in_a_fresh_process_with_the_cards_predictions(tmp_path, mlflow_server):
    result = register(mlflow_server, *ENTRIES, "--json", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    loads = []
    for name in ENTRIES:
        card = catalog.get_card(name)
        rows = {r["variant"]: r for r in shown[name]}
        assert set(rows) >= {"fp32", "int8-qat"} and all(r["new"] for r in rows.values())
        assert "fastest" in rows[card.fastest(1)]["aliases"]
        np.save(tmp_path / f"{name}-inputs.npy", reference_data(card)[0])
        loads += [(f"models:/{model_name(name)}@{alias}", str(tmp_path / f"{name}-inputs.npy"), card.inputs[0].name,
                   str(tmp_path / f"{name}-{alias}.npy")) for alias in ("fp32", "int8-qat")]
    subprocess.run([sys.executable, "-c", LOAD, mlflow_server, json.dumps(loads)], check=True, capture_output=True,
                   text=True, timeout=300)
    for name in ENTRIES:
        card = catalog.get_card(name)
        inputs, reference = reference_data(card)
        for alias in ("fp32", "int8-qat"):
            got = np.load(tmp_path / f"{name}-{alias}.npy")
            # the card's own file in onnxruntime gives the same outputs: the registry serves the verified bytes
            session = ort.InferenceSession(str(fetch(name, alias, show_progress=False).path),
                                           providers=["CPUExecutionProvider"])
            expected = session.run(None, {session.get_inputs()[0].name: inputs})[0]
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
            if alias == "fp32":  # and fp32's are the stored reference outputs of the card's test data
                np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)

    # The UI's REST API lists the versions with the card's tags.
    answer = requests.get(f"{mlflow_server}/api/2.0/mlflow/model-versions/search",
                          params={"filter": f"name='{model_name('digits-cnn')}'"}, timeout=30)
    answer.raise_for_status()
    versions = answer.json()["model_versions"]
    card = catalog.get_card("digits-cnn")
    tags = {}
    for version in versions:
        tagged = {t["key"]: t["value"] for t in version.get("tags", [])}
        tags[tagged[SHA_TAG]] = tagged
    fp32 = tags[card.variants["fp32"].sha256]
    assert fp32["zoo.variant"] == "fp32" and float(fp32["zoo.accuracy"]) == card.variants["fp32"].metrics["accuracy"]
    assert fp32["zoo.cpu"] == card.training.cpu.model and fp32["zoo.git_commit"] == card.training.git_commit
    assert fp32["zoo.accuracy_ci95"].startswith("[") and "test examples" in fp32["zoo.accuracy_ci95"]
    assert {t["zoo.precision"] for t in tags.values()} >= {"fp32", "int8"}

    # Registering again adds nothing.
    again = register(mlflow_server, "digits-cnn", "--json", home=tmp_path / "home")
    assert again.returncode == 0 and not any(r["new"] for r in json.loads(again.stdout)["digits-cnn"])
    assert len(requests.get(f"{mlflow_server}/api/2.0/mlflow/model-versions/search",
                            params={"filter": f"name='{model_name('digits-cnn')}'"},
                            timeout=30).json()["model_versions"]) == len(versions)


def test_an_alias_on_another_file_is_reported_not_moved(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    assert register(mlflow_server, "digits-cnn", "--variant", "fp32", "--variant", "int8-qat",
                    home=tmp_path / "home").returncode == 0
    client = MlflowClient(mlflow_server)
    name = model_name("digits-cnn")
    qat = client.get_model_version_by_alias(name, "int8-qat")
    client.set_registered_model_alias(name, "fp32", qat.version)  # someone pointed fp32 at another file
    refused = register(mlflow_server, "digits-cnn", "--variant", "fp32", home=tmp_path / "home")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"{name}@fp32 is version {qat.version}" in refused.stderr and "--move-aliases" in refused.stderr
    assert client.get_model_version_by_alias(name, "fp32").version == qat.version  # left alone
    moved = register(mlflow_server, "digits-cnn", "--variant", "fp32", "--move-aliases", home=tmp_path / "home")
    assert moved.returncode == 0, moved.stderr
    back = client.get_model_version_by_alias(name, "fp32")
    assert back.tags[SHA_TAG] == catalog.get_card("digits-cnn").variants["fp32"].sha256


def test_register_refuses_what_it_cannot_register(tmp_path):
    for args, message in [(["no-such-model"], "no-such-model"),
                          (["digits-cnn", "--variant", "ort-training"], "no built ONNX variant ort-training"),
                          ([], "name an entry to register, or pass --all")]:
        result = zoo_cli("register", *args, "--tracking-uri", f"sqlite:///{tmp_path / 'r.db'}",
                         env={"ZOO_HOME": str(tmp_path / "home")})
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.db").exists()  # no store made


def test_a_local_store_keeps_the_registered_files_beside_it(tmp_path):
    """An sqlite store's experiments keep their files beside the database (zoo.train.tracking artifact_location; the
    default store's are in $ZOO_HOME/mlartifacts): never in ./mlruns of whichever folder the command ran in."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "store" / "r.db"
    db.parent.mkdir()
    result = zoo_cli("register", "digits-cnn", "--variant", "fp32", "--tracking-uri", f"sqlite:///{db}",
                     env={"ZOO_HOME": str(tmp_path / "home")})
    assert result.returncode == 0, result.stderr
    experiment = MlflowClient(f"sqlite:///{db}").get_experiment_by_name(EXPERIMENT)
    assert experiment.artifact_location == (db.parent / "mlartifacts").as_uri()
    files = sorted((db.parent / "mlartifacts").rglob("*.onnx"))
    assert [sha256_file(f) for f in files] == [catalog.get_card("digits-cnn").variants["fp32"].sha256]


@pytest.mark.ranks  # it takes both CPUs itself (tests/helpers.py all_cpus)
def test_mlflow_logging_against_real_server(tmp_path, mlflow_server):
    train(tmp_path, "tracked", "--recipe", "qat-int8", "--tracking-uri", mlflow_server, "steps=20",
          "quantization.qat_steps=10", "export.opsets=[17]", nproc=2)
    summary = json.loads((tmp_path / "tracked" / "summary.json").read_text())
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    run = client.get_run(summary["tracking"]["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["recipe.quantization.scheme"] == "qat-int8" and run.data.params["world_size"] == "2"
    assert abs(run.data.metrics["onnx/int8-qat/accuracy"] - summary["variants"]["int8-qat"]["accuracy"]) < 1e-9
    assert len(client.get_metric_history(run.info.run_id, "fp32/loss")) == 20
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model.onnx", "model.int8-qat.onnx", "model.int8-ptq.onnx", "summary.json"} <= artifacts
    # exactly one run: other ranks never track
    assert len(client.search_runs([run.info.experiment_id])) == 1
