"""`zoo validate` passes a good entry and fails, on the right row, each way an entry can go wrong."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from tests.helpers import quick_digits_entry, zoo_cli
from zoo.store.pointer import read_pointer


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A built entry, published to a bare-repo LFS store (checkout left with pointers)."""
    root = tmp_path_factory.mktemp("validate")
    env = quick_digits_entry(root)
    store = root / "store.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(store)], check=True)
    zoo_cli("publish", "quick-digits", "--to", str(store), env=env, check=True)
    return root, env, store


def _copy(published, tmp_path) -> tuple[dict, str]:
    root, env, store = published
    shutil.copytree(root / "entries", tmp_path / "entries")
    shutil.copytree(store, tmp_path / "store.git")
    return {"ZOO_ENTRIES": str(tmp_path / "entries"), "ZOO_HOME": str(tmp_path / "home"),
            "ZOO_LFS_URL": str(tmp_path / "store.git")}, str(tmp_path / "entries" / "quick-digits")


def _failed(result) -> list[dict]:
    return [r for r in json.loads(result.stdout)["rows"] if not r["ok"]]


def test_good_entry_passes_with_report(published, tmp_path):
    env, _ = _copy(published, tmp_path)
    report = tmp_path / "report.md"
    result = zoo_cli("validate", "--json", "--report", str(report), env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = json.loads(result.stdout)["rows"]
    checks = {(r["variant"], r["check"]) for r in rows}
    for variant in ("fp32", "int8-qat", "int8-ptq", "fp16"):
        assert {(variant, "sha256"), (variant, "onnx.checker"), (variant, "accuracy"), (variant, "test_data_set_0")} <= checks
    assert ("fp32", "opset 13") in checks and ("int8-qat", "int8 drop") in checks
    # the fp32 file trains with onnxruntime-training (artifacts from its zoo.trainable split)
    ort = next(r for r in rows if r["check"] == "ort-training")
    assert ort["ok"] and ort["measured"] < ort["card"], ort
    assert "checks passed, 0 failed" in report.read_text()


def test_tampered_weight_fails(published, tmp_path):
    env, entry = _copy(published, tmp_path)
    oid = read_pointer(tmp_path / "entries" / "quick-digits" / "model.int8-qat.onnx").oid
    stored = tmp_path / "store.git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    data = bytearray(stored.read_bytes())
    data[-100] ^= 0x01
    stored.chmod(0o644)
    stored.write_bytes(bytes(data))
    result = zoo_cli("validate", "--json", env=env, timeout=600)
    assert result.returncode == 1
    failed = _failed(result)
    assert failed[0]["variant"] == "int8-qat" and failed[0]["check"] == "sha256"


def test_card_claiming_more_than_measured_fails(published, tmp_path):
    env, entry = _copy(published, tmp_path)
    card_path = tmp_path / "entries" / "quick-digits" / "card.yaml"
    card = yaml.safe_load(card_path.read_text())
    card["variants"]["fp16"]["metrics"]["accuracy"] += 0.05
    card_path.write_text(yaml.safe_dump(card, sort_keys=False))
    zoo_cli("manifest", env=env, check=True)  # keep the manifest in step: only the claim is wrong
    result = zoo_cli("validate", "--json", env=env, timeout=600)
    assert result.returncode == 1
    assert [(r["variant"], r["check"]) for r in _failed(result)] == [("fp16", "accuracy")]


def test_drifted_manifest_fails(published, tmp_path):
    env, _ = _copy(published, tmp_path)
    manifest = tmp_path / "entries" / "MANIFEST.json"
    data = json.loads(manifest.read_text())
    data[0]["num_params"] += 1
    manifest.write_text(json.dumps(data, indent=2) + "\n")
    result = zoo_cli("validate", "--json", env=env, timeout=600)
    assert result.returncode == 1
    assert [(r["entry"], r["check"]) for r in _failed(result)] == [("*", "manifest")]


def test_missing_test_data_set_fails(published, tmp_path):
    env, _ = _copy(published, tmp_path)
    shutil.rmtree(tmp_path / "entries" / "quick-digits" / "test_data_set_0")
    result = zoo_cli("validate", "--json", env=env, timeout=600)
    assert result.returncode == 1
    assert [(r["variant"], r["check"]) for r in _failed(result)] == [("*", "test data")]
    assert "error: 1 validation check(s) failed" in result.stderr


def test_without_store_rebuilds_or_reports_skip(published, tmp_path):
    env, _ = _copy(published, tmp_path)
    env["ZOO_LFS_URL"] = ""  # no store: the checkout holds only pointers
    skipped = zoo_cli("validate", "--json", "--rebuild-budget", "1", env=env, timeout=600)
    assert skipped.returncode == 0
    rows = json.loads(skipped.stdout)["rows"]
    assert any(r["check"] == "obtain" and r["verdict"] == "skip" and "budget" in r["detail"] for r in rows)
    rebuilt = zoo_cli("validate", "--json", env=env, timeout=900)
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    rows = json.loads(rebuilt.stdout)["rows"]
    assert any(r["check"] == "obtain" and "rebuilt" in r["detail"] for r in rows)
    assert {r["variant"] for r in rows if r["check"] == "accuracy"} == {"fp32", "int8-qat", "int8-ptq", "fp16"}


def test_reproduce_rebuilds_cheap_entries_from_scratch(published, tmp_path):
    env, _ = _copy(published, tmp_path)
    result = zoo_cli("validate", "--json", "--reproduce-budget", "100000", env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [r for r in json.loads(result.stdout)["rows"] if r["check"] == "reproduce"]
    assert {r["variant"] for r in rows} == {"fp32", "int8-qat", "int8-ptq", "fp16"}
    assert all("sha256 reproduced" in r["detail"] for r in rows)  # same machine, same threads: same bytes
