"""`zoo serve` as a public mirror: anonymous read, uploads only with a token, verified uploads, limits, request log.

A real giftless server in its own process on 127.0.0.1, real HTTP, the zoo's own LFS client (HttpRemote) and
`zoo publish`/`zoo serve --issue-token` through the CLI.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import time

import jwt
import pytest
import requests

from tests.helpers import LfsServer, zoo_cli
from zoo.errors import RemoteError
from zoo.pointer import pointer_for
from zoo.store.remotes import HttpRemote

SECRET = "s3cret-" + "x" * 40
LFS = "application/vnd.git-lfs+json"


@pytest.fixture
def mirror(tmp_path):
    log = tmp_path / "access.log"
    server = LfsServer(tmp_path / "storage", anonymous_writes=False, secret=SECRET,
                       extra_args=("--access-log", str(log), "--max-object-size", "100000",
                                   "--max-batch-body", "4096", "--max-head", "8192", "--body-timeout", "2")).start()
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
    # A refused token is logged as invalid, never as the subject it claims (unverified claims are anyone's words).
    assert any('"POST ' in line and " 401 " in line and " invalid-token " in line for line in lines)
    assert "mallory" not in mirror.log.read_text()


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


def _raw(server: LfsServer, request: bytes, timeout: float = 15) -> tuple[bytes, float]:
    """Send bytes as they are, in 64 KiB pieces, stopping once the server answers (as a client streaming a body
    would); return what came back before the server closed the connection, and how long it took."""
    started, answer = time.monotonic(), b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as connection:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            for start in range(0, len(request), 1 << 16):
                if select.select([connection], [], [], 0)[0]:
                    break  # answered already (a refusal): read it
                connection.sendall(request[start:start + (1 << 16)])
        with contextlib.suppress(ConnectionResetError):
            while chunk := connection.recv(65536):
                answer += chunk
    return answer, time.monotonic() - started


def test_limits_hold_at_their_edges_with_json_errors(tmp_path, mirror, monkeypatch):
    """One set of limits (object 100,000 bytes, batch body 4,096, head 8,192, 2 s for an unfinished body): below and
    at each limit accepted, one byte over refused with a JSON LFS error, nothing stored."""
    monkeypatch.setenv("ZOO_LFS_TOKEN", _token())
    for size in (99_999, 100_000):
        path, pointer = _object(tmp_path, f"{size}.bin", os.urandom(size))
        assert HttpRemote(mirror.url).upload(path, pointer) is True and _stored(mirror, pointer.oid)
    path, pointer = _object(tmp_path, "over.bin", os.urandom(100_001))
    with pytest.raises(RemoteError, match="object size limit of 100000"):
        HttpRemote(mirror.url).upload(path, pointer)
    # A PUT one byte over, through a link for a permitted size; a chunked body (no length) far over; no body at all.
    headers = {"Accept": LFS, "Content-Type": LFS, "Authorization": f"Bearer {_token()}"}
    permitted = pointer_for(_object(tmp_path, "ok.bin", os.urandom(100_000))[0])
    href = requests.post(f"{mirror.url}/objects/batch", headers=headers, timeout=10, json={
        "operation": "upload", "objects": [{"oid": permitted.oid, "size": permitted.size}]}).json()["objects"][0][
        "actions"]["upload"]["href"]
    target = href.split(f":{mirror.port}", 1)[1]
    over = requests.put(href, data=os.urandom(100_001), timeout=10)
    assert over.status_code == 413 and over.headers["Content-Type"] == LFS and over.json()["message"]
    head = f"PUT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    chunked, took = _raw(mirror, head + b"Transfer-Encoding: chunked\r\n\r\n"
                         + b"".join(b"10000\r\n" + os.urandom(0x10000) + b"\r\n" for _ in range(80)) + b"0\r\n\r\n")
    assert chunked.startswith(b"HTTP/1.1 413") and b'{"message"' in chunked, chunked[:300]
    nothing, took = _raw(mirror, head + b"Content-Length: 5000\r\n\r\n")
    assert took < 12, took  # closed after --body-timeout (2 s) plus waitress's sweep, not after minutes
    assert not _stored(mirror, permitted.oid) and not list(mirror.storage.rglob(".upload-*"))
    # The batch body at its limit is read and answered; one byte more is 413, as JSON.
    for extra in (0, 1):
        body = json.dumps({"operation": "download", "objects": [{"oid": "b" * 64, "size": 1}]}).encode()
        body = body[:-1] + b" " * (4096 + extra - len(body)) + body[-1:]  # JSON allows the padding
        answer = requests.post(f"{mirror.url}/objects/batch", data=body, headers=headers, timeout=10)
        assert (answer.status_code == 413) == bool(extra) and answer.headers["Content-Type"].startswith(LFS)
        assert ("4097 bytes exceeds this server's limit of 4096" in answer.text) == bool(extra), answer.text
    # A request head over --max-head: waitress refuses it, in JSON too.
    big_head, _ = _raw(mirror, b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n")
    assert big_head.split(b" ", 2)[1] in (b"431", b"400") and b'{"message"' in big_head, big_head[:300]


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
