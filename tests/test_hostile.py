"""Hostile and unlucky input: every path the zoo writes stays in its folder, bad stores are named and skipped, and
random or mutated cards, recipes, pointer files and LFS server answers end in one clean error, never a traceback,
never a write outside the target, never an unverified object in the cache."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import REPO, all_cpus, card_dict, free_port, write_entry, zoo_cli
from zoo.cards import load_card
from zoo.errors import ZooError
from zoo.recipes import load_recipe
from zoo.store import remotes
from zoo.store.cache import ObjectCache
from zoo.store.fetch import fetch_object
from zoo.pointer import Pointer, parse_pointer, pointer_for, sha256_file

ESCAPES = ["../../outside.onnx", "/tmp/zoo-outside.onnx", "sub/../../x.onnx", "../card.yaml"]
COUNTS: dict[str, int] = {}  # cases each property test ran (hypothesis examples), checked by each test (ran_cases)


def _count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


def ran_cases(name: str, minimum: int):
    """The property test's own check that hypothesis threw at least `minimum` cases at it (counted by `_count`),
    whichever tests run with it (`-k`, one file, the whole suite)."""
    def wrap(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            before = COUNTS.get(name, 0)
            test(*args, **kwargs)
            ran = COUNTS.get(name, 0) - before
            assert ran >= minimum, f"{test.__name__}: {ran} {name} cases ran, expected at least {minimum}"
        return run
    return wrap


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- every entry point holds paths inside their folder --------------------------------------------------------------

@pytest.mark.parametrize("bad", ESCAPES)
def test_build_and_export_refuse_card_paths_outside_the_entry(tmp_path, bad):
    entries = tmp_path / "entries"
    folder = write_entry(entries, "tiny")
    card = yaml.safe_load((folder / "card.yaml").read_text())
    card["training"]["recipe"] = "qat-int8"
    card["architecture"] = "digits-cnn"
    card["variants"]["ort-training"] = {"file": bad, "precision": "fp32", "opset": 17, "format": "ort-training"}
    (folder / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
    env = {"ZOO_ENTRIES": str(entries), "ZOO_HOME": str(tmp_path / "home"), "ZOO_LFS_URL": "", "ZOO_STORE": ""}
    before = _tree(tmp_path)
    for command in (["build", "tiny", "--allow-dirty"], ["export", "tiny", "--variant", "ort-training"]):
        result = zoo_cli(*command, env=env, ranks=False)  # refused before any training
        assert result.returncode == 1 and "escapes its entry folder" in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 2
    assert _tree(tmp_path) == before  # nothing written anywhere, the card untouched
    assert not Path("/tmp/zoo-outside.onnx").exists()


def test_fetch_dest_errors_are_one_line_and_write_nothing(zoo_env, tmp_path):
    write_entry(zoo_env["entries"], "tiny")
    env = {"ZOO_ENTRIES": str(zoo_env["entries"]), "ZOO_HOME": str(zoo_env["home"])}
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    result = zoo_cli("fetch", "tiny", "--dest", str(a_file), env=env)
    assert result.returncode == 1 and "is a file" in result.stderr and "Traceback" not in result.stderr
    assert a_file.read_text() == "mine"
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = zoo_cli("fetch", "tiny", "--dest", str(locked / "sub"), env=env)
        if os.geteuid() != 0:  # root writes anywhere
            assert result.returncode == 1 and "cannot write" in result.stderr and "Traceback" not in result.stderr
    finally:
        locked.chmod(0o700)
    fine = zoo_cli("fetch", "tiny", "--dest", str(tmp_path / "new" / "deep"), "--json", env=env, check=True)
    assert Path(json.loads(fine.stdout)["path"]) == tmp_path / "new" / "deep" / "model.onnx"


def test_publish_refuses_a_link_out_of_the_entry(zoo_env, tmp_path):
    folder = write_entry(zoo_env["entries"], "tiny")
    secret = tmp_path / "secret.onnx"
    shutil.copy(folder / "model.onnx", secret)
    (folder / "model.onnx").unlink()
    (folder / "model.onnx").symlink_to(secret)
    store = tmp_path / "store.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(store)], check=True)
    env = {"ZOO_ENTRIES": str(zoo_env["entries"]), "ZOO_HOME": str(zoo_env["home"])}
    result = zoo_cli("publish", "tiny", "--to", str(store), env=env)
    assert result.returncode == 1 and "escapes its entry folder" in result.stderr and "Traceback" not in result.stderr
    assert not [p for p in (store / "lfs").rglob("*") if p.is_file()] if (store / "lfs").exists() else True
    assert (folder / "model.onnx").is_symlink()  # nothing rewritten


def test_finetune_refuses_a_card_path_outside_the_entry(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    card = yaml.safe_load((folder / "card.yaml").read_text())
    card["variants"]["fp32"]["file"] = "../../etc/model.onnx"
    (folder / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
    env = {"ZOO_ENTRIES": str(zoo_env["entries"]), "ZOO_HOME": str(zoo_env["home"])}
    result = zoo_cli("finetune", "tiny", "--onnx", "--shift", "rot90", env=env)
    assert result.returncode == 1 and "escapes its entry folder" in result.stderr and "Traceback" not in result.stderr


# -- stores: a corrupt copy is named and skipped, a stale partial file is not the store's fault -----------------------

def _bare_store(root: Path, content: bytes | None, pointer: Pointer) -> str:
    store = root / "store.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(store)], check=True)
    if content is not None:
        target = store / "lfs" / "objects" / pointer.oid[:2] / pointer.oid[2:4] / pointer.oid
        target.parent.mkdir(parents=True)
        target.write_bytes(content)
    return str(store)


def test_a_corrupt_store_is_named_and_the_next_store_serves(zoo_env, tmp_path):
    data = os.urandom(1 << 20)
    pointer = Pointer(hashlib.sha256(data).hexdigest(), len(data))
    bad = _bare_store(tmp_path / "bad", data[:-1] + b"x", pointer)
    good = _bare_store(tmp_path / "good", data, pointer)
    path, source, _, skipped = fetch_object(pointer, "obj", remotes=[bad, good], show_progress=False)
    assert source == good and sha256_file(path) == pointer.oid
    assert len(skipped) == 1 and skipped[0].startswith(f"{bad}: corrupt copy")
    ObjectCache().path(pointer.oid).unlink()
    with pytest.raises(ZooError) as refused:
        fetch_object(pointer, "obj", remotes=[bad], show_progress=False)
    assert bad in str(refused.value) and "corrupt" in str(refused.value) and "nothing was cached" in str(refused.value)
    assert ObjectCache().get(pointer) is None


def test_republishing_replaces_a_corrupt_copy_in_the_store(zoo_env, tmp_path):
    folder = write_entry(zoo_env["entries"], "tiny")
    pointer = pointer_for(folder / "model.onnx")
    store = _bare_store(tmp_path, b"rotten", pointer)
    env = {"ZOO_ENTRIES": str(zoo_env["entries"]), "ZOO_HOME": str(zoo_env["home"])}
    out = zoo_cli("publish", "tiny", "--to", store, env=env, check=True).stdout
    assert "uploaded tiny/model.onnx" in out
    stored = Path(store) / "lfs" / "objects" / pointer.oid[:2] / pointer.oid[2:4] / pointer.oid
    assert sha256_file(stored) == pointer.oid


def test_unreachable_and_missing_are_different_messages(zoo_env, tmp_path):
    pointer = Pointer("0" * 64, 10)
    missing = _bare_store(tmp_path, None, pointer)
    with pytest.raises(ZooError) as not_there:
        fetch_object(pointer, "obj", remotes=[missing], show_progress=False)
    assert "is in no store" in str(not_there.value) and "not there" in str(not_there.value)
    down = f"http://127.0.0.1:{free_port()}/lfs"
    with pytest.raises(ZooError) as unreachable:
        fetch_object(pointer, "obj", remotes=[down], show_progress=False)
    assert "no store could be reached" in str(unreachable.value) and "unreachable" in str(unreachable.value)
    assert "is in no store" not in str(unreachable.value)


def test_a_hung_store_costs_seconds_is_named_and_listed(zoo_env, tmp_path):
    """A store that accepts connections and never answers: skipped after ZOO_LFS_TIMEOUT (not retried), named on
    stderr and in the JSON answer's `skipped`, and the next store serves."""
    folder = write_entry(zoo_env["entries"], "tiny")
    pointer = pointer_for(folder / "model.onnx")
    good = _bare_store(tmp_path / "good", (folder / "model.onnx").read_bytes(), pointer)
    (folder / "model.onnx").write_text(pointer.text())  # the checkout holds only the pointer
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # the kernel accepts connections into the backlog; nobody ever reads or answers
        url = f"http://127.0.0.1:{hung.getsockname()[1]}/lfs"
        env = {"ZOO_ENTRIES": str(zoo_env["entries"]), "ZOO_HOME": str(zoo_env["home"]), "ZOO_STORE": "",
               "ZOO_LFS_URL": f"{url} {good}", "ZOO_LFS_TIMEOUT": "1"}
        started = time.monotonic()
        result = zoo_cli("fetch", "tiny", "--json", env=env, check=True)
        took = time.monotonic() - started
    answer = json.loads(result.stdout)
    assert answer["source"] == good and answer["sha256"] == pointer.oid
    assert len(answer["skipped"]) == 1 and answer["skipped"][0].startswith(f"{url}: timed out (no answer within 1 s")
    assert f"warning: tiny fp32: {url}: timed out" in result.stderr
    assert took < 15, took  # a hung store used to cost 4 x 60 s
    bad = zoo_cli("fetch", "tiny", env={**env, "ZOO_LFS_TIMEOUT": "soon", "ZOO_HOME": str(tmp_path / "empty")})
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "error: ZOO_LFS_TIMEOUT='soon' is not a number of seconds in (0, 3600]; unset it for 5 s"]


def test_a_linked_or_broken_entry_breaks_only_itself(zoo_env, tmp_path):
    entries = zoo_env["entries"]
    write_entry(entries, "tiny")
    outside = write_entry(tmp_path / "outside", "evil")  # a valid card, in a folder outside the catalog
    (entries / "evil").symlink_to(outside, target_is_directory=True)
    write_entry(entries, "bad")
    (entries / "bad" / "card.yaml").write_text("name: bad\nvariants: [unclosed\n")
    env = {"ZOO_ENTRIES": str(entries), "ZOO_HOME": str(zoo_env["home"]), "ZOO_STORE": "", "ZOO_LFS_URL": ""}
    listed = zoo_cli("list", env=env, check=True).stdout
    assert "tiny" in listed and "broken: evil:" in listed and "broken: bad:" in listed
    assert "link leading out of" in " ".join(listed.split())
    as_json = json.loads(zoo_cli("list", "--json", env=env, check=True).stdout)
    assert [c["name"] for c in as_json] == ["tiny", "bad", "evil"] and "error" in as_json[1]
    assert zoo_cli("info", "tiny", env=env, check=True).returncode == 0
    assert zoo_cli("fetch", "tiny", env=env, check=True).returncode == 0
    for name, why in (("evil", "is a link leading out of"), ("bad", "bad/card.yaml")):
        refused = zoo_cli("fetch", name, env=env)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode != 0 and len(lines) == 1 and why in lines[0], refused.stderr
    before = (entries / "MANIFEST.json").exists()
    refused = zoo_cli("manifest", env=env)
    assert refused.returncode != 0 and "the manifest needs every card; 2 broken" in refused.stderr
    assert (entries / "MANIFEST.json").exists() == before


class _Hostile(BaseHTTPRequestHandler):
    """An LFS server whose answers the test chooses: the batch answer, then the object download."""

    answer: dict = {}

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, body = self.answer["batch"]
        self._send(status, body, {"Content-Type": "application/vnd.git-lfs+json"})

    def do_GET(self):
        answer = self.answer["object"]
        if answer[0] == "serve":  # a good server: the object, honouring Range
            data, ask = answer[1], self.headers.get("Range")
            start = int(ask.removeprefix("bytes=").split("-")[0]) if ask else 0
            headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if ask else None
            return self._send(206 if ask else 200, data[start:], headers)
        status, body, content_range = answer
        self._send(status, body, {"Content-Range": content_range} if content_range else None)


@pytest.fixture(scope="module")
def hostile_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_stale_partial_download_restarts_from_zero_before_blaming_the_store(zoo_env, hostile_server):
    data = os.urandom(300_000)
    pointer = Pointer(hashlib.sha256(data).hexdigest(), len(data))
    href = f"{hostile_server}/object"
    _Hostile.answer = {"batch": (200, json.dumps({"objects": [{"oid": pointer.oid, "size": pointer.size,
                                                               "actions": {"download": {"href": href}}}]}).encode())}
    cache = ObjectCache()
    # A good server honouring Range resumes from wrong bytes an earlier attempt left: verification fails, and the
    # download starts once more from byte 0 (no Range) before anyone blames the store.
    _Hostile.answer["object"] = ("serve", data)
    cache.partial_path(pointer.oid).write_bytes(b"\0" * 1000)
    path, source, resumed, _ = fetch_object(pointer, "obj", remotes=[hostile_server], show_progress=False)
    assert sha256_file(path) == pointer.oid and source == hostile_server and resumed == 0
    cache.path(pointer.oid).unlink()
    # A server whose copy is wrong is blamed, by name, and nothing is cached.
    _Hostile.answer["object"] = ("serve", data[:-1] + b"x")
    with pytest.raises(ZooError) as blamed:
        fetch_object(pointer, "obj", remotes=[hostile_server], show_progress=False)
    assert "corrupt" in str(blamed.value) and hostile_server in str(blamed.value) and cache.get(pointer) is None
    # A server announcing more bytes than the object has is refused before a byte is written.
    _Hostile.answer["object"] = ("serve", data + b"extra")
    with pytest.raises(ZooError) as oversized:
        fetch_object(pointer, "obj", remotes=[hostile_server], show_progress=False)
    assert f"announces {len(data) + 5} bytes for an object of {len(data)}" in str(oversized.value)
    assert not cache.partial_path(pointer.oid).exists() and cache.get(pointer) is None


# -- properties: random and mutated input -----------------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                     lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children,
                                                                                         max_size=4), max_leaves=12)
_GOOD_CARD = card_dict("tiny", {"fp32": {"file": "model.onnx", "precision": "fp32", "opset": 17, "sha256": "a" * 64,
                                         "size": 10, "metrics": {"accuracy": 0.5}}})


def _mutations(base: dict):
    """A valid document with one field removed, replaced by random JSON, or set to an escaping path."""
    paths = []

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((*prefix, k))
                walk(v, (*prefix, k))

    walk(base, ())
    return st.tuples(st.sampled_from(paths), st.sampled_from(["drop", "replace", "escape"]), _json)


def _mutate(base: dict, mutation) -> dict:
    path, how, value = mutation
    doc = json.loads(json.dumps(base))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if how == "drop":
        node.pop(path[-1])
    else:
        node[path[-1]] = value if how == "replace" else "../../escape.onnx"
    return doc


@ran_cases("cards", 300)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=_mutations(_GOOD_CARD), raw=st.booleans(), garbage=st.binary(max_size=64))
def test_mutated_cards_load_or_fail_cleanly(tmp_path, mutation, raw, garbage):
    _count("cards")
    folder = tmp_path / "entries" / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    text = garbage if raw else yaml.safe_dump(_mutate(_GOOD_CARD, mutation)).encode()
    (folder / "card.yaml").write_bytes(text)
    before = _tree(tmp_path)
    try:
        card = load_card(folder / "card.yaml")
    except ZooError as exc:
        assert len(str(exc).splitlines()) == 1 and str(exc).startswith(str(folder)), str(exc)
    else:
        for variant in card.variants.values():
            assert (folder / variant.file).resolve().is_relative_to(folder.resolve())
            assert all(0 <= v <= 1 for k, v in variant.metrics.items() if k == "accuracy")
    assert _tree(tmp_path) == before


_GOOD_RECIPE = yaml.safe_load((Path(__file__).resolve().parents[1] / "recipes" / "qat-int8.yaml").read_text())


@ran_cases("recipes", 300)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=_mutations(_GOOD_RECIPE), top=_json, whole=st.booleans())
def test_mutated_recipes_load_or_fail_cleanly(tmp_path, mutation, top, whole):
    _count("recipes")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(top if whole else _mutate(_GOOD_RECIPE, mutation)))
    try:
        load_recipe(str(path))
    except ZooError as exc:
        assert len(str(exc).splitlines()) == 1 and str(path) in str(exc), str(exc)


@ran_cases("pointers", 500)
@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200), oid=st.text("0123456789abcdefABCDEF", min_size=60, max_size=68),
       size=st.integers(-5, 10**12))
def test_pointer_files_parse_or_are_content(data, oid, size):
    _count("pointers")
    text = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()
    for candidate in (data, text, text + data, text[:-1]):
        pointer = parse_pointer(candidate)
        if pointer is not None:
            assert len(pointer.oid) == 64 and pointer.size >= 0 and pointer.text().encode() == candidate


_answers = st.one_of(
    st.binary(max_size=80),
    _json.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda objects: json.dumps({"objects": objects}).encode(),
              st.lists(st.fixed_dictionaries({}, optional={"oid": st.text(max_size=70), "size": _json,
                                                           "actions": _json, "error": _json}), max_size=3)),
)


@ran_cases("lfs answers", 150)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_status=st.sampled_from([200, 200, 200, 404, 403, 422]), batch=_answers,
       object_status=st.sampled_from([200, 206, 404, 416]), body=st.binary(max_size=2000),
       valid_action=st.booleans())
def test_hostile_lfs_answers_never_crash_fetch_or_poison_the_cache(zoo_env, hostile_server, batch_status, batch,
                                                                     object_status, body, valid_action):
    _count("lfs answers")
    data = b"the real object"
    pointer = Pointer(hashlib.sha256(data).hexdigest(), len(data))
    if valid_action:
        batch = json.dumps({"objects": [{"oid": pointer.oid, "size": pointer.size,
                                         "actions": {"download": {"href": f"{hostile_server}/o"}}}]}).encode()
    _Hostile.answer = {"batch": (batch_status, batch), "object": (object_status, body, None)}
    remotes.HttpRemote.__init__.__defaults__ = (2, None, 0.0)  # no backoff between attempts: hundreds of cases
    try:
        path, *_ = fetch_object(pointer, "obj", remotes=[hostile_server], show_progress=False)
    except ZooError:
        assert ObjectCache().get(pointer) is None
    else:
        assert path.read_bytes() == data  # only the verified bytes are ever admitted
        path.unlink()
    finally:
        remotes.HttpRemote.__init__.__defaults__ = (4, None, 0.5)


@pytest.mark.ranks  # it takes both CPUs itself (tests/helpers.py all_cpus)
def test_launcher_errors_are_one_line_and_said_once(tmp_path):
    recipe = tmp_path / "list.yaml"
    recipe.write_text("- not\n- a mapping\n")
    launcher = [str(REPO / "launchers" / "ddp.py")]
    env = {**os.environ, "ZOO_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, *launcher, "--recipe", str(recipe)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert one.returncode == 1 and one.stderr.strip().splitlines()[-1].startswith(f"error: {recipe}: the top level")
    assert "Traceback" not in one.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad_dir = subprocess.run([sys.executable, *launcher, "--recipe", "fp32", "--output-dir", str(blocker / "out"),
                              "--no-tracking", "steps=1"], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=300)
    assert bad_dir.returncode == 1 and "Traceback" not in bad_dir.stderr
    assert bad_dir.stderr.strip().splitlines()[-1].startswith(f"error: --output-dir {blocker / 'out'}: cannot create it")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    with all_cpus():  # two ranks start (tests/helpers.py)
        two = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", *launcher, "--recipe", str(recipe)],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert two.returncode != 0 and (two.stdout + two.stderr).count(f"error: {recipe}: the top level") == 1
    # `zoo train` checks the recipe before torchrun starts any worker: its whole output is the one line.
    checked = zoo_cli("train", "--nproc-per-node", "2", "--recipe", str(recipe), env=env, ranks=False)
    assert checked.returncode == 1 and checked.stdout == ""
    assert checked.stderr.strip().splitlines() == [
        f"error: {recipe}: the top level must be a mapping of recipe fields (name, model, ...), not a list"]
    # A worker that fails mid-run: its own output, then one line naming it, not torchrun's ChildFailedError report.
    failed = zoo_cli("train", "--nproc-per-node", "2", "--recipe", "fp32", "--no-tracking", "steps=4",
                     "--output-dir", str(tmp_path / "run"), env={**env, "ZOO_TEST_FAULT": "train-step@1:2"})
    assert failed.returncode == 1 and "ChildFailedError" not in failed.stderr
    assert failed.stderr.strip().splitlines()[-1].startswith("error: training stopped: rank 1 exited with code")


@pytest.mark.parametrize("metrics", [{"accuracy": 1.2}, {"accuracy": -0.1}, {"central_accuracy": 7.0}])
def test_card_schema_bounds_accuracies(zoo_env, metrics):
    folder = write_entry(zoo_env["entries"], "tiny")
    card = yaml.safe_load((folder / "card.yaml").read_text())
    card["variants"]["fp32"]["metrics"] = metrics
    (folder / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
    with pytest.raises(ZooError, match=r"accuracies are fractions in \[0, 1\]"):
        load_card(folder / "card.yaml")


# -- `zoo serve`: no request reaches a byte outside its storage folder --------------------------------------------------

SECRET = b"secret bytes outside the storage"
_SECRET_OID = hashlib.sha256(SECRET).hexdigest()
# Path pieces an attacker would try: dot segments raw, percent-encoded, double-encoded, overlong UTF-8 and Unicode
# look-alikes (fullwidth dots and solidus, the two-dot leader); the routes' own words; the secret's name.
_SEGMENTS = ["..", "%2e%2e", "%2E%2E", ".%2e", "%2e.", "%252e%252e", "%c0%ae%c0%ae", "\uff0e\uff0e", "\u2025",
             "..%2f..", "..%5c..", "%2f", "\uff0f", "", ".", "outside", "secret", _SECRET_OID, "link", "objects",
             "storage", "lfs", "zoo", "models.git", "info", "batch", "e" * 64]


def _request_path(pieces: list[str], absolute: bool) -> str:
    raw = "/".join(pieces)
    path = ("//" if absolute else "/") + raw
    # http.client sends ASCII: non-ASCII look-alikes go out percent-encoded as UTF-8, the rest exactly as written.
    return "".join(c if ord(c) < 128 else "".join(f"%{b:02X}" for b in c.encode()) for c in path)


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory):
    """`zoo serve` over a storage folder next to secrets: a file beside it, one above it, and an object entry in the
    storage that is a link to a file outside (named as that file's oid, so only the link protects it)."""
    from tests.helpers import LfsServer

    root = tmp_path_factory.mktemp("guarded")
    storage = root / "storage"
    storage.mkdir()
    for place in (root / "secret", root / "outside" / "secret", root / _SECRET_OID, root / "objects" / _SECRET_OID):
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(SECRET)
    link = storage / "lfs" / "objects" / _SECRET_OID[:2] / _SECRET_OID[2:4] / _SECRET_OID
    link.parent.mkdir(parents=True)
    link.symlink_to(root / "outside" / "secret")
    server = LfsServer(storage, anonymous_writes=False, secret="s" * 48).start()
    yield server
    server.stop()


@ran_cases("server paths", 200)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=9), absolute=st.booleans(),
       method=st.sampled_from(["GET", "GET", "HEAD", "POST"]), prefix=st.sampled_from(
           ["", "zoo/models.git/info/lfs/objects/storage/", "zoo/models/objects/storage/",
            "zoo/models.git/info/lfs/objects/batch/"]))
def test_no_request_path_reaches_bytes_outside_the_storage(guarded_server, pieces, absolute, method, prefix):
    import http.client

    _count("server paths")
    path = _request_path([*prefix.split("/"), *pieces] if prefix else pieces, absolute)
    connection = http.client.HTTPConnection("127.0.0.1", guarded_server.port, timeout=10)
    try:
        body = json.dumps({"operation": "download", "objects": [{"oid": _SECRET_OID, "size": len(SECRET)}]})
        connection.request(method, path, body=body if method == "POST" else None,
                           headers={"Content-Type": "application/vnd.git-lfs+json"})
        answer = connection.getresponse()
        data = answer.read()
    finally:
        connection.close()
    assert SECRET not in data, (path, answer.status)
    if method == "GET" and answer.status == 200 and data:
        assert hashlib.sha256(data).hexdigest() != _SECRET_OID, path


def test_an_object_entry_linking_out_of_the_storage_is_not_served(guarded_server):
    """The batch API does not offer it (no download action, so no signed link), and its storage URL refuses it."""
    batch = requests.post(f"{guarded_server.url}/objects/batch", timeout=10,
                          headers={"Accept": "application/vnd.git-lfs+json"},
                          json={"operation": "download", "objects": [{"oid": _SECRET_OID, "size": len(SECRET)}]})
    assert batch.status_code == 404 and "href" not in batch.text, batch.text  # giftless: none of them found
    for href in [f"{guarded_server.url}/objects/storage/{_SECRET_OID}"]:
        answer = requests.get(href, timeout=10)
        assert answer.status_code in (403, 404) and SECRET not in answer.content
