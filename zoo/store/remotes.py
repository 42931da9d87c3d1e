"""LFS remotes: HTTP servers speaking the Git LFS Batch API, and bare repositories on disk.

Downloads stream into a `.part` file, hashing as they go; an interrupted download is resumed
with an HTTP Range request. Transient failures (connection errors, 5xx, 429) are retried with
exponential backoff. Nothing here touches the cache: the caller admits verified files.
"""

from __future__ import annotations

import contextlib
import os
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import requests
import urllib3
from pydantic import ValidationError

from zoo.config import lfs_timeout
from zoo.fsutil import plural
from zoo.errors import IntegrityError, RemoteError
from zoo.fsutil import atomic_copy
from zoo.store.batch_api import LFS_MEDIA_TYPE, Action, BatchAnswer, BatchObject
from zoo.store.cache import check_file, lfs_objects, object_relpath
from zoo.store.verified_writes import HashingWriter, finish_part, hash_existing
from zoo.pointer import CHUNK, Pointer, sha256_file

Progress = Callable[[int], None]  # called with the bytes done so far


class NotOnRemote(Exception):
    """The remote answered, and it does not hold the object."""


class Remote:
    url: str

    def download(self, pointer: Pointer, part: Path, progress: Progress) -> int:
        """Complete `part` to the verified object, or raise. Returns the byte offset it resumed from."""
        raise NotImplementedError

    def upload(self, path: Path, pointer: Pointer) -> bool:
        """Store the object; False when the remote already had it."""
        raise NotImplementedError


def open_remote(url: str, retries: int = 4, rate_limit: float | None = None) -> Remote:
    parsed = urlparse(url)
    if parsed.scheme in ("http", "https"):
        return HttpRemote(url, retries=retries, rate_limit=rate_limit)
    if parsed.scheme in ("", "file"):
        return FileRemote(Path(unquote(parsed.path) if parsed.scheme else url).expanduser())
    raise RemoteError(f"unsupported LFS remote {url!r}: use an http(s):// Batch API URL or a bare repo path")


def _short(exc: Exception) -> str:
    """One line for a failed request, without the wrapped library exceptions (urllib3 nests three deep)."""
    if isinstance(exc, requests.ConnectionError):
        return "cannot connect"
    if isinstance(exc, requests.Timeout):
        return "timed out"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:120]}"


class FileRemote(Remote):
    """A bare git repository (or a checkout) used as an LFS store: objects under lfs/objects/aa/bb/<oid>."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.url = str(self.root)
        git_dir = self.root / ".git"
        self.objects = lfs_objects(git_dir if git_dir.is_dir() else self.root)

    def stored(self, pointer: Pointer) -> Path:
        """The object's file in the store, checked before any byte is read: a regular file (a link could lead
        anywhere) of the expected size, so a bad store costs one stat, not a copy of whatever it holds."""
        source = self.objects / object_relpath(pointer.oid)
        if not source.is_file() and not source.is_symlink():
            raise NotOnRemote(f"{self.url}: no object {pointer.oid[:12]}…")
        if not source.resolve().is_relative_to(self.root) or not source.resolve().is_file():
            raise IntegrityError(f"{source} is a link out of the store or not a regular file: a store holds its objects "
                                 "as files inside it")
        if (size := source.stat().st_size) != pointer.size:
            raise IntegrityError(f"{source} has {size} bytes, expected {pointer.size}")
        return source

    def read_in_place(self, pointer: Pointer) -> Path:
        """The verified object where it lies (nothing is copied or modified): the repository's store."""
        source = self.stored(pointer)
        if (digest := sha256_file(source)) != pointer.oid:
            raise IntegrityError(f"{source} has sha256 {digest}, expected {pointer.oid}")
        return source

    def download(self, pointer: Pointer, part: Path, progress: Progress) -> int:
        source = self.stored(pointer)
        part.unlink(missing_ok=True)
        done = 0
        with open(source.resolve(), "rb", buffering=0) as src, open(part, "wb") as out, HashingWriter(out) as sink:
            # Never more than one byte past the expected size, even if the file grows after stored() looked.
            while done <= pointer.size and (chunk := src.read(min(4 * CHUNK, pointer.size + 1 - done))):
                sink.write(chunk)
                done += len(chunk)
                progress(done)
            digest = sink.close()
        finish_part(part, digest, pointer)
        return 0

    def upload(self, path: Path, pointer: Pointer) -> bool:
        if not self.root.is_dir():
            raise RemoteError(f"{self.url} does not exist; create it with `git init --bare -b main {self.url}`")
        target = self.objects / object_relpath(pointer.oid)
        if target.is_file() and target.stat().st_size == pointer.size and sha256_file(target) == pointer.oid:
            return False
        check_file(path, pointer)
        atomic_copy(path, target)  # a corrupt copy already there is replaced, atomically
        return True


def _timed_out(exc: requests.RequestException) -> bool:
    """A connect or read timeout, also when requests reports a read timeout mid-stream as a ConnectionError."""
    return isinstance(exc, requests.Timeout) or any(isinstance(a, urllib3.exceptions.ReadTimeoutError) for a in exc.args)


class HttpRemote(Remote):
    """A Git LFS server reached through the Batch API (basic transfer adapter)."""

    def __init__(self, url: str, retries: int = 4, rate_limit: float | None = None, backoff: float = 0.5):
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.rate_limit = rate_limit  # bytes per second, None = unlimited
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "zoo-fetch"
        self.timeout = (lfs_timeout(), lfs_timeout())  # connect, and each read

    # -- transport with retries -------------------------------------------------------------
    def _request(self, method: str, url: str, body: Path | None = None, **kwargs) -> requests.Response:
        """One request, retried on transient failures. 4xx answers (but 429) are returned, not retried."""
        last = ""
        for attempt in range(self.retries):
            try:
                with open(body, "rb") if body else contextlib.nullcontext() as data:
                    response = self.session.request(method, url, data=data, timeout=self.timeout, **kwargs)
            except requests.RequestException as exc:
                if _timed_out(exc):  # a store that hangs is skipped at once: retries would multiply the wait
                    raise RemoteError(f"{self.url}: timed out (no answer within {self.timeout[1]:g} s; "
                                      "ZOO_LFS_TIMEOUT)") from None
                last = _short(exc)
            else:
                if response.status_code < 500 and response.status_code != 429:
                    return response
                last = f"HTTP {response.status_code}"
                response.close()
            if attempt + 1 < self.retries:
                time.sleep(self.backoff * 2**attempt)
        raise RemoteError(f"{self.url}: unreachable ({last}, {self.retries} attempts)")

    def batch(self, operation: str, pointers: list[Pointer]) -> dict[str, BatchObject]:
        body = {
            "operation": operation,
            "transfers": ["basic"],
            "objects": [{"oid": p.oid, "size": p.size} for p in pointers],
        }
        headers = {"Accept": LFS_MEDIA_TYPE, "Content-Type": LFS_MEDIA_TYPE}
        token = os.environ.get("ZOO_LFS_TOKEN", "").strip()
        if operation == "upload" and token:  # only where it is needed: downloads never carry the upload token
            headers["Authorization"] = f"Bearer {token}"
        response = self._request("POST", f"{self.url}/objects/batch", json=body, headers=headers)
        if operation == "upload" and response.status_code in (401, 403):
            why = "the token was refused (expired, or signed with another secret)" if token else "no token was sent"
            raise RemoteError(f"{self.url}: upload refused (HTTP {response.status_code}): {why}; set ZOO_LFS_TOKEN to "
                              "a token from the mirror's operator (`zoo serve --issue-token`)")
        if response.status_code == 404:
            # Some servers (giftless) answer a whole-batch 404 when an object is unknown.
            return {}
        if response.status_code >= 400:
            raise RemoteError(f"{self.url}: batch {operation} refused: HTTP {response.status_code} {response.text[:200]}")
        try:
            answer = BatchAnswer.model_validate_json(response.content)
        except ValidationError as exc:
            raise RemoteError(f"{self.url}: batch {operation} answered HTTP {response.status_code} with something that "
                              f"is not a Git LFS batch answer ({plural(exc.error_count(), 'problem')}, e.g. "
                              f"{exc.errors()[0]['msg']})") from None
        return {obj.oid: obj for obj in answer.objects}

    # -- download -------------------------------------------------------------------------
    def download(self, pointer: Pointer, part: Path, progress: Progress) -> int:
        obj = self.batch("download", [pointer]).get(pointer.oid)
        action = obj.actions.get("download") if obj else None
        if action is None:
            message = obj.error.message if obj and obj.error else "object not found"
            raise NotOnRemote(f"{self.url}: {message} ({pointer.oid[:12]}…)")
        last, restarted = "", False
        for attempt in range(self.retries):
            kept = part.stat().st_size if part.exists() else 0
            try:
                return self._stream(action, pointer, part, progress)
            except IntegrityError:
                # Bytes resumed from an earlier partial download may be what is wrong, not the store's copy: start
                # once from byte 0 before blaming the store (finish_part has removed the partial file).
                if not kept or restarted:
                    raise
                restarted = True
                continue
            except (requests.RequestException, RemoteError) as exc:
                if isinstance(exc, requests.RequestException) and _timed_out(exc):  # hung: skip this store now
                    raise RemoteError(f"{self.url}: timed out (no bytes for {self.timeout[1]:g} s; ZOO_LFS_TIMEOUT); "
                                      f"{part.stat().st_size if part.exists() else 0} bytes kept, the next fetch "
                                      "resumes") from None
                last = _short(exc)
            if attempt + 1 < self.retries:
                time.sleep(self.backoff * 2**attempt)
        raise RemoteError(
            f"{self.url}: download of {pointer.oid[:12]}… failed after {self.retries} attempts ({last}); "
            f"{part.stat().st_size if part.exists() else 0} bytes kept, the next fetch resumes"
        )

    def _stream(self, action: Action, pointer: Pointer, part: Path, progress: Progress) -> int:
        headers = dict(action.header)
        offset = part.stat().st_size if part.exists() else 0
        if offset >= pointer.size:
            offset = 0  # a full-size leftover failed verification before: start again
        if offset:
            headers["Range"] = f"bytes={offset}-"
        with self.session.get(action.href, headers=headers, stream=True, timeout=self.timeout) as response:
            if response.status_code >= 500 or response.status_code == 429:
                raise RemoteError(f"HTTP {response.status_code}")
            if response.status_code >= 400:
                raise RemoteError(f"download refused: HTTP {response.status_code}")
            if response.status_code == 206 and response.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
                mode, digest = "ab", hash_existing(part)
            else:  # server ignored the Range header: start over
                mode, digest, offset = "wb", hashlib.sha256(), 0
            announced = response.headers.get("Content-Length", "")
            if announced.isdigit() and offset + int(announced) > pointer.size:  # refused before a byte is written
                raise IntegrityError(f"{self.url} announces {offset + int(announced)} bytes for an object of "
                                     f"{pointer.size}")
            received = offset
            started = time.monotonic()
            with open(part, mode) as out, HashingWriter(out, digest) as sink:
                for chunk in response.iter_content(CHUNK if not self.rate_limit else 64 << 10):
                    received += len(chunk)
                    if received > pointer.size:
                        sink.close()
                        part.unlink(missing_ok=True)
                        raise IntegrityError(f"{self.url} sent more than the expected {pointer.size} bytes")
                    sink.write(chunk)
                    progress(received)
                    if self.rate_limit:
                        ahead = (received - offset) / self.rate_limit - (time.monotonic() - started)
                        if ahead > 0:
                            out.flush()
                            time.sleep(ahead)
                digest = sink.close()
        finish_part(part, digest, pointer)
        return offset

    def _verify_stored(self, pointer: Pointer) -> None:
        """Stream the server's copy through sha256 (nothing is written): a corrupt copy is an error naming it."""
        obj = self.batch("download", [pointer]).get(pointer.oid)
        action = obj.actions.get("download") if obj else None
        if action is None:
            raise RemoteError(f"{self.url}: says it holds {pointer.oid} for upload but not for download")
        digest, size = hashlib.sha256(), 0
        with self.session.get(action.href, headers=dict(action.header), stream=True, timeout=self.timeout) as response:
            if response.status_code >= 400:
                raise RemoteError(f"{self.url}: reading back {pointer.oid} failed: HTTP {response.status_code}")
            for chunk in response.iter_content(CHUNK):
                digest.update(chunk)
                size += len(chunk)
        if (digest.hexdigest(), size) != (pointer.oid, pointer.size):
            raise IntegrityError(f"{self.url} holds a corrupt copy of {pointer.oid} (sha256 {digest.hexdigest()}, "
                                 f"{size} bytes) and will not take a new one: delete that object on the server, "
                                 "then publish again")

    # -- upload ---------------------------------------------------------------------------
    def upload(self, path: Path, pointer: Pointer) -> bool:
        obj = self.batch("upload", [pointer]).get(pointer.oid)
        if obj is None:
            raise RemoteError(f"{self.url}: batch upload gave no answer for {pointer.oid[:12]}…")
        if obj.error is not None:
            raise RemoteError(f"{self.url}: upload refused: {obj.error.message}")
        actions = obj.actions
        if "upload" not in actions:  # the server has it: check its copy's bytes, not just its word
            self._verify_stored(pointer)
            return False
        upload = actions["upload"]
        response = self._request("PUT", upload.href, body=path, headers=dict(upload.header))
        if response.status_code >= 400:
            raise RemoteError(f"{self.url}: upload failed: HTTP {response.status_code} {_message(response)}")
        if "verify" in actions:
            verify = actions["verify"]
            headers = {"Accept": LFS_MEDIA_TYPE, "Content-Type": LFS_MEDIA_TYPE, **verify.header}
            response = self._request("POST", verify.href, json={"oid": pointer.oid, "size": pointer.size}, headers=headers)
            if response.status_code >= 400:
                raise RemoteError(f"{self.url}: upload verification failed: HTTP {response.status_code}")
        return True


def _message(response: requests.Response) -> str:
    """An LFS error answer's message (JSON `message`), else the start of its body."""
    try:
        return str(response.json().get("message", ""))[:300] or response.text[:200]
    except (ValueError, AttributeError):
        return response.text[:200]
