"""launchers/federated.py: real server and client processes over HTTP on 127.0.0.1, onnxruntime-training clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from tests.helpers import REPO, free_port, train_onnx
from zoo.export import read_metadata
from zoo.store.pointer import sha256_file

LAUNCHER = str(REPO / "launchers" / "federated.py")
# Short runs: 2 clients, rotated digits (the fleet's new distribution), a short deadline for dead clients.
QUICK = ["--recipe", "federated-digits", "--no-tracking", "federated.clients=2", "federated.rounds=3",
         "federated.local_steps=15", "federated.round_timeout_s=20"]


def env(tmp_path: Path, **extra) -> dict:
    return {**os.environ, "ZOO_HOME": str(tmp_path.parent / "zoo-home"), "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return train_onnx(tmp_path_factory.mktemp("fed-base"), "out", "--recipe", "fp32", "--model", "digits-cnn",
                      "steps=60")


def federated(tmp_path: Path, *args: str, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env(tmp_path, **extra), timeout=600)


def test_federated_run_beats_the_initial_model(tmp_path, base):
    result = federated(tmp_path, "run", *QUICK, "--onnx", str(base), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "federated.json").read_text())
    accuracies = [r["accuracy"] for r in summary["rounds"]]
    assert len(accuracies) == 3 and all(r["clients"] == [0, 1] for r in summary["rounds"])
    assert accuracies[-1] > summary["initial_accuracy"] + 0.15
    assert 0 < summary["central_accuracy"] <= 1
    variant = summary["variant"]
    path = tmp_path / "out" / variant["file"]
    assert sha256_file(path) == variant["sha256"] and variant["metrics"]["accuracy"] == accuracies[-1]
    meta = read_metadata(path)
    assert meta["zoo.finetuned_from_sha256"] == sha256_file(base) and json.loads(meta["zoo.federated"])["rounds"] == 3
    assert "server: round 3: updates from [0, 1]" in result.stdout


def test_mismatched_base_and_quantization_state_are_refused(tmp_path, base):
    other = train_onnx(tmp_path, "other", "--recipe", "fp32", "--model", "digits-cnn", "steps=10", "seed=1")
    relabelled = tmp_path / "relabelled.onnx"  # same weights, claims int8 weights: another quantization state
    model = onnx.load(str(base))
    for prop in model.metadata_props:
        if prop.key == "zoo.precision.weights":
            prop.value = "int8"
    onnx.save(model, str(relabelled))
    port = free_port()
    args = [*QUICK, "federated.clients=3", "federated.rounds=1", "federated.round_timeout_s=15"]
    server = subprocess.Popen([sys.executable, LAUNCHER, "serve", *args, "--onnx", str(base), "--port", str(port),
                               "--output-dir", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path, env=env(tmp_path))
    url = f"http://127.0.0.1:{port}"
    clients = [subprocess.Popen([sys.executable, LAUNCHER, "client", *args, "--onnx", str(onnx_file), "--server", url,
                                 "--client-id", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path, env=env(tmp_path))
               for i, onnx_file in enumerate([base, other, relabelled])]
    stdout, stderr = server.communicate(timeout=300)
    outputs = [c.communicate(timeout=120) for c in clients]
    assert server.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "refused update from client 1 (round 1): base sha256" in stdout
    line = next(l for l in stdout.splitlines() if "refused update from client 2" in l)
    assert "quantization state differs" in line and "zoo.precision.weights" in line
    assert [c.returncode for c in clients] == [0, 1, 1]
    assert "error: refused update" in outputs[1][1]
    history = json.loads((tmp_path / "out" / "history.json").read_text())
    assert history[0]["clients"] == [0] and len(history[0]["refused"]) == 2


def test_a_killed_client_is_dropped_without_breaking_the_round(tmp_path, base):
    result = federated(tmp_path, "run", *QUICK, "--onnx", str(base), "--output-dir", str(tmp_path / "out"),
                       ZOO_TEST_FAULT="federated-client@1:2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rounds = json.loads((tmp_path / "out" / "federated.json").read_text())["rounds"]
    assert rounds[0]["clients"] == [0, 1]
    assert rounds[1]["clients"] == [0] and rounds[1]["dropped"] == [1]  # died mid-round 2
    assert rounds[2]["clients"] == [0]
    assert all(0 < r["accuracy"] <= 1 for r in rounds) and rounds[2]["accuracy"] >= rounds[0]["accuracy"]


def test_server_restart_resumes_from_the_last_complete_round(tmp_path, base):
    port = free_port()
    common = [*QUICK, "--onnx", str(base), "--output-dir", str(tmp_path / "out")]
    url = f"http://127.0.0.1:{port}"
    clients = [subprocess.Popen([sys.executable, LAUNCHER, "client", *QUICK, "--onnx", str(base), "--server", url,
                                 "--client-id", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path, env=env(tmp_path)) for i in range(2)]
    first = federated(tmp_path, "serve", *common, "--port", str(port), ZOO_TEST_FAULT="federated-server@2")
    assert first.returncode == 19 and "exiting after round 2" in first.stdout
    time.sleep(1)
    second = federated(tmp_path, "serve", *common, "--port", str(port))
    for c in clients:
        c.communicate(timeout=120)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resumed after round 2" in second.stdout
    summary = json.loads((tmp_path / "out" / "federated.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2, 3]
    assert all(c.returncode == 0 for c in clients)


def test_recipe_without_federated_section_is_refused(tmp_path):
    result = federated(tmp_path, "run", "--recipe", "fp32")
    assert result.returncode != 0 and "has no federated section" in result.stderr and "Traceback" not in result.stderr
