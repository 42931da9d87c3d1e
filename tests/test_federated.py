"""Federated learning on Flower: a real SuperLink, real SuperNodes and `flwr run` on 127.0.0.1 with TLS and SuperNode
authentication (zoo.federated.run.LocalFederation); onnxruntime-training ClientApps; the zoo's FedAvg ServerApp."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.helpers import REPO, made_once, train_onnx
from zoo.metadata import read_metadata
from zoo.fleet import write_shard
from zoo.federated.run import LocalFederation
from zoo.recipes import load_recipe
from zoo.pointer import sha256_file

LAUNCHER = str(REPO / "launchers" / "federated.py")
# Short runs: rotated digits (the fleet's new distribution), few local steps, a short timeout for dead clients.
QUICK = ["federated.rounds=2", "federated.local_steps=15", "federated.round_timeout_s=30"]


@pytest.fixture(scope="module")
def base() -> Path:
    """The fleet's base model, trained once per test run for both parts of `make test` (tests/helpers.py made_once);
    the tests read it and write what they make elsewhere."""
    return made_once("federated-base", lambda folder: train_onnx(folder, "out", "--recipe", "fp32", "--model",
                                                                 "digits-cnn", "steps=60")) / "out" / "model.onnx"


@pytest.fixture
def quiet_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "zoo-home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def federated(tmp_path: Path, *args: str, **extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "ZOO_HOME": str(tmp_path / "zoo-home"), "OMP_NUM_THREADS": "1", **extra}
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)


def test_fleet_rule_and_a_killed_client_on_a_tls_deployment(tmp_path, base, quiet_env, monkeypatch):
    """Four SuperNodes: two hold the fleet's base, one another base model, one the same weights claiming int8
    weights. The last two are refused every round; client 1's ClientApp dies mid-round 2 and costs only its update.
    It holds no lease on both CPUs (tests/helpers.py): most of its minute and a half is round 2 waiting out its
    timeout for the dead client, time the other worker's tests use; the ClientApps' short bursts share the CPUs."""
    other = train_onnx(tmp_path, "other", "--recipe", "fp32", "--model", "digits-cnn", "steps=10", "seed=1")
    relabelled = tmp_path / "relabelled.onnx"
    model = onnx.load(str(base))
    for prop in model.metadata_props:
        if prop.key == "zoo.precision.weights":
            prop.value = "int8"
    onnx.save(model, str(relabelled))
    monkeypatch.setenv("ZOO_TEST_FAULT", "federated-client@1:2")
    out, work = tmp_path / "out", tmp_path / "flower"
    # Four ClientApp processes start at once on the CPUs (2 here): 30 s per round is too tight for them.
    overrides = ["federated.clients=4", *QUICK, "federated.round_timeout_s=90"]
    recipe = load_recipe("federated-digits", overrides)
    nodes = [f'partition-id={i} base-onnx="{path}" workdir="{work / f"node{i}"}" '
             f'data="{write_shard(recipe, i, tmp_path / f"shard{i}.npz")}"'
             for i, path in enumerate([base, base, other, relabelled])]
    config = {"recipe": "federated-digits", "base-onnx": str(base), "output-dir": str(out), "tracking": False,
              "overrides": json.dumps(overrides)}
    with LocalFederation(work, nodes, log=lambda m: None) as federation:
        status = federation.run(config, patience=400)
    assert status == "finished:completed"
    superlink = (work / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1" in superlink  # TLS
    assert superlink.count("[ControlServicer.RegisterNode] Created node_id") == 4  # every node's key registered
    history = json.loads((out / "history.json").read_text())
    assert [r["clients"] for r in history] == [[0, 1], [0]]
    assert history[1]["dropped"] == [1, 2, 3]
    for record in history:
        assert len(record["refused"]) == 2
        assert "refused update from client 2" in record["refused"][0] and "base sha256" in record["refused"][0]
        assert "client 3" in record["refused"][1] and "quantization state differs" in record["refused"][1]
        assert "zoo.precision.weights" in record["refused"][1]
    summary = json.loads((out / "federated.json").read_text())
    assert summary["engine"] == "Flower" and summary["rounds"][-1]["accuracy"] > summary["initial_accuracy"] + 0.15
    final = out / summary["variant"]["file"]
    assert sha256_file(final) == summary["variant"]["sha256"]
    meta = read_metadata(final)
    assert meta["zoo.finetuned_from_sha256"] == sha256_file(base) and json.loads(meta["zoo.federated"])["rounds"] == 2
    assert not any(p.poll() is None for p in federation.processes)  # every process stopped


def test_the_launcher_resumes_after_the_server_dies(tmp_path, base):
    """No lease on both CPUs, as the fleet test above: a deployment's processes take turns (two ClientApps one after
    the other, the ServerApp between rounds) and mostly wait; alone, 44 s at 0.6 CPU (2026-12-07)."""
    common = ["run", "--recipe", "federated-digits", "--no-tracking", "--onnx", str(base), "--output-dir",
              str(tmp_path / "out"), "federated.clients=2", "federated.rounds=2", "federated.local_steps=15",
              "federated.round_timeout_s=120"]  # no client dies here: a slow machine must not drop one
    first = federated(tmp_path, *common, ZOO_TEST_FAULT="federated-server@1")
    assert first.returncode != 0
    assert "run again to resume" in first.stderr and "Traceback" not in first.stderr
    # Noticed from the ServerApp's process, not after Flower's heartbeat patience (about a minute).
    assert "its ServerApp process exited" in first.stderr, first.stderr[-2000:]
    assert len(json.loads((tmp_path / "out" / "history.json").read_text())) == 1
    second = federated(tmp_path, *common)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resumed after round 1" in second.stdout
    summary = json.loads((tmp_path / "out" / "federated.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    assert all(r["clients"] == [0, 1] for r in summary["rounds"])
    assert f"federated: initial {summary['initial_accuracy']:.4f}" in second.stdout


def test_twenty_virtual_clients_on_the_simulation_runtime(tmp_path, base):
    """No lease on both CPUs: Ray's two ClientApp actors are busy together for 2-3 s of the test's 17 (alone, 0.7 CPU
    on average, 2026-12-07); the rest is start-up and one process at a time."""
    result = federated(tmp_path, "simulate", "--recipe", "federated-digits", "--no-tracking", "--onnx", str(base),
                       "--output-dir", str(tmp_path / "out"), "federated.clients=20", "federated.rounds=1",
                       "federated.local_steps=10")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "federated.json").read_text())
    assert summary["rounds"][0]["clients"] == list(range(20))
    assert summary["rounds"][0]["accuracy"] > summary["initial_accuracy"]


def test_the_client_trains_where_torch_is_not_installed(tmp_path, base):
    """A device's client: numpy, onnx, onnxruntime-training and flwr; torch made unimportable in its process."""
    recipe = load_recipe("federated-digits", QUICK)
    shard = write_shard(recipe, 0, tmp_path / "shard0.npz")
    script = f"""
import sys
sys.modules["torch"] = None  # as on a device without torch: `import torch` fails, find_spec says absent
import numpy as np
from zoo.federated.client import local_update, node_artifacts
from zoo.ondevice.engine import OnnxTrainer
from zoo.recipes import load_recipe
from pathlib import Path
recipe = load_recipe("federated-digits", {QUICK!r})
base = Path({str(base)!r})
held = np.load({str(shard)!r})
start = OnnxTrainer(node_artifacts(Path({str(tmp_path / "node")!r}), base, "x" * 16), lr=1e-3).parameters()
params, losses = local_update(recipe, 0, 1, base, start, held["x"], held["y"], Path({str(tmp_path / "node")!r}))
assert losses[-1] < losses[0] and not np.array_equal(params, start)
assert sys.modules["torch"] is None and "deepspeed" not in sys.modules
print("trained without torch", losses[0], losses[-1])
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300,
                            env={**os.environ, "ZOO_HOME": str(tmp_path / "zoo-home")})
    assert result.returncode == 0 and "trained without torch" in result.stdout, result.stderr[-3000:]


def test_a_clientapp_process_loads_neither_torch_nor_deepspeed():
    """Where torch is installed, `import onnxruntime` (the training build) would load torch, DeepSpeed and MLflow for
    its ORTModule check: 9 s of CPU in every ClientApp of every round. The zoo imports onnxruntime without it, and
    leaves ORTModule importable afterwards."""
    script = ("import sys, zoo.federated.client, onnxruntime\n"
              "print(sorted(m for m in ('torch', 'deepspeed', 'mlflow') if m in sys.modules))\n"
              "print('onnxruntime.training.ortmodule' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0 and result.stdout.split("\n")[:2] == ["[]", "False"], result.stdout + result.stderr


def test_recipe_without_federated_section_is_refused(tmp_path):
    result = federated(tmp_path, "run", "--recipe", "fp32")
    assert result.returncode != 0 and "has no federated section" in result.stderr and "Traceback" not in result.stderr
