"""The recipe as the last mirror (zoo.store.build_on_miss): `zoo fetch` builds a file no store has from the entry's recipe
at the card's commit, verifies it like a download, resumes a killed build, builds once for concurrent fetches, and
keeps other bytes apart from the card's. Real builds of digits-cnn (about a minute each) in real git worktrees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, wall_limit
from zoo import catalog
from zoo.provenance import commit_available, machine_differences
from zoo.store.cache import ObjectCache

ENTRY = "digits-cnn"


@pytest.fixture
def no_store(tmp_path, monkeypatch):
    """The real catalog, an empty cache and no store at all: the recipe is the only mirror."""
    env = {**os.environ, "ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": "", "ZOO_STORE": ""}
    env.pop("ZOO_ENTRIES", None)
    env.pop("ZOO_BUILD_ON_MISS", None)
    env.pop("ZOO_TEST_FAULT", None)
    monkeypatch.delenv("ZOO_ENTRIES", raising=False)
    catalog.reload()
    card = catalog.get_card(ENTRY)
    if not commit_available(card.training.git_commit):
        pytest.fail(f"the card's commit {card.training.git_commit} is not in this clone: the tests need full history")
    yield env, card
    catalog.reload()


def fetch(env: dict, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zoo.cli", "fetch", ENTRY, "--json", *args], cwd=REPO,
                            env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, dict | None, str]:
    stdout, stderr = process.communicate(timeout=wall_limit(timeout))
    return process.returncode, json.loads(stdout) if process.returncode == 0 else None, stderr


def test_no_store_and_no_build_gives_the_short_not_found_error(no_store):
    env, card = no_store
    for args, extra in [(["--no-build"], {}), ([], {}), ([], {"ZOO_BUILD_ON_MISS": "never"})]:
        code, _, stderr = finish(fetch(env, *args, **extra), timeout=120)
        assert code != 0
        assert f"{ENTRY} fp32 (sha256 {card.variants['fp32'].sha256}) is in no store" in stderr
        assert "Traceback" not in stderr and "running `torchrun" not in stderr
    # Not on a terminal, the default (ask) says how to allow the build instead of starting it.
    _, _, stderr = finish(fetch(env), timeout=120)
    assert "pass --build (or set ZOO_BUILD_ON_MISS=always)" in stderr and f"zoo fetch {ENTRY} --build" in stderr
    assert "the card's build took" in stderr
    code, _, stderr = finish(fetch(env, **{"ZOO_BUILD_ON_MISS": "sometimes"}), timeout=120)
    assert code != 0 and "ZOO_BUILD_ON_MISS='sometimes' is not one of ask, always, never" in stderr
    assert not (env_home(env) / "objects").exists() and not (env_home(env) / "builds").exists()


def env_home(env: dict) -> Path:
    return Path(env["ZOO_HOME"])


@pytest.mark.beside  # make test: at idle priority beside the other parts (tests/conftest.py): builds, no server
def test_killed_build_resumes_and_concurrent_fetches_build_once(no_store):
    env, card = no_store
    cache = ObjectCache(root=env_home(env))
    # A build killed mid-training (rank 0 dies before step 150; the recipe checkpoints every 100) fails cleanly.
    code, _, stderr = finish(fetch(env, "--build", ZOO_TEST_FAULT="train-step@0:150"))
    assert code != 0 and "fetch again to resume" in stderr
    assert not cache.path(card.variants["fp32"].sha256).exists()  # nothing half-written reached the cache
    # Two fetches at once: one resumes the build from its checkpoint, the other waits and gets the verified object.
    first, second = fetch(env, "--build"), fetch(env, "--build", "--variant", "int8-qat")
    results = [finish(first), finish(second)]
    for code, result, stderr in results:
        assert code == 0, stderr[-3000:]
    logs = results[0][2] + results[1][2]
    assert logs.count("resuming `torchrun") == 1 and "running `torchrun" not in logs, logs[-3000:]
    assert "resumed from the checkpoint at step 100" in logs
    fp32, qat = results[0][1], results[1][1]
    differences = machine_differences(card.training)
    if not differences:  # the machine the card was built on: the card's exact bytes, cached like a download
        assert fp32["sha256"] == card.variants["fp32"].sha256 and qat["sha256"] == card.variants["int8-qat"].sha256
        assert fp32["path"] == str(cache.path(fp32["sha256"])) and qat["path"] == str(cache.path(qat["sha256"]))
        assert "same sha256 as the card" in fp32["source"] + qat["source"]
    elif fp32["sha256"] != card.variants["fp32"].sha256:  # another CPU kind or library: kept apart, labelled
        assert fp32["source"].startswith("rebuilt locally: differs from the published bytes"), (differences, fp32)
        assert not cache.path(card.variants["fp32"].sha256).exists()
    # The next fetch needs no store and no build; the build folder is gone.
    code, again, stderr = finish(fetch(env, "--no-build"), timeout=120)
    assert code == 0 and again["path"] == fp32["path"]
    assert again["source"] == ("cache" if fp32["sha256"] == card.variants["fp32"].sha256 else fp32["source"])
    assert not (env_home(env) / "builds").exists() or not any((env_home(env) / "builds").iterdir())


@pytest.mark.beside
def test_other_cpu_bytes_are_kept_apart_as_a_local_build(no_store):
    env, card = no_store
    cache = ObjectCache(root=env_home(env))
    code, result, stderr = finish(fetch(env, "--build", ZOO_TEST_FAULT="build-cpu@0"))
    assert code == 0, stderr[-3000:]
    published = card.variants["fp32"]
    assert result["source"].startswith("rebuilt locally: differs from the published bytes (CPU ")
    assert "torch kernels of a CPU without AVX" in result["source"]
    assert f"vs card {published.metrics['accuracy']:.4f}" in result["source"]
    assert result["sha256"] != published.sha256
    assert not cache.path(published.sha256).exists()  # never cached under the card's sha256
    assert "local-builds" in result["path"]
    # The local build is served again without another build, still labelled as such.
    code, again, stderr = finish(fetch(env, "--no-build"), timeout=120)
    assert code == 0 and again["path"] == result["path"] and again["source"] == result["source"]
    assert "running `torchrun" not in stderr


@pytest.mark.beside  # make test: at idle priority beside the other parts (tests/conftest.py)
def test_an_imported_entry_is_built_from_its_installed_checkpoint(tmp_path):
    """In a clone: a tiny imported entry (its upstream checkpoint in the local Hugging Face hub cache, as `make setup`
    installs minilm-l6's). Without `import_source` on its card `zoo build` refuses and names `zoo import`; `zoo import
    --from hf:<repo id> --nproc 1` at a clean commit checks the conversion's parity and builds it; then, its files only
    pointers and no store anywhere, `zoo fetch --build` converts the checkpoint with the card commit's code, fine-tunes
    it with the process count the card recorded (two processes would train other bytes), and returns the card's bytes.
    One process: the test runs beside another (the builds of two processes are tested on the real entries)."""
    import yaml

    from tests.test_families import _in_hub_cache
    from zoo.cards import load_card
    from zoo.models import build_model

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    git = lambda *args: subprocess.run(["git", *args], cwd=clone, check=True, capture_output=True)  # noqa: E731
    git("config", "user.name", "test")
    git("config", "user.email", "test@127.0.0.1")
    _in_hub_cache(tmp_path / "hub", "zoo-test/tiny-bert")
    recipe = yaml.safe_load((clone / "recipes" / "minilm-l6.yaml").read_text())
    recipe.update(name="tiny-import", steps=8, model_args={"num_hidden_layers": 2, "hidden_size": 64,
                  "num_attention_heads": 2, "intermediate_size": 128, "pooling": "mean"}, tracking={"enabled": False})
    recipe.pop("epochs", None)
    recipe["quantization"]["qat_steps"] = 3
    recipe["export"].update(opsets=[17], variants=["fp32", "int8-qat"])
    (clone / "recipes" / "tiny-import.yaml").write_text(yaml.safe_dump(recipe))
    folder = clone / "zoo" / "entries" / "tiny-import"
    folder.mkdir()
    training = {"recipe": "tiny-import", "imported_from": "a random tiny BertModel"}
    written = {"name": "tiny-import", "architecture": "bert", "family": "bert", "task": "language-identification",
               "description": "imported in a test", "license": "Apache-2.0", "trainable": ["classifier.*"],
               "training": training}
    env = {**os.environ, "PYTHONPATH": str(clone), "ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": "",
           "ZOO_STORE": "", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    for key in ("ZOO_ENTRIES", "ZOO_BUILD_ON_MISS", "ZOO_TEST_FAULT"):
        env.pop(key, None)

    def zoo(*args: str, home: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zoo.cli", *args], cwd=clone, capture_output=True, text=True,
                              env={**env, "ZOO_HOME": str(tmp_path / home)}, timeout=wall_limit(900))

    # An imported card that does not say where its checkpoint is: only `zoo import` can build it.
    (folder / "card.yaml").write_text(yaml.safe_dump(written))
    refused = zoo("build", "tiny-import", "--allow-dirty", home="home")
    assert refused.returncode == 1 and "zoo import tiny-import --from" in refused.stderr, refused.stderr
    (folder / "card.yaml").write_text(yaml.safe_dump({**written, "training": {
        **training, "import_source": "hf:zoo-test/tiny-bert"}}))
    git("add", "-A")
    git("commit", "-qm", "tiny-import")

    built = zoo("import", "tiny-import", "--from", "hf:zoo-test/tiny-bert", "--nproc", "1", home="home")
    assert built.returncode == 0, built.stderr[-3000:]
    card = yaml.safe_load((folder / "card.yaml").read_text())
    assert card["training"]["reproducible"]
    assert card["training"]["command"] == "zoo import tiny-import --from <checkpoint dir> --nproc 1", card["training"]
    for key, variant in load_card(folder / "card.yaml").variants.items():
        assert variant.built and variant.metrics["parity_onnx_max_abs_diff"] < 1e-4, key
    assert card["num_params"] == sum(p.numel() for p in build_model("bert", 8, **recipe["model_args"]).parameters())
    for key in ("fp32", "int8-qat"):  # the checkout keeps pointers only, as after publishing elsewhere
        path = folder / card["variants"][key]["file"]
        path.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{card['variants'][key]['sha256']}\n"
                        f"size {card['variants'][key]['size']}\n")
    refused = zoo("fetch", "tiny-import", "--no-build", home="empty")
    assert refused.returncode == 1 and "convert hf:zoo-test/tiny-bert, then" in refused.stderr, refused.stderr
    fetched = zoo("fetch", "tiny-import", "--build", "--json", home="empty")
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    result = json.loads(fetched.stdout)
    assert result["sha256"] == card["variants"]["fp32"]["sha256"], result  # this machine, this commit: same bytes
    assert "built from its recipe" in result["source"] and "init_from=" in fetched.stderr
    assert "torchrun --standalone --nproc_per_node=1 " in fetched.stderr, fetched.stderr[-3000:]
