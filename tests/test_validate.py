"""`zoo validate` passes a good entry and fails, on the right row, each way an entry can go wrong; a store holding
only the primaries serves every variant (derived ones made from fp32 and checked against the card)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO, copy_of, shared_digits_entry, stopped_by_sigterm, zoo_cli
from zoo import catalog, docs
from zoo.cards import load_card
from zoo.evaluate import INT8_KERNELS, kernel_types
from zoo.metadata import read_metadata
from zoo.pointer import pointer_for, read_pointer
from zoo.kinds import KINDS

@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The run's built quick entry (tests/helpers.py shared_digits_entry: its card declares ort-training artifacts),
    its primaries published to a bare-repo LFS store (checkout left with pointers)."""
    root = tmp_path_factory.mktemp("validate")
    env = copy_of(shared_digits_entry(), root)
    store = root / "store.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(store)], check=True)
    out = zoo_cli("publish", "--all", "--to", str(store), env=env, check=True).stdout
    # primaries only: the trained files and int8-ptq (its calibration runs onnxruntime's native kernels)
    assert "model.int8-qat.onnx" in out and "model.int8-ptq.onnx" in out and "model.fp16.onnx" not in out, out
    size = sum(p.stat().st_size for p in (store / "lfs" / "objects").rglob("*") if p.is_file())
    assert f"{size:,} bytes" in " ".join(out.split()), out
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
    # A derived file this machine made before (in its cache) is made again: validation checks the derivation.
    assert json.loads(zoo_cli("fetch", "quick-digits", "--variant", "fp16", "--json", env=env,
                              check=True).stdout)["source"] == "derived from fp32"
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
    # the store holds primaries only: every other file was made from fp32 with the card's bytes, nothing skipped
    derived = {(r["variant"], r["detail"].split(" ")[0]) for r in rows if r["check"] == "derived"}
    assert derived == {("fp16", "model.fp16.onnx"),
                       ("ort-training", "model.ort-training.zip"), ("fp32", "model.opset13.onnx")}, derived
    assert all(r["ok"] and "equals the card" in r["detail"] for r in rows if r["check"] == "derived")
    assert not any(r["verdict"] == "skip" for r in rows)
    assert "checks passed, 0 failed, 0 skipped" in report.read_text()


def test_fetch_derives_what_the_store_lacks(published, tmp_path):
    env, entry = _copy(published, tmp_path)
    card = load_card(tmp_path / "entries" / "quick-digits" / "card.yaml")
    for key in ("fp16", "ort-training"):
        got = json.loads(zoo_cli("fetch", "quick-digits", "--variant", key, "--json", env=env, check=True).stdout)
        assert got["source"] == "derived from fp32" and got["sha256"] == card.variants[key].sha256, got
    stored = json.loads(zoo_cli("fetch", "quick-digits", "--variant", "int8-ptq", "--json", env=env, check=True).stdout)
    assert stored["source"] == env["ZOO_LFS_URL"]  # a stored kind: fetched, never re-derived on another CPU
    again = json.loads(zoo_cli("fetch", "quick-digits", "--variant", "fp16", "--json", env=env, check=True).stdout)
    assert again["source"] == "cache"  # cached like a download
    listed = json.loads(zoo_cli("fetch", "quick-digits", "--opset", "13", "--json", env=env, check=True).stdout)
    assert listed["source"] == "derived from fp32"
    assert listed["sha256"] == read_pointer(tmp_path / "entries" / "quick-digits" / "model.opset13.onnx").oid
    low = card.variants["fp32"].opset_range[0]
    other = json.loads(zoo_cli("fetch", "quick-digits", "--opset", str(low), "--json", env=env, check=True).stdout)
    assert other["source"].startswith("derived from fp32 (same predictions on 100.00% of 360")
    import onnx

    assert next(o.version for o in onnx.load(other["path"]).opset_import if o.domain in ("", "ai.onnx")) == low
    outside = zoo_cli("fetch", "quick-digits", "--opset", "21", env=env)
    assert outside.returncode == 1 and "is outside it" in outside.stderr


def test_derived_file_with_other_bytes_is_refused_and_not_cached(published, tmp_path):
    env, entry = _copy(published, tmp_path)
    card_path = tmp_path / "entries" / "quick-digits" / "card.yaml"
    card = yaml.safe_load(card_path.read_text())
    card["variants"]["fp16"]["sha256"] = "0" * 64
    card_path.write_text(yaml.safe_dump(card, sort_keys=False))
    result = zoo_cli("fetch", "quick-digits", "--variant", "fp16", env=env)
    assert result.returncode == 1 and "nothing was cached" in result.stderr and "Traceback" not in result.stderr
    home = tmp_path / "home"
    cached = [p.name for p in (home / "objects").rglob("*") if p.is_file()]
    assert "0" * 64 not in cached and len(cached) == 1  # only the verified fp32 download
    assert not [p for p in home.iterdir() if p.name.startswith("zoo-derive-")]


def test_check_store_lists_missing_and_corrupt(published, tmp_path):
    env, _ = _copy(published, tmp_path)
    store = tmp_path / "store.git"
    ok = zoo_cli("check-store", str(store), "--json", env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)["problems"] == []
    with_derived = zoo_cli("check-store", str(store), "--derived", "--json", env=env)
    assert with_derived.returncode == 1
    missing = {p["label"] for p in json.loads(with_derived.stdout)["problems"] if p["status"] == "missing"}
    assert missing == {"fp16", "ort-training", "fp32 opset 13"}
    oid = read_pointer(tmp_path / "entries" / "quick-digits" / "model.onnx").oid
    stored = store / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    stored.chmod(0o644)
    stored.write_bytes(stored.read_bytes()[:-1] + b"x")
    corrupt = zoo_cli("check-store", str(store), "--json", env=env)
    assert corrupt.returncode == 1
    assert [(p["label"], p["status"]) for p in json.loads(corrupt.stdout)["problems"]] == [("fp32", "corrupt")]


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
    claimed = card["variants"]["fp16"]["metrics"]["accuracy"] + 0.05
    card["variants"]["fp16"]["metrics"]["accuracy"] = min(1.0, claimed)  # cards hold accuracies in [0, 1]
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
    assert "error: 1 validation check failed" in result.stderr


@pytest.mark.beside  # make test: at idle priority beside the other parts (tests/conftest.py)
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
    assert {r["variant"] for r in rows if r["check"] == "accuracy"} == {"fp32", "int8-qat", "int8-ptq", "fp16",
                                                                         "ort-training"}


@pytest.mark.beside
def test_reproduce_rebuilds_the_recorded_commit(published, tmp_path):
    """`zoo reproduce` (and validation's reproduce rows): the card's commit rebuilt in a temporary worktree gives
    every file's sha256, full, and the same bytes on the same machine; the temporary worktrees leave nothing behind
    (the first rebuild once made the tracking store's experiment with its files in its worktree, deleted after it:
    the second rebuild's run wrote them there again), nor in the user's $ZOO_HOME."""
    env, _ = _copy(published, tmp_path)
    scratch = tmp_path / "scratch"  # the commands' temporary folders
    scratch.mkdir()
    env["TMPDIR"] = str(scratch)
    result = zoo_cli("validate", "--json", "--reproduce-budget", "100000", env=env, timeout=900)
    if not load_card(tmp_path / "entries" / "quick-digits" / "card.yaml").training.reproducible:
        # a work-in-progress tree (never CI's clean clone): the build was recorded as not reproducible, and says so
        assert result.returncode == 1
        assert [(r["check"], r["detail"].split(":")[0]) for r in _failed(result)] == \
            [("reproduce", "'quick-digits' was built from uncommitted changes (--allow-dirty)")]
        return
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [r for r in json.loads(result.stdout)["rows"] if r["check"] == "reproduce"]
    assert {r["variant"] for r in rows} == {"fp32", "int8-qat", "int8-ptq", "fp16", "ort-training", "*"}
    assert all(r["ok"] and "sha256 reproduced" in r["detail"] for r in rows), rows  # same machine and threads
    card = load_card(tmp_path / "entries" / "quick-digits" / "card.yaml")
    assert any(card.variants["int8-qat"].sha256 in r["detail"] for r in rows)  # printed in full
    worktrees = subprocess.run(["git", "worktree", "list"], capture_output=True, text=True, check=True).stdout
    assert "zoo-reproduce" not in worktrees  # the temporary worktree is gone
    cli = zoo_cli("reproduce", "quick-digits", env=env, timeout=900)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert f"card    {card.variants['fp32'].sha256}" in cli.stdout and f"rebuilt {card.variants['fp32'].sha256}" in cli.stdout
    assert [p.name for p in scratch.iterdir() if p.name.startswith("zoo-")] == []  # torchrun's own logs aside
    assert not (tmp_path / "home" / "mlflow.db").exists()  # a rebuild's tracking store is its own, removed with it


def test_validation_stopped_by_sigterm_says_so_and_leaves_nothing_behind(published, tmp_path):
    """`kill` (SIGTERM) sent to `zoo validate` while it checks an entry: one line, exit 143, and its scratch folder (a
    fetched copy of each entry: hundreds of MB for the catalog) removed, as after Ctrl-C. Python's default SIGTERM
    ended it at once and left the folder behind."""
    env, _ = _copy(published, tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    validation = subprocess.Popen([sys.executable, "-m", "zoo.cli", "validate"], cwd=REPO, text=True,
                                  env={**os.environ, **env, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
    err = stopped_by_sigterm(validation, lambda: bool(list(scratch.glob("zoo-validate-*/quick-digits/*"))),
                             "validation fetched no file of the entry")
    assert validation.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == "error: stopped: zoo received SIGTERM" and "Traceback" not in err, err
    assert list(scratch.iterdir()) == []


def test_a_kind_added_to_the_table_is_exported_validated_fetched_and_documented(published, tmp_path):
    """int8-dynamic is one entry of zoo.kinds.KINDS (and its tool): `zoo export` makes it from the store's fp32
    file, `zoo validate` runs its kind's checks, `zoo fetch` makes it again when no store has it, the docs show it."""
    env, entry = _copy(published, tmp_path)
    made = zoo_cli("export", "quick-digits", "--variant", "int8-dynamic", env=env, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    card = load_card(tmp_path / "entries" / "quick-digits" / "card.yaml")
    variant = card.variants["int8-dynamic"]
    path = tmp_path / "entries" / "quick-digits" / variant.file
    assert (variant.precision, variant.quantization, variant.file) == ("int8", "dynamic", "model.int8-dynamic.onnx")
    assert read_metadata(path)["zoo.variant"] == "int8-dynamic" and read_metadata(path)["zoo.quantization"].startswith("dynamic")
    assert kernel_types(path) & INT8_KERNELS, "an int8 file runs int8 kernels"
    assert abs(variant.metrics["accuracy"] - card.metric("fp32")) <= 0.01
    rows = json.loads(zoo_cli("validate", "--json", env=env, timeout=600).stdout)["rows"]
    mine = {r["check"]: r for r in rows if r["variant"] == "int8-dynamic"}
    assert {"sha256", "onnx.checker", "test_data_set_0", "accuracy", "int8 drop"} <= set(mine), mine
    assert all(r["ok"] for r in mine.values()), mine
    path.write_text(pointer_for(path).text())  # as published: the checkout holds a pointer, the store lacks it
    fetched = json.loads(zoo_cli("fetch", "quick-digits", "--variant", "int8-dynamic", "--json", env=env,
                                 check=True).stdout)
    assert fetched["source"] == "derived from fp32" and fetched["sha256"] == variant.sha256
    refused = zoo_cli("export", "quick-digits", "--variant", "int8-qat", env=env)
    assert refused.returncode != 0 and "zoo build quick-digits" in refused.stderr and "Traceback" not in refused.stderr
    page = docs.model_page(catalog.entries(tmp_path / "entries")["quick-digits"], {}, tmp_path)
    assert "| int8-dynamic | int8 dynamic |" in page and KINDS["int8-dynamic"].summary in page


def test_a_failing_run_names_a_failing_row_with_full_hashes(published, tmp_path):
    env, _ = _copy(published, tmp_path)
    card_path = tmp_path / "entries" / "quick-digits" / "card.yaml"
    card = yaml.safe_load(card_path.read_text())
    real = card["variants"]["fp16"]["sha256"]
    card["variants"]["fp16"]["metrics"]["accuracy"] = min(1.0, card["variants"]["fp16"]["metrics"]["accuracy"] + 0.05)
    card["variants"]["fp16"]["sha256"] = "f" * 64
    card_path.write_text(yaml.safe_dump(card, sort_keys=False))
    result = zoo_cli("validate", "--json", env=env, timeout=600)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    failed = _failed(result)
    first = failed[0]
    assert f"first: {first['entry']} {first['variant']} {first['check']}" in summary and not first["ok"]
    assert "matches the cards" not in summary  # a failing row is named, never a passing one
    sha = next(r for r in failed if r["variant"] == "fp16" and r["check"] == "sha256")
    assert real in sha["detail"] and "f" * 64 in sha["detail"]  # both hashes whole


@pytest.mark.ranks  # it takes both CPUs itself (tests/helpers.py all_cpus)
def test_entries_validated_side_by_side_report_as_one_run(tmp_path):
    """`zoo validate --jobs 2` (what CI runs): each entry in a process of its own, from the repository's store, the rows
    in the same order as one process gives them (cheapest entry first, the planned one last and counted apart)."""
    env = {"ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": ""}
    result = zoo_cli("validate", "digits-cnn", "bert-base", "--jobs", "2", "--json", env=env, timeout=600, ranks=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = json.loads(result.stdout)["rows"]
    entries = [r["entry"] for r in rows]
    assert entries[0] == "*" and entries[-1] == "bert-base" and set(entries[1:-1]) == {"digits-cnn"}
    assert rows[-1]["verdict"] == "planned" and not rows[-1]["skipped"]
    checks = {(r["variant"], r["check"]) for r in rows if r["entry"] == "digits-cnn"}
    for variant in catalog.get_card("digits-cnn").variants:
        assert (variant, "sha256") in checks, variant
    assert all(r["ok"] for r in rows) and not any(r["verdict"] == "skip" for r in rows)
    assert "[digits-cnn] validating" in result.stderr and "[bert-base] validating" in result.stderr
