"""`zoo serve` as a public mirror: anonymous read, uploads only with a token, verified uploads, limits, request log.

A real giftless server in its own process on 127.0.0.1, real HTTP, the zoo's own LFS client (HttpRemote) and
`zoo publish`/`zoo serve --issue-token` through the CLI.
"""

from __future__ import annotations

import hashlib
import os
import time

import jwt
import pytest
import requests

from tests.helpers import LfsServer, zoo_cli
from zoo.errors import RemoteError
from zoo.store.pointer import pointer_for
from zoo.store.remotes import HttpRemote

SECRET = "s3cret-" + "x" * 40
LFS = "application/vnd.git-lfs+json"


@pytest.fixture
def mirror(tmp_path):
    log = tmp_path / "access.log"
    server = LfsServer(tmp_path / "storage", anonymous_writes=False, secret=SECRET,
                       extra_args=("--access-log", str(log), "--max-object-size", "100000",
                                   "--max-batch-body", "4096")).start()
    server.log = log
    yield server
    server.stop()


def _object(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path, pointer_for(path)


def _token(*args: str) -> str:
    result = zoo_cli("serve", "--issue-token", *args, env={**os.environ, "ZOO_SERVE_SECRET": SECRET})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _stored(server: LfsServer, oid: str) -> list:
    return [p for p in server.storage.rglob("*") if p.is_file() and p.name == oid]


def test_anonymous_reads_token_writes(tmp_path, mirror, monkeypatch):
    path, pointer = _object(tmp_path, "model.onnx", os.urandom(5000))
    # Anonymous upload: refused with what to do, nothing stored.
    monkeypatch.delenv("ZOO_LFS_TOKEN", raising=False)
    with pytest.raises(RemoteError, match="upload refused.*no token was sent.*zoo serve --issue-token"):
        HttpRemote(mirror.url).upload(path, pointer)
    assert not _stored(mirror, pointer.oid)
    # A wrong secret's token and an expired token: refused.
    forged = jwt.encode({"sub": "mallory", "exp": int(time.time()) + 600, "scopes": ["obj:*"]}, "y" * 40,
                        algorithm="HS256")
    expired = jwt.encode({"sub": "late", "exp": int(time.time()) - 60, "scopes": ["obj:*"]}, SECRET, algorithm="HS256")
    for bad in (forged, expired):
        monkeypatch.setenv("ZOO_LFS_TOKEN", bad)
        with pytest.raises(RemoteError, match="token was refused"):
            HttpRemote(mirror.url).upload(path, pointer)
    assert not _stored(mirror, pointer.oid)
    # `zoo publish`'s client with a token from `zoo serve --issue-token`: stored; then anyone downloads it.
    monkeypatch.setenv("ZOO_LFS_TOKEN", _token("--expires", "600", "--subject", "ci-publisher"))
    assert HttpRemote(mirror.url).upload(path, pointer) is True
    assert _stored(mirror, pointer.oid)
    monkeypatch.delenv("ZOO_LFS_TOKEN")
    answer = requests.post(f"{mirror.url}/objects/batch", headers={"Accept": LFS, "Content-Type": LFS}, timeout=10,
                           json={"operation": "download", "transfers": ["basic"],
                                 "objects": [{"oid": pointer.oid, "size": pointer.size}]}).json()
    action = answer["objects"][0]["actions"]["download"]
    got = requests.get(action["href"], headers=action.get("header", {}), timeout=10)
    assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == pointer.oid
    # The request log: method, path, object id, bytes, status, duration, and who (the token's subject).
    lines = mirror.log.read_text().splitlines()
    put = [line for line in lines if '"PUT ' in line]
    assert put and " 200 " in put[-1] and f"oid={pointer.oid}" in put[-1] and "ci-publisher" in put[-1]
    assert f"in={pointer.size}" in put[-1] and put[-1].endswith("s")
    downloads = [line for line in lines if '"GET ' in line and pointer.oid in line]
    assert downloads and f" 200 {pointer.size} " in downloads[-1]
    assert "eyJ" not in mirror.log.read_text()  # no token (JWTs start with eyJ) is ever logged
    assert any('"POST ' in line and " 401 " in line and "mallory" in line for line in lines)


def test_corrupt_or_oversized_uploads_are_refused_and_not_stored(tmp_path, mirror):
    path, pointer = _object(tmp_path, "model.onnx", os.urandom(3000))
    headers = {"Accept": LFS, "Content-Type": LFS, "Authorization": f"Bearer {_token()}"}
    answer = requests.post(f"{mirror.url}/objects/batch", headers=headers, timeout=10,
                           json={"operation": "upload", "transfers": ["basic"],
                                 "objects": [{"oid": pointer.oid, "size": pointer.size}]}).json()
    upload = answer["objects"][0]["actions"]["upload"]
    wrong = os.urandom(3000)  # other bytes under this object's id
    refused = requests.put(upload["href"], data=wrong, headers=upload.get("header", {}), timeout=10)
    assert refused.status_code == 422 and "hash to sha256" in refused.text
    assert not _stored(mirror, pointer.oid)
    assert not [p for p in mirror.storage.rglob(".upload-*")]  # no temporary left behind
    # Limits: an object over --max-object-size is refused in the batch, a batch body over --max-batch-body too.
    big = requests.post(f"{mirror.url}/objects/batch", headers=headers, timeout=10,
                        json={"operation": "upload", "transfers": ["basic"],
                              "objects": [{"oid": "a" * 64, "size": 100001}]})
    assert big.status_code == 422 and "object size limit of 100000" in big.json()["message"]
    many = [{"oid": f"{i:064x}", "size": 1} for i in range(100)]
    body = requests.post(f"{mirror.url}/objects/batch", headers=headers, timeout=10,
                         json={"operation": "download", "objects": many})
    assert body.status_code == 413 and "send fewer objects" in body.json()["message"]
    # The right bytes through the same link: stored whole.
    accepted = requests.put(upload["href"], data=path.read_bytes(), headers=upload.get("header", {}), timeout=10)
    assert accepted.status_code == 200 and _stored(mirror, pointer.oid)


def test_serve_refuses_weak_or_missing_secrets(tmp_path):
    short = zoo_cli("serve", "--issue-token", env={**os.environ, "ZOO_SERVE_SECRET": "short"})
    assert short.returncode == 1 and "use at least 32" in short.stderr
    missing = zoo_cli("serve", "--issue-token", env={"ZOO_SERVE_SECRET": ""})
    assert missing.returncode == 1 and "needs the server's secret" in missing.stderr
    # Without a secret the server is read-only: uploads are refused even with a token-looking header.
    server = LfsServer(tmp_path / "storage", anonymous_writes=False).start()
    try:
        path, pointer = _object(tmp_path, "x.bin", b"zoo" * 100)
        with pytest.raises(RemoteError, match="upload refused"):
            HttpRemote(server.url).upload(path, pointer)
        assert not _stored(server, pointer.oid)
    finally:
        server.stop()


def test_anonymous_writes_warn_off_loopback():
    from zoo.store.serve import exposure_warning

    assert exposure_warning("127.0.0.1", True) is None and exposure_warning("0.0.0.0", False) is None
    assert "anyone who can reach this address can upload" in exposure_warning("0.0.0.0", True)
    assert exposure_warning("10.1.2.3", True).startswith("warning: --anonymous-writes on 10.1.2.3")
