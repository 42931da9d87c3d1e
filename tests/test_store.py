"""The store end to end against a real LFS HTTP server (giftless via `zoo serve`) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import zoo
from tests.helpers import REPO, LfsServer, write_entry, zoo_cli
from zoo.pointer import read_pointer


def _fresh_cache(zoo_env, name: str) -> dict:
    """Environment for a CLI run with an empty cache of its own."""
    return {"ZOO_HOME": str(zoo_env["tmp"] / name)}


def _objects(home) -> list:
    return [p for p in (home / "objects").rglob("*") if p.is_file()] if (home / "objects").exists() else []


@pytest.fixture
def token_server(tmp_path):
    """The production setup: anonymous read, uploads with a token signed with the operator's secret."""
    secret = "a" * 48
    server = LfsServer(tmp_path / "mirror-storage", anonymous_writes=False, secret=secret).start()
    token = zoo_cli("serve", "--issue-token", "--expires", "600", env={"ZOO_SERVE_SECRET": secret}, check=True)
    server.token = token.stdout.strip()
    yield server
    server.stop()


def test_publish_then_fetch_into_empty_cache(zoo_env, token_server):
    lfs_server = token_server
    folder = write_entry(zoo_env["entries"], "tiny")
    original = (folder / "model.onnx").read_bytes()
    refused = zoo_cli("publish", "tiny", "--to", lfs_server.url, env={"ZOO_LFS_TOKEN": ""})
    assert refused.returncode != 0 and "set ZOO_LFS_TOKEN" in refused.stderr and read_pointer(folder / "model.onnx") is None
    published = zoo_cli("publish", "tiny", "--to", lfs_server.url, env={"ZOO_LFS_TOKEN": lfs_server.token}, check=True)
    assert "uploaded tiny/model.onnx" in published.stdout
    # The checkout now holds a spec-v1 pointer; the content stays fetchable from the local cache.
    pointer = read_pointer(folder / "model.onnx")
    assert pointer is not None and pointer.size == len(original)
    assert (folder / "model.onnx").read_text().splitlines()[0] == "version https://git-lfs.github.com/spec/v1"

    env = {**_fresh_cache(zoo_env, "empty"), "ZOO_LFS_URL": lfs_server.url}
    first = json.loads(zoo_cli("fetch", "tiny", "--json", env=env, check=True).stdout)
    assert first["source"] == lfs_server.url
    assert first["sha256"] == pointer.oid and first["metrics"] == {"accuracy": 0.9}
    with open(first["path"], "rb") as f:
        assert f.read() == original
    second = json.loads(zoo_cli("fetch", "tiny", "--json", env=env, check=True).stdout)
    assert second["source"] == "cache" and second["path"] == first["path"]

    # Publishing again uploads nothing new.
    assert "present  tiny/model.onnx" in zoo_cli("publish", "tiny", "--to", lfs_server.url,
                                                 env={"ZOO_LFS_TOKEN": lfs_server.token}, check=True).stdout


def test_python_api_mirrors_cli(zoo_env, lfs_server, monkeypatch):
    write_entry(zoo_env["entries"], "tiny")
    zoo_cli("publish", "tiny", "--to", lfs_server.url, check=True)
    monkeypatch.setenv("ZOO_HOME", str(zoo_env["tmp"] / "api-home"))
    monkeypatch.setenv("ZOO_LFS_URL", lfs_server.url)
    dest = zoo_env["tmp"] / "dest"
    path = zoo.fetch("tiny", variant="fp32", dest=dest, show_progress=False)
    assert path == dest / "model.onnx" and read_pointer(path) is None


def test_corrupt_object_on_server_fails_and_caches_nothing(zoo_env, lfs_server):
    write_entry(zoo_env["entries"], "tiny")
    zoo_cli("publish", "tiny", "--to", lfs_server.url, check=True)
    pointer = read_pointer(zoo_env["entries"] / "tiny" / "model.onnx")
    stored = lfs_server.object_path(pointer.oid)
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte
    stored.write_bytes(bytes(data))

    env = {**_fresh_cache(zoo_env, "victim"), "ZOO_LFS_URL": lfs_server.url}
    result = zoo_cli("fetch", "tiny", env=env)
    assert result.returncode != 0
    assert "sha256" in result.stderr and "corrupt" in result.stderr and "Traceback" not in result.stderr
    home = zoo_env["tmp"] / "victim"
    assert _objects(home) == [] and list((home / "partial").glob("*")) == []


def _big_entry(zoo_env, server) -> None:
    # 4096 x 2048 float32 weights: a 32 MiB object, slow enough to interrupt under --limit-rate.
    write_entry(zoo_env["entries"], "big", n_in=4096 * 2048 // 3)
    zoo_cli("publish", "big", "--to", server.url, check=True)


def _start_fetch(env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zoo.cli", "fetch", "big", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env}, cwd=REPO)


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_server_stopped_mid_download_then_resumed(zoo_env, tmp_path, ranges):
    server = LfsServer(tmp_path / "storage", ranges=ranges).start()
    try:
        _big_entry(zoo_env, server)
        home = zoo_env["tmp"] / "resume-home"
        env = {"ZOO_HOME": str(home), "ZOO_LFS_URL": server.url}
        proc = _start_fetch(env, "--limit-rate", str(4 << 20))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            parts = list((home / "partial").glob("*.part")) if (home / "partial").exists() else []
            if parts and parts[0].stat().st_size > 4 << 20:
                break
            time.sleep(0.05)
        server.stop()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, out
        assert "failed after" in err and "the next fetch resumes" in err
        kept = parts[0].stat().st_size
        assert 0 < kept < 32 << 20 and _objects(home) == []

        server.start()  # same port, same storage
        result = json.loads(zoo_cli("fetch", "big", "--json", env=env, check=True).stdout)
        assert result["source"] == server.url
        if ranges:
            assert result["resumed_from"] >= kept  # continued where it stopped
        else:
            assert result["resumed_from"] == 0  # the server ignores Range: a correct fresh download
        assert len(_objects(home)) == 1 and not list((home / "partial").glob("*.part"))
    finally:
        server.stop()


def test_two_concurrent_fetches_download_once(zoo_env, lfs_server):
    _big_entry(zoo_env, lfs_server)
    env = {"ZOO_HOME": str(zoo_env["tmp"] / "shared-home"), "ZOO_LFS_URL": lfs_server.url}
    procs = [_start_fetch(env, "--limit-rate", str(16 << 20)) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(r["source"] for r in results) == sorted(["cache", lfs_server.url])
    assert results[0]["path"] == results[1]["path"] and results[0]["sha256"] == results[1]["sha256"]
    assert len(_objects(zoo_env["tmp"] / "shared-home")) == 1


def test_missing_everywhere_lists_what_was_tried(zoo_env, lfs_server):
    folder = write_entry(zoo_env["entries"], "tiny")
    (folder / "model.onnx").unlink()
    env = {**_fresh_cache(zoo_env, "h"), "ZOO_LFS_URL": lfs_server.url}
    unreachable = "http://127.0.0.1:9/zoo.git/info/lfs"  # the discard port: nothing listens there
    result = zoo_cli("fetch", "tiny", env={**env, "ZOO_LFS_URL": f"{unreachable} {lfs_server.url}"})
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # the store it could not reach is said as it is skipped (a warning), then the error lists every store tried
    assert lines.pop(0) == f"warning: tiny fp32: {unreachable}: unreachable (cannot connect, 4 attempts); trying the next store"
    assert "is in no store. Tried:" in lines[0]
    # one short line per store, no wrapped library exceptions, then how to add a mirror and how to build it
    assert lines[1].strip() == f"{unreachable}: unreachable (cannot connect, 4 attempts)"
    assert lines[2].strip() == f"{lfs_server.url}: not there"
    assert lines[3].startswith("Add a mirror: ZOO_LFS_URL=") and "`zoo build tiny`" in lines[4]
    assert len(lines) == 5 and "Traceback" not in result.stderr and "HTTPConnectionPool" not in result.stderr
    assert _objects(zoo_env["tmp"] / "h") == []


class _AlwaysFailing(BaseHTTPRequestHandler):
    calls = 0

    def do_POST(self):  # noqa: N802
        type(self).calls += 1
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_server_error_after_retries(zoo_env):
    folder = write_entry(zoo_env["entries"], "tiny")
    (folder / "model.onnx").unlink()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysFailing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/lfs"
        result = zoo_cli("fetch", "tiny", env={**_fresh_cache(zoo_env, "h"), "ZOO_LFS_URL": url})
    finally:
        httpd.shutdown()
    assert result.returncode == 1
    assert f"{url}: unreachable (HTTP 503, 4 attempts)" in result.stderr
    assert _AlwaysFailing.calls == 4
    assert _objects(zoo_env["tmp"] / "h") == []


def test_remotes_tried_in_order(zoo_env, lfs_server, tmp_path):
    write_entry(zoo_env["entries"], "tiny")
    zoo_cli("publish", "tiny", "--to", lfs_server.url, check=True)
    empty_bare = tmp_path / "empty.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(empty_bare)], check=True)
    env = {**_fresh_cache(zoo_env, "h"), "ZOO_LFS_URL": f"{empty_bare} {lfs_server.url}"}
    result = json.loads(zoo_cli("fetch", "tiny", "--json", env=env, check=True).stdout)
    assert result["source"] == lfs_server.url


def test_store_order_without_configuration(tmp_path):
    """The repository's store first (zoo.config.repo_store, ZOO_STORE to move or drop it), then the mirrors: with
    ZOO_LFS_URL unset, git's lfs.url then the clone's remote endpoint; nothing outside the repository is looked at
    (no folder laid beside the checkout), and `.lfsconfig` names no made-up host."""
    assert "url" not in (REPO / ".lfsconfig").read_text().split("[lfs]")[1]
    clone = tmp_path / "work" / "zoo"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "HEAD", "--", "zoo", "store"], check=True)
    beside = tmp_path / "work" / "shared" / "zoo-lfs"  # where earlier versions looked: no longer
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(beside)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_LFS_URL", "ZOO_STORE")}
    env["PYTHONPATH"] = str(clone)
    probe = [sys.executable, "-c", "import json; from zoo.config import lfs_remote_urls, repo_store; "
             "print(json.dumps([str(repo_store()), *lfs_remote_urls()]))"]

    def urls() -> list[str]:
        return json.loads(subprocess.run(probe, cwd=clone, env=env, capture_output=True, text=True, check=True).stdout)

    assert urls() == [str(clone / "store"), str(REPO)]
    subprocess.run(["git", "-C", str(clone), "remote", "set-url", "origin", "git@example.org:team/zoo.git"], check=True)
    subprocess.run(["git", "-C", str(clone), "config", "lfs.url", "https://mirror.example.org/zoo.git/info/lfs"], check=True)
    assert urls() == [str(clone / "store"), "https://mirror.example.org/zoo.git/info/lfs",
                      "https://example.org/team/zoo.git/info/lfs"]
    env["ZOO_LFS_URL"] = "/srv/a.git, /srv/b.git"
    assert urls() == [str(clone / "store"), "/srv/a.git", "/srv/b.git"]
    env["ZOO_STORE"] = ""
    assert urls() == ["None", "/srv/a.git", "/srv/b.git"]
