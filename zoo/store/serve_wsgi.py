"""The WSGI layers `zoo serve` puts around giftless (zoo.store.serve): size limits with LFS error bodies, ranged
downloads straight from the storage, and the request log; plus where an object lies in a storage folder and whether
it may be served."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import time
from pathlib import Path

import jwt
from waitress.channel import HTTPChannel
from waitress.task import ErrorTask
from werkzeug.exceptions import UnprocessableEntity
from werkzeug.wrappers import Request, Response
from werkzeug.wsgi import wrap_file

from zoo.cards import SHA256_PATTERN
from zoo.store.cache import lfs_objects, object_relpath

_STORAGE = re.compile(r"^/(?P<prefix>.+?)(?:\.git/info/lfs)?/objects/storage/(?P<oid>[0-9a-f]{64})$")
_BATCH = re.compile(r"/objects/batch$")
_OID = re.compile(SHA256_PATTERN)
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class _JsonErrorTask(ErrorTask):
    """waitress's own refusals (a body or head over the limit, a malformed request) as the JSON error body git-lfs
    shows its user, instead of waitress's plain text."""

    def execute(self):
        error = self.request.error
        body = json.dumps({"message": f"{error.reason}: {error.body}"}).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/vnd.git-lfs+json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class JsonErrorChannel(HTTPChannel):
    error_task_class = _JsonErrorTask


def object_path(storage: Path, oid: str) -> Path:
    """Where the object `oid` lies in a storage folder; anything but a sha256 id is refused (422) before a path is
    made of it."""
    if not _OID.match(oid):
        raise UnprocessableEntity(f"'{oid[:80]}' is not a sha256 object id (64 lowercase hex digits)")
    return lfs_objects(storage) / object_relpath(oid)


def servable(storage: Path, path: Path) -> bool:
    """An object file to serve: a regular file reached without leaving the storage folder (a link in the storage is
    followed only to a file inside it)."""
    return path.is_file() and path.resolve().is_relative_to(storage.resolve())


def _json_error(status: int, message: str):
    return Response(json.dumps({"message": message}), status=status, mimetype="application/vnd.git-lfs+json")


class Limits:
    """Refuse oversized batch bodies (413), batch uploads of objects over the size limit (422) and oversized PUTs
    (413, before reading them), with the LFS error body git-lfs shows its user."""

    def __init__(self, app, max_object_size: int, max_batch_body: int):
        self.app, self.max_object_size, self.max_batch_body = app, max_object_size, max_batch_body  # ServeLimits

    def __call__(self, environ, start_response):
        method, path = environ.get("REQUEST_METHOD"), environ.get("PATH_INFO", "")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if method == "PUT" and _STORAGE.match(path) and length > self.max_object_size:
            return _json_error(413, f"{length} bytes exceed this server's object size limit of "
                                    f"{self.max_object_size}")(environ, start_response)
        if method == "POST" and _BATCH.search(path):
            if length > self.max_batch_body:
                return _json_error(413, f"batch request of {length} bytes exceeds this server's limit of "
                                        f"{self.max_batch_body}; send fewer objects per request")(environ, start_response)
            body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(body)
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                request = {}
            if isinstance(request, dict) and request.get("operation") == "upload":
                too_big = [o for o in request.get("objects") or [] if isinstance(o, dict)
                           and isinstance(o.get("size"), int) and o["size"] > self.max_object_size]
                if too_big:
                    return _json_error(422, f"object {str(too_big[0].get('oid'))[:64]} ({too_big[0]['size']} bytes) "
                                            f"exceeds this server's object size limit of {self.max_object_size} "
                                            "bytes")(environ, start_response)
        return self.app(environ, start_response)


class RangeDownloads:
    """Serve object downloads (ranged or whole) from the storage in 1 MiB blocks; everything else goes to giftless.

    Giftless hands its file object to werkzeug, which iterates a binary file by *lines*: 12 MiB/s measured on a
    64 MiB object. Downloads are public (anonymous read), so this answers them without giftless's auth."""

    def __init__(self, app, storage_path: str):
        self.app = app
        self.storage = Path(storage_path)

    def __call__(self, environ, start_response):
        match = _STORAGE.match(environ.get("PATH_INFO", ""))
        if environ.get("REQUEST_METHOD") != "GET" or match is None:
            return self.app(environ, start_response)

        path = object_path(self.storage, match["oid"])
        if not servable(self.storage, path):  # giftless answers 404
            return self.app(environ, start_response)
        request = Request(environ)
        response = Response(wrap_file(environ, open(path, "rb"), buffer_size=1 << 20),
                            mimetype="application/octet-stream", direct_passthrough=True)
        response.make_conditional(request, accept_ranges=True, complete_length=path.stat().st_size)
        return response(environ, start_response)


class AccessLog:
    """One line per request: Common Log Format (client, token subject, time, request line, status, bytes sent), then
    `in=<bytes received> oid=<object id or -> <seconds>s`."""

    def __init__(self, app, destination: str = "-", secret: str | None = None):
        self.app, self.secret = app, secret  # the secret verifies a token before its subject is logged
        self.log = logging.getLogger(f"zoo.serve.access.{id(self)}")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)
        handler = logging.StreamHandler(sys.stderr) if destination == "-" else logging.FileHandler(destination)
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.log.addHandler(handler)

    def __call__(self, environ, start_response):
        started, status, sent = time.perf_counter(), ["-"], [0]

        def recording_start_response(status_line, headers, exc_info=None):
            status[0] = status_line.split(" ", 1)[0]
            return start_response(status_line, headers, exc_info)

        path = environ.get("PATH_INFO", "")
        result = self.app(environ, recording_start_response)
        try:
            for chunk in result:
                sent[0] += len(chunk)
                yield chunk
        finally:
            if hasattr(result, "close"):
                result.close()
            match = _STORAGE.match(path)
            # Signed links carry their token in the query: never write a credential to the log.
            query = re.sub(r"(jwt=)[^&]*", r"\1<redacted>", environ.get("QUERY_STRING", ""))
            query = f"?{query}" if query else ""
            when = time.strftime("%d/%b/%Y:%H:%M:%S %z")
            self.log.info(f'{_client(environ)} - {_subject(environ, self.secret)} [{when}] '
                          f'"{environ.get("REQUEST_METHOD")} {path}{query} {environ.get("SERVER_PROTOCOL", "HTTP/1.1")}" '
                          f'{status[0]} {sent[0]} in={environ.get("CONTENT_LENGTH") or 0} '
                          f'oid={match["oid"] if match else "-"} {time.perf_counter() - started:.3f}s')


def _client(environ) -> str:
    """The client's address; behind a proxy on this machine, the address the proxy forwarded for."""
    peer = environ.get("REMOTE_ADDR", "-")
    forwarded = environ.get("HTTP_X_FORWARDED_FOR", "").split(",")[0].strip()
    if peer in LOOPBACK and forwarded and re.fullmatch(r"[0-9a-fA-F.:]+", forwarded):
        return forwarded
    return peer


def _subject(environ, secret: str | None) -> str:
    """Who the request's bearer token says it is for, only when the token verifies against the server's secret
    (HS256, unexpired): anything else is logged as `invalid-token`, never as the name it claims."""
    header = environ.get("HTTP_AUTHORIZATION", "")
    if not header.lower().startswith("bearer "):
        return "-"
    if not secret:
        return "invalid-token"
    try:
        claims = jwt.decode(header[7:], secret, algorithms=["HS256"])
    except jwt.PyJWTError:
        return "invalid-token"
    return re.sub(r"[^\w.@-]", "_", str(claims.get("sub", "token")))[:64] or "token"
