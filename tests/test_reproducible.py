"""Reproducible by construction: a build records the clean commit it ran from and the CPU, stamps that commit, and
two separate clean clones of one commit build the very same bytes (zip archives included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ARTIFACTS, REPO, quick_recipe, side_by_side
from zoo.cards import load_card
from zoo.metadata import read_metadata
from zoo.provenance import TreeState
from zoo.pointer import pointer_for

HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
CARD = {"name": "quick-digits", "architecture": "digits-cnn", "family": "cnn", "task": "image-classification",
        "description": "test build", "license": "Apache-2.0",
        "variants": ARTIFACTS}


def _clone(root: Path) -> Path:
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(root)], check=True)
    return root


def _build_job(clone: Path, entries: Path, recipe: Path, *extra: str) -> tuple[list[str], dict, Path]:
    """`zoo build` run by the clone's own code, writing into a catalog outside it (ZOO_HOME beside the catalog)."""
    (entries / "quick-digits").mkdir(parents=True, exist_ok=True)
    card = entries / "quick-digits" / "card.yaml"
    if not card.exists():
        card.write_text(yaml.safe_dump({**CARD, "training": {"recipe": str(recipe)}}))
    env = {**os.environ, "PYTHONPATH": str(clone), "ZOO_ENTRIES": str(entries),
           "ZOO_HOME": str(entries.with_name(f"{entries.name}-home")), "ZOO_LFS_URL": "", "ZOO_STORE": ""}
    return [sys.executable, "-m", "zoo.cli", "build", "quick-digits", *extra], env, clone


def _build(clone: Path, entries: Path, recipe: Path, *extra: str) -> subprocess.CompletedProcess:
    command, env, cwd = _build_job(clone, entries, recipe, *extra)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): pointer_for(p).oid for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "card.yaml"}


@pytest.mark.beside  # make test: at idle priority beside the other parts (tests/conftest.py): builds, no server
def test_two_clean_clones_build_identical_bytes(tmp_path):
    recipe = quick_recipe(tmp_path, steps=30, qat_steps=5)  # the bytes, not the accuracy, are what is compared
    # Side by side, as two machines would build (tests/helpers.py side_by_side).
    jobs = [_build_job(_clone(tmp_path / f"clone-{name}"), tmp_path / f"entries-{name}", recipe) for name in "ab"]
    for result in side_by_side(*jobs, timeout=900):
        assert result.returncode == 0, result.stderr[-3000:]
    builds = [tmp_path / f"entries-{name}" / "quick-digits" for name in "ab"]
    first, second = (_files(b) for b in builds)
    assert {"model.onnx", "model.int8-qat.onnx", "model.int8-ptq.onnx", "model.fp16.onnx", "model.opset13.onnx",
            "model.ort-training.zip", "test_data_set_0/input_0.pb"} <= set(first)
    assert first == second, "one commit, two clean clones: every file's sha256 must be equal"
    card = load_card(builds[0] / "card.yaml")
    assert card.training.git_commit == HEAD and card.training.reproducible is True
    assert card.training.cpu is not None and card.training.cpu.model and "avx2" in card.training.cpu.flags
    assert card.training.cpu.kernels.startswith("torch pinned to avx2")
    for key in ("fp32", "int8-qat", "int8-ptq", "fp16"):
        assert read_metadata(builds[0] / card.variants[key].file)["zoo.git_commit"] == HEAD, key
    low, high = card.variants["fp32"].opset_range
    assert low <= 13 and high >= 17


def test_dirty_tree_is_refused_and_allow_dirty_is_recorded(tmp_path):  # refused before any rank starts
    recipe = quick_recipe(tmp_path, steps=30, qat_steps=5)
    clone = _clone(tmp_path / "clone")
    (clone / "zoo" / "stray.py").write_text("# an uncommitted change\n")
    entries = tmp_path / "entries"
    refused = _build(clone, entries, recipe)
    assert refused.returncode == 1
    message = refused.stderr.strip().splitlines()
    assert len(message) == 1 and "uncommitted changes outside the entries being built (zoo/stray.py)" in message[0]
    assert "--allow-dirty" in message[0] and "Traceback" not in refused.stderr
    assert sorted(p.name for p in (entries / "quick-digits").iterdir()) == ["card.yaml"], "nothing written"
    # --allow-dirty: the commit is stamped with '-dirty' and the build recorded as not reproducible
    # (a whole --allow-dirty build runs in tests/test_validate.py whenever the developer's tree is dirty)
    probe = ("from zoo.provenance import require_clean; from zoo.build import build_paths; "
             "print(*require_clean(build_paths(['quick-digits']), True))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=clone, env={**os.environ, "PYTHONPATH": str(clone)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"{HEAD}-dirty", "False"]


def test_changes_inside_the_entries_being_built_are_allowed():
    state = TreeState("c0ffee", ("zoo/entries/a/model.onnx", "zoo/entries/MANIFEST.json", "README.md", "zoo/build.py"))
    allowed = [REPO / "zoo" / "entries" / "a", REPO / "zoo" / "entries" / "MANIFEST.json", REPO / "README.md"]
    assert state.outside(allowed) == ["zoo/build.py"]
    assert TreeState("c0ffee", ("zoo/entries/b/card.yaml",)).outside(allowed) == ["zoo/entries/b/card.yaml"]
