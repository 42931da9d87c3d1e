"""The repository's store (store/): what the cards name is there, whole, and nothing else; fetch reads it in place,
plain git-lfs reads it, publishing writes it as one commit, and the kinds made on fetch do not depend on onnxruntime's
kernels."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, write_entry, zoo_cli
from zoo import catalog
from zoo.errors import IntegrityError
from zoo.pointer import Pointer, pointer_for, read_pointer, sha256_file
from zoo.store.cache import ObjectCache
from zoo.store.history import from_history
from zoo.store.publish import named_objects, stored_objects

STORE = REPO / "store"
MAX_STORE_BYTES = 200 * 2**20
# Entries whose cards name objects this store does not hold yet, and why. Each must really lack objects (the test
# below fails once it is published, so the list only shrinks).
AWAITING_PUBLICATION: dict[str, str] = {}


def _published() -> list[str]:
    return [n for n, e in catalog.entries(REPO / "zoo" / "entries").items()
            if any(v.built for v in e.card.variants.values()) and n not in AWAITING_PUBLICATION]


def test_the_store_holds_exactly_what_the_cards_name():
    named = named_objects()
    stored = stored_objects(STORE)
    for oid, path in stored.items():
        assert not path.is_symlink() and path.is_file(), f"{path}: a store holds plain files"
        assert path.relative_to(STORE).parts == ("lfs", "objects", oid[:2], oid[2:4], oid), f"{path}: not git-lfs's layout"
        assert oid in named, f"{path}: no card or pointer names it; `zoo publish` prunes it (never commit it)"
        assert sha256_file(path) == oid, f"{path}: its bytes do not hash to its name"
    by_entry: dict[str, list[str]] = {}
    for oid, label in named.items():
        if oid not in stored:
            by_entry.setdefault(label.split()[0], []).append(label)
    for name, labels in by_entry.items():
        assert name in AWAITING_PUBLICATION, f"{name}: the store lacks {', '.join(labels)}: publish it (`zoo publish {name}`)"
    for name in AWAITING_PUBLICATION:
        assert name in by_entry, f"{name} is published now: remove it from AWAITING_PUBLICATION"
    assert _published(), "the store serves no entry"
    tree = sum(p.stat().st_size for p in STORE.rglob("*") if p.is_file())
    assert tree <= MAX_STORE_BYTES, f"store/ holds {tree / 2**20:.1f} MiB, over the {MAX_STORE_BYTES / 2**20:.0f} MiB policy"


def test_every_primary_fetches_from_the_store_in_place(tmp_path):
    """From an empty cache and no mirror: every published entry's stored files come from store/, read where they lie
    (nothing copied into the cache, nothing in store/ changed). The kinds made from fp32 are fetched and checked for
    every entry by ci/validate.sh (`make test`)."""
    script = textwrap.dedent("""
        import json
        from zoo import catalog
        from zoo.store.fetch import fetch
        from zoo.kinds import is_primary
        rows = []
        for name in json.loads(__import__("sys").argv[1]):
            for key, v in catalog.get_card(name).variants.items():
                if v.built and is_primary(key, v):
                    got = fetch(name, key, show_progress=False)
                    rows.append([name, key, got.sha256, v.sha256, got.source, str(got.path)])
        print(json.dumps(rows))
    """)
    before = subprocess.run(["git", "status", "--porcelain", "--", "store"], cwd=REPO, capture_output=True, text=True)
    env = {**os.environ, "ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": ""}
    env.pop("ZOO_STORE", None)
    env.pop("ZOO_ENTRIES", None)
    result = subprocess.run([sys.executable, "-c", script, json.dumps(_published())], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)
    assert {r[0] for r in rows} == set(_published())
    for name, key, got, card, source, path in rows:
        assert got == card, f"{name} {key}"
        assert source.startswith("repository store") and Path(path).is_relative_to(STORE), (name, key, source)
    assert not list((tmp_path / "home").rglob("objects/*/*/*")), "read in place: nothing is copied into the cache"
    after = subprocess.run(["git", "status", "--porcelain", "--", "store"], cwd=REPO, capture_output=True, text=True)
    assert after.stdout == before.stdout
    info = zoo_cli("info", rows[0][0], env={"ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": ""}, check=True)
    assert "(the repository's store)" in info.stdout


def test_plain_git_lfs_pulls_the_cards_bytes_from_the_store(tmp_path):
    """git-lfs's own file transfer reads store/ (it looks like a bare repository to git), with no zoo code."""
    name = _published()[0]
    card = catalog.get_card(name)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "lfs", "install", "--local"], cwd=clone, check=True, capture_output=True)
    rel = f"zoo/entries/{name}/{card.variants['fp32'].file}"
    assert read_pointer(clone / rel) is not None  # a clone never downloads weights by itself (.lfsconfig)
    pulled = subprocess.run(["git", "-c", f"lfs.url=file://{clone / 'store'}", "-c", "lfs.fetchexclude=", "lfs", "pull",
                             "--include", rel], cwd=clone, capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
    assert pointer_for(clone / rel).oid == card.variants["fp32"].sha256
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == ""  # store/ untouched, the pulled file equals what its pointer names


def _store_with(tmp_path: Path, oid: str, content: bytes | None = None, link_to: Path | None = None) -> Path:
    store = tmp_path / "repo-store"
    target = store / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    target.parent.mkdir(parents=True)
    if link_to is not None:
        target.symlink_to(link_to)
    else:
        target.write_bytes(content)
    return store


def test_a_bad_store_object_is_refused_by_name_and_the_next_store_serves(zoo_env, tmp_path):
    folder = write_entry(zoo_env["entries"], "tiny")
    pointer = pointer_for(folder / "model.onnx")
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(mirror)], check=True)
    zoo_cli("publish", "tiny", "--to", str(mirror), check=True)
    corrupt = _store_with(tmp_path / "a", pointer.oid, b"x" * pointer.size)
    env = {"ZOO_HOME": str(tmp_path / "h1"), "ZOO_STORE": str(corrupt), "ZOO_LFS_URL": str(mirror)}
    result = zoo_cli("fetch", "tiny", "--json", env=env, check=True)
    assert json.loads(result.stdout)["source"] == str(mirror)
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warning and str(corrupt) in warning[0] and "corrupt" in warning[0], result.stderr
    assert (corrupt / "lfs" / "objects" / pointer.oid[:2] / pointer.oid[2:4] / pointer.oid).read_bytes() == b"x" * pointer.size
    # A link to a huge file: refused before a byte is read (no copy into the cache), naming the object.
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(2**30)
    linked = _store_with(tmp_path / "b", pointer.oid, link_to=huge)
    env = {"ZOO_HOME": str(tmp_path / "h2"), "ZOO_STORE": str(linked), "ZOO_LFS_URL": ""}
    refused = zoo_cli("fetch", "tiny", env=env)
    assert refused.returncode == 1 and "is a link out of the store" in refused.stderr
    assert not [p for p in (tmp_path / "h2").rglob("*") if p.is_file() and p.stat().st_size > 0]


def test_an_object_the_store_held_once_comes_back_from_git_verified(zoo_env, tmp_path):
    """What a card published before (a recipe continues from it: init_from) is pruned from store/ by the next publish;
    git still has it, and from_history takes it from the commit that added it, verified, into the cache."""
    repo, data = tmp_path / "repo", b"weights an earlier card published"
    pointer = Pointer(hashlib.sha256(data).hexdigest(), len(data))
    held = _store_with(repo, pointer.oid, data)  # repo/repo-store/lfs/objects/..
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "publish")
    _git(repo, "rm", "-rq", "repo-store")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "prune")
    assert not held.exists()
    got = from_history(pointer, root=repo, store=held)
    assert got.read_bytes() == data and got == ObjectCache().path(pointer.oid)
    assert from_history(Pointer("0" * 64, 1), root=repo, store=held) is None  # never held
    # A committed blob whose bytes are not what its name says: refused by name, nothing cached.
    lie = Pointer(hashlib.sha256(b"other bytes").hexdigest(), len(data))
    _store_with(repo, lie.oid, data)
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a bad object")
    with pytest.raises(IntegrityError, match=f"{lie.oid}.* is not the object its name says"):
        from_history(lie, root=repo, store=held)
    assert ObjectCache().get(lie) is None and not list((zoo_env["home"] / "partial").iterdir())


def _git(clone: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, check=True).stdout.strip()


def _set_build(folder: Path, commit: str | None) -> None:
    card = yaml.safe_load((folder / "card.yaml").read_text())
    card["training"].update({"git_commit": commit, "reproducible": commit is not None})
    (folder / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))


def test_publishing_is_one_commit_of_card_pointers_and_objects(tmp_path):
    """In a clone: `zoo publish NAME` takes only a build of the checked-out commit at a tree changed only in the
    entry and the store; it adds the objects, leaves pointers, and a rebuild's publication removes the old objects."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    _git(clone, "config", "user.name", "test")
    _git(clone, "config", "user.email", "test@127.0.0.1")
    env = {**os.environ, "PYTHONPATH": str(clone), "ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": ""}
    for key in ("ZOO_STORE", "ZOO_ENTRIES"):
        env.pop(key, None)

    def zoo(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zoo.cli", *args], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=300)

    folder = write_entry(clone / "zoo" / "entries", "tiny")
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "tiny")
    head = _git(clone, "rev-parse", "HEAD")
    refused = zoo("publish", "tiny")
    assert refused.returncode == 1 and "records no clean build commit" in refused.stderr
    _set_build(folder, _git(clone, "rev-parse", "HEAD~1"))
    refused = zoo("publish", "tiny")
    assert refused.returncode == 1 and "publish from the commit it was built at" in refused.stderr
    _set_build(folder, head)
    (clone / "stray.txt").write_text("an unrelated change\n")
    refused = zoo("publish", "tiny")
    assert refused.returncode == 1 and "stray.txt" in refused.stderr.replace("\n", "")
    (clone / "stray.txt").unlink()
    # What a build regenerates from the cards (the manifest and the README's catalog table) is part of publishing.
    assert zoo("manifest").returncode == 0 and "README.md" in _git(clone, "status", "--porcelain")
    first = pointer_for(folder / "model.onnx")
    published = zoo("publish", "tiny")
    assert published.returncode == 0, published.stderr
    stored = clone / "store" / "lfs" / "objects" / first.oid[:2] / first.oid[2:4] / first.oid
    assert sha256_file(stored) == first.oid and read_pointer(folder / "model.onnx") == first
    changed = {line.split()[-1].split("/")[0] + "/" for line in _git(clone, "status", "--porcelain", "-uall").splitlines()}
    assert changed <= {"zoo/", "store/", "README.md/"}
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "publish tiny")
    # A rebuild (other bytes) at the new commit: its objects replace the old ones in the same kind of commit.
    write_entry(clone / "zoo" / "entries", "tiny", seed=1)
    _set_build(folder, _git(clone, "rev-parse", "HEAD"))
    second = pointer_for(folder / "model.onnx")
    assert zoo("publish", "tiny").returncode == 0
    assert not stored.exists() and (clone / "store" / "lfs" / "objects" / second.oid[:2] / second.oid[2:4] / second.oid).is_file()
    # A pointer whose object the store lacks: the error names the commit that should have published it.
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "publish tiny again")
    (clone / "store" / "lfs" / "objects" / second.oid[:2] / second.oid[2:4] / second.oid).unlink()
    env["ZOO_HOME"] = str(tmp_path / "empty-home")  # publishing kept the content in its cache
    missing = zoo("fetch", "tiny")
    published_at = _git(clone, "rev-parse", "HEAD")
    assert missing.returncode == 1 and f"commit {published_at[:12]}" in missing.stderr, missing.stderr


@pytest.mark.parametrize("threads,level", [(1, "ORT_DISABLE_ALL"), (2, "ORT_ENABLE_BASIC")])
def test_kinds_made_on_fetch_do_not_depend_on_onnxruntime_kernels(tmp_path, threads, level):
    """Every kind `zoo fetch` makes from fp32 (not stored) gives the card's bytes when every onnxruntime session that
    computes runs with other threads and graph optimizations (other kernels, other summation orders): they use no
    numbers onnxruntime computes. int8-ptq does (calibration), so the store holds it instead."""
    name = next(n for n in _published() if catalog.get_card(n).family == "cnn")
    script = textwrap.dedent("""
        import json, sys, tempfile
        from pathlib import Path
        import zoo
        from zoo.ort import ort
        threads, level, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        computing = []
        original = ort.InferenceSession.__init__

        def init(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
            options = sess_options or ort.SessionOptions()
            if not options.optimized_model_filepath:  # a session that computes, not one that rewrites a graph
                options.intra_op_num_threads = threads
                options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
                computing.append(1)
            original(self, path_or_bytes, options, providers, provider_options, **kwargs)

        ort.InferenceSession.__init__ = init
        from zoo import catalog
        from zoo.store.fetch import fetch
        from zoo.pointer import pointer_for
        from zoo.kinds import kind_of
        from zoo.variants.make import derive
        from zoo.variants.opsets import Origin
        card = catalog.get_card(name)
        fp32 = fetch(name, "fp32", show_progress=False).path
        made = {}
        with tempfile.TemporaryDirectory() as tmp:
            for key, v in card.variants.items():
                kind = kind_of(key, v)
                if v.built and kind.made == "from-fp32":
                    path = derive(key, v, fp32, Path(tmp) / key, Origin.of(card))
                    made[key] = [pointer_for(path).oid, v.sha256, kind.primary]
            for opset in card.variants["fp32"].extra_opsets:
                path = derive("fp32", card.variants["fp32"], fp32, Path(tmp) / f"opset{opset}", Origin.of(card), opset)
                made[f"opset {opset}"] = [pointer_for(path).oid, None, False]
        print(json.dumps({"made": made, "computing_sessions": len(computing)}))
    """)
    env = {**os.environ, "ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": ""}
    env.pop("ZOO_STORE", None)
    result = subprocess.run([sys.executable, "-c", script, str(threads), level, name], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["computing_sessions"] > 0, "the harness changed no session: it would prove nothing"
    card = catalog.get_card(name)
    for key, (made, promised, stored) in report["made"].items():
        if key.startswith("opset"):
            opset = int(key.split()[1])
            promised = read_pointer(REPO / "zoo" / "entries" / name / card.variants["fp32"].extra_opsets[opset]).oid
        if not stored:  # made on fetch on any CPU: must be the card's bytes whatever onnxruntime's kernels
            assert made == promised, f"{name} {key} made with {threads} thread(s), {level}: other bytes than the card's"


def test_zoo_serve_serves_the_store_layout_and_nothing_outside_it(zoo_env, tmp_path):
    """`zoo serve --storage DIR` reads git-lfs's layout (so it serves store/ as it is); a request path never becomes a
    file path: `../`, `%2e%2e` and a bad oid reach nothing outside the storage folder."""
    import http.client

    import requests

    from tests.helpers import LfsServer

    folder = write_entry(zoo_env["entries"], "tiny")
    pointer = pointer_for(folder / "model.onnx")
    storage = _store_with(tmp_path, pointer.oid, (folder / "model.onnx").read_bytes())
    (folder / "model.onnx").write_text(pointer.text())  # the checkout keeps the pointer, as after publishing
    secret = tmp_path / "outside" / "dir" / "objects" / "storage" / ("e" * 64)
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"not yours")
    server = LfsServer(storage, anonymous_writes=False, secret="s" * 48).start()
    try:
        env = {"ZOO_HOME": str(tmp_path / "h"), "ZOO_LFS_URL": server.url}
        fetched = json.loads(zoo_cli("fetch", "tiny", "--json", env=env, check=True).stdout)
        assert fetched["source"] == server.url and fetched["sha256"] == pointer.oid
        for path in (f"/../outside/dir/objects/storage/{'e' * 64}", f"/%2e%2e/outside/dir/objects/storage/{'e' * 64}",
                     f"/zoo/models.git/info/lfs/objects/storage/..%2f..%2foutside/{'e' * 64}"):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.request("GET", path)
            answer = connection.getresponse()
            assert b"not yours" not in answer.read() and answer.status != 200, path
            connection.close()
        batch = requests.post(f"{server.url}/objects/batch", timeout=10, headers={"Accept": "application/vnd.git-lfs+json"},
                              json={"operation": "download", "objects": [{"oid": "../" + "e" * 61, "size": 9}]})
        assert "not yours" not in batch.text and "href" not in batch.text
    finally:
        server.stop()
