"""The committed catalog: every card passes the schema, matches the manifest and its files' pointers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest
import yaml

from tests.helpers import (REPO, all_cpus, build_flags, catalog_env, copy_of, quick_recipe, run_use_it,
                           shared_digits_entry, stopped_by_sigterm, zoo_cli)
from zoo import catalog, docs
from zoo.cards import load_card
from zoo.provenance import current_versions
from zoo.recipes import Quantization
from zoo.pointer import pointer_for, read_pointer
from zoo.store.cache import lfs_objects, object_relpath

ENTRIES = sorted(p.parent.name for p in (REPO / "zoo" / "entries").glob("*/card.yaml"))


def test_catalog_is_not_empty():
    assert "digits-cnn" in ENTRIES


@pytest.mark.parametrize("name", ENTRIES)
def test_card_schema_manifest_and_pointers(name):
    card = load_card(REPO / "zoo" / "entries" / name / "card.yaml")
    manifest = {m["name"]: m for m in catalog.build_manifest(REPO / "zoo" / "entries")}
    assert manifest[name]["num_params"] == card.num_params
    for key, variant in card.variants.items():
        if not variant.built:
            continue
        path = REPO / "zoo" / "entries" / name / variant.file
        pointer = read_pointer(path) or pointer_for(path)  # a committed pointer, or a local build
        assert (pointer.oid, pointer.size) == (variant.sha256, variant.size), f"{name} {key}: file differs from card"
        int8_drop = card.metric("fp32") - card.metric(key)
        # the recipes' int8 rule (0.5 points, inclusive: 12 of 2,400 examples is exactly 0.005)
        assert variant.precision != "int8" or Quantization().allows(int8_drop) or "loss" in card.description, \
            f"{name} {key} loses {int8_drop:.3f} accuracy; the card must explain it"
    if any(v.built for v in card.variants.values()):
        assert (REPO / "zoo" / "entries" / name / "test_data_set_0" / "input_0.pb").exists()
        # reproducible by construction: a clean commit and the CPU are recorded; the fp32 opset range measured
        t = card.training
        assert t.reproducible is True and len(t.git_commit) == 40 and t.cpu and "avx2" in t.cpu.flags, name
        # the promise is only checkable if that commit is in main's history (a squashed or rebased history loses it)
        ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", t.git_commit, "HEAD"], cwd=REPO,
                                  capture_output=True)
        assert ancestor.returncode == 0, f"{name} was built at {t.git_commit}, which is not in this history: rebuild it"
        assert card.variants["fp32"].opset_range, name
    if card.family == "bert":
        for key, variant in card.variants.items():
            if variant.built and variant.precision == "int8":
                ratio = variant.size / card.variants["fp32"].size
                assert ratio <= 0.30, f"{name} {key} is {ratio:.0%} of fp32 (embedding tables must be int8 too)"


def test_readme_catalog_table_matches_cards():
    readme = (REPO / "README.md").read_text()
    assert catalog.readme_text(readme, REPO / "zoo" / "entries") == readme, "run `zoo manifest` and commit README.md"
    assert "| **catalog** |" in readme


def test_every_card_of_the_catalog_loads():
    # A broken card is set aside so that it breaks only its own entry (zoo.catalog): the project's own have none.
    assert catalog.broken(REPO / "zoo" / "entries") == {}


def test_catalog_primaries_fit_the_store():
    total = sum(catalog.primary_bytes(e) for e in catalog.entries(REPO / "zoo" / "entries").values())
    assert total <= 200 * 2**20, f"primaries {total / 2**20:.1f} MiB exceed the store's 200 MiB"


def test_build_writes_measured_card(tmp_path):
    env = copy_of(shared_digits_entry(), tmp_path)  # `zoo build` of a quick recipe, tracked (tests/helpers.py)
    entries = tmp_path / "entries"
    card = load_card(entries / "quick-digits" / "card.yaml")
    assert set(card.variants) == {"fp32", "int8-qat", "int8-ptq", "fp16", "ort-training"}
    onnx_models = card.inference_variants()
    assert set(onnx_models) == set(card.variants) - {"ort-training"}
    assert card.num_params == 38282 and card.dataset.splits == {"train": 1257, "val": 180, "test": 360}
    assert card.training.build_time_s > 0 and card.training.library_versions == current_versions()
    first = {k: v.sha256 for k, v in card.variants.items()}
    for row in json.loads(zoo_cli("evaluate", "quick-digits", "--json", env=env, check=True).stdout):
        assert row["delta"] == 0.0, row  # the card's numbers are what the files measure
    assert zoo_cli("manifest", "--check", env=env).returncode == 0
    assert all(len(sha) == 64 for sha in first.values())  # byte-for-byte reproducibility: tests/test_reproducible.py
    # Latency, every variant side by side: on the card, in `zoo card`, and behind `zoo fetch --fastest`.
    for key in onnx_models:
        speed = card.variants[key].speed
        assert speed.threads == card.training.threads and speed.runs >= 30, key
        assert all(speed.at(b).p90_ms >= speed.at(b).median_ms > 0 for b in (1, 32)), key
    assert card.variants["fp32"].speed.batch_1.vs_fp32 == 1.0
    shown = zoo_cli("card", "quick-digits", env=env, check=True).stdout
    assert "speed b1" in shown and f"{card.variants['int8-qat'].speed.batch_1.vs_fp32:.2f}x" in shown
    assert card.training.cpu.model in " ".join(shown.split())
    fastest = zoo_cli("fetch", "quick-digits", "--fastest", "--batch", "32", "--json", env=env, check=True)
    assert json.loads(fastest.stdout)["variant"] == card.fastest(32) and card.keeps_accuracy(card.fastest(32))
    assert f"fastest at batch 32: {card.fastest(32)}" in fastest.stderr
    assert len(run_use_it(entries, "quick-digits", tmp_path, env)) == 4  # the docs' "Use it" block, as written
    bad = zoo_cli("fetch", "quick-digits", "--fastest", "--batch", "7", env=env)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: --batch 7: cards record latency at batch 1 and 32; pick one of them"]

    # Tracking was on: the build registered every ONNX variant in the run's MLflow store, linked to that run.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")  # the build's store, copied
    versions = client.search_model_versions("name = 'zoo.quick-digits'")
    assert {v.tags["zoo.sha256"] for v in versions} == {card.variants[k].sha256 for k in onnx_models}
    runs = {v.run_id for v in versions}
    assert len(runs) == 1 and None not in runs  # one training run made them all
    run = client.get_run(runs.pop())
    assert run.data.params["recipe.name"] == "quick" and run.data.metrics["onnx/int8-qat/accuracy"] > 0.5
    # its files beside the store, in the build's $ZOO_HOME: not ./mlruns of the checkout the build ran in
    assert run.info.artifact_uri.startswith((shared_digits_entry() / "home" / "mlartifacts").as_uri() + "/")
    assert {"model.onnx", "summary.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    aliases = client.get_registered_model("zoo.quick-digits").aliases
    assert set(aliases) == set(onnx_models) | {"fastest"}


def test_build_refuses_a_recipe_that_measures_part_of_the_split(tmp_path):
    """eval_examples (quick runs measured on part of the eval split) never reaches a card: `zoo build` says so in one
    line before any rank starts, and writes nothing."""
    recipe = quick_recipe(tmp_path, steps=10)
    recipe.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "eval_examples": 100}))
    entries = tmp_path / "entries"
    (entries / "partial").mkdir(parents=True)
    card = {"name": "partial", "architecture": "digits-cnn", "family": "cnn", "task": "image-classification",
            "description": "test build", "license": "Apache-2.0", "training": {"recipe": str(recipe)}}
    (entries / "partial" / "card.yaml").write_text(yaml.safe_dump(card))
    refused = zoo_cli("build", "partial", *build_flags(), env=catalog_env(tmp_path), ranks=False)
    assert refused.returncode == 1 and refused.stdout == "" and refused.stderr.strip().splitlines() == [
        f"error: {recipe}: eval_examples=100 measures part of the test split; a card's numbers are measured on all of "
        "it: remove eval_examples from the recipe"]
    assert sorted(p.name for p in (entries / "partial").iterdir()) == ["card.yaml"]
    assert yaml.safe_load((entries / "partial" / "card.yaml").read_text()) == card


@pytest.mark.ranks  # `zoo build` starts two ranks
def test_build_continues_from_a_published_file_and_the_card_names_it(tmp_path):
    """A recipe whose init_from names a published fp32 file by content: `zoo build` fetches it (here from a store), the
    run starts from its weights, and the card and its page name it; a file no store has stops the build in one line,
    before any rank starts."""
    shared = shared_digits_entry() / "entries" / "quick-digits"
    published = load_card(shared / "card.yaml").variants["fp32"]
    store = tmp_path / "store"
    (lfs_objects(store) / object_relpath(published.sha256)).parent.mkdir(parents=True)
    shutil.copyfile(shared / published.file, lfs_objects(store) / object_relpath(published.sha256))
    start = {"entry": "quick-digits", "variant": "fp32", "sha256": published.sha256, "size": published.size}
    recipe = quick_recipe(tmp_path, steps=10)
    data = yaml.safe_load(recipe.read_text())  # what starts training is under test, not QAT: fp32 only
    data["quantization"]["scheme"], data["export"]["variants"] = "none", ["fp32"]
    recipe.write_text(yaml.safe_dump({**data, "init_from": start}))
    entries = tmp_path / "entries"
    (entries / "continued").mkdir(parents=True)
    (entries / "continued" / "card.yaml").write_text(yaml.safe_dump({
        "name": "continued", "architecture": "digits-cnn", "family": "cnn", "task": "image-classification",
        "description": "test build", "license": "Apache-2.0", "training": {"recipe": str(recipe)}}))
    env = {**catalog_env(tmp_path), "ZOO_STORE": str(store)}
    zoo_cli("build", "continued", *build_flags(), env=env, check=True, timeout=600)
    card = load_card(entries / "continued" / "card.yaml")
    assert card.training.continued_from.model_dump() == start
    # From the published weights, not from scratch: the first loss is already low (a fresh digits-cnn starts at ln 10).
    curve = json.loads((entries / "continued" / "training_curve.json").read_text())
    assert curve["fp32"]["loss"][0] < 0.5, curve["fp32"]["loss"][:3]
    assert card.metric("fp32") > 0.9
    page = docs.model_page(catalog.entries(entries)["continued"], {}, tmp_path)
    assert f"Training continued from the `fp32` file `quick-digits` published before (sha256 `{published.sha256}`" in page
    recipe.write_text(yaml.safe_dump({**data, "init_from": {**start, "sha256": "0" * 64}}))
    said = ("error: init_from: quick-digits fp32 (sha256 000000000000) is in none of the stores `zoo fetch` reads and "
            "in no commit of this checkout's store/ (a shallow clone lacks the older ones: `git fetch --unshallow`)")
    missing = zoo_cli("build", "continued", *build_flags(), env=env, ranks=False)
    assert missing.returncode == 1 and missing.stdout == "" and missing.stderr.strip().splitlines() == [said]
    refused = zoo_cli("train", "--nproc-per-node", "2", "--recipe", str(recipe), "--no-tracking", env=env, ranks=False)
    assert refused.returncode == 1 and refused.stdout == "" and refused.stderr.strip().splitlines() == [said]


@pytest.mark.ranks  # `zoo build` starts two ranks
def test_a_build_stopped_by_sigterm_stops_its_ranks_and_keeps_nothing(tmp_path):
    """`kill` (SIGTERM) sent to a `zoo build` while its ranks train: zoo passes it on to torchrun, which stops the ranks;
    zoo then says so in one line and exits 143, no process of the build is left, and its temporary run folder is
    gone (Python's default SIGTERM would have ended zoo alone, leaving both behind)."""
    recipe = quick_recipe(tmp_path, steps=100_000)
    data = yaml.safe_load(recipe.read_text())
    data["quantization"]["scheme"], data["export"]["variants"] = "none", ["fp32"]
    recipe.write_text(yaml.safe_dump(data))
    (tmp_path / "entries" / "long").mkdir(parents=True)
    (tmp_path / "entries" / "long" / "card.yaml").write_text(yaml.safe_dump({
        "name": "long", "architecture": "digits-cnn", "family": "cnn", "task": "image-classification",
        "description": "test build", "license": "Apache-2.0", "training": {"recipe": str(recipe)}}))
    tmp = tmp_path / "tmp"
    tmp.mkdir()

    def build_processes() -> list[psutil.Process]:  # torchrun and its ranks: their command lines name the run folder
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with_tmp = any(str(tmp) in part for part in proc.info["cmdline"] or [])
            if with_tmp and proc.pid != build.pid:
                found.append(proc)
        return found

    with all_cpus():
        build = subprocess.Popen([sys.executable, "-m", "zoo.cli", "build", "long", *build_flags()], cwd=REPO,
                                 env={**os.environ, **catalog_env(tmp_path), "TMPDIR": str(tmp)},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        running = []

        def training() -> bool:  # torchrun and two ranks, training: seen before the signal
            if list(tmp.glob("zoo-build-long-*/run/checkpoints")):
                running.extend(build_processes())
                assert len(running) >= 3, running
                return True
            return False

        err = stopped_by_sigterm(build, training, "the ranks wrote no checkpoint")
    lines = err.strip().splitlines()
    assert build.returncode == 143, err[-2000:]
    assert lines[-1] == ("error: building 'long' stopped: zoo received SIGTERM and passed it on to `torchrun`, which "
                         f"exited {lines[-1].rsplit(' ', 1)[-1]}"), err[-2000:]
    assert "zoo/build.py" not in err and "zoo/processes.py" not in err  # torchrun's log may have a trace; zoo none
    gone, alive = psutil.wait_procs(running, timeout=30)
    assert not alive and not build_processes(), alive
    assert not list(tmp.glob("zoo-build-*")), list(tmp.iterdir())
