"""A self-hosted LFS server for mirrors of the zoo: giftless, read-only to the world, uploads with a token.

Single points of failure killed the ONNX Model Zoo (LFS bandwidth quotas); anyone can mirror the zoo's objects with
`zoo serve`. Around giftless:

- **Who may write**: anonymous users read; uploads need a JWT signed with the operator's secret (`ZOO_SERVE_SECRET`
  or `--secret-file`), minted by `zoo serve --issue-token` and sent by `zoo publish` from `ZOO_LFS_TOKEN`. giftless's
  pre-authorized action links (the upload and download hrefs of a batch answer) are signed with the same secret, never
  with giftless's built-in default key. `--anonymous-writes` restores anonymous read-write for tests and loopback use.
- **What is stored**: `VerifiedLocalStorage` writes an upload to a temporary file, hashes it and makes it visible
  (an atomic rename) only when its sha256 is its object id and it fits the size limit; anything else is refused with
  422/413 and leaves nothing in storage. Objects lie in git-lfs's layout (`lfs/objects/ab/cd/<oid>`, named by their
  id alone, never by a request's path), so `zoo serve --storage store` serves the repository's store as it is. A
  link in the storage is followed only to a file inside it (`servable`): neither the batch API nor a download offers
  what lies outside.
- **Limits** (`ServeLimits`, one set, each a `zoo serve` option): the largest object (batch requests announcing a
  larger one are refused with 422; a larger upload with 413 when its Content-Length says so, before a byte is read,
  and as soon as a chunked body passes it), the largest batch request body, the largest request head, and how long a
  client may leave a request body unfinished. Every refusal is a JSON LFS error (`{"message": ...}`), also those
  waitress makes itself.
- **Request log**: one line per request — Common Log Format plus the object id, bytes received and the duration.
- **Ranges**: giftless streams objects without HTTP Range support, so a small WSGI middleware answers downloads
  (ranged or whole) from the same storage in 1 MiB blocks (what nginx would do in front of it).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
import yaml
from giftless.app import init_app
from giftless.storage import exc as giftless_errors
from giftless.storage.local_storage import LocalStorage
from waitress.channel import HTTPChannel
from waitress.server import create_server
from waitress.task import ErrorTask
from werkzeug.exceptions import RequestEntityTooLarge, UnprocessableEntity
from werkzeug.wrappers import Request, Response
from werkzeug.wsgi import wrap_file

from zoo.cards import SHA256_PATTERN
from zoo.errors import ZooError
from zoo.store.cache import lfs_objects, object_relpath

_STORAGE = re.compile(r"^/(?P<prefix>.+?)(?:\.git/info/lfs)?/objects/storage/(?P<oid>[0-9a-f]{64})$")
_BATCH = re.compile(r"/objects/batch$")
_OID = re.compile(SHA256_PATTERN)
MIN_SECRET_LENGTH = 32
DEFAULT_MAX_OBJECT = 2 * 2**30  # 2 GiB: the largest zoo files are a few hundred MiB
DEFAULT_MAX_BATCH_BODY = 2**20  # 1 MiB: ~10,000 objects per batch request
DEFAULT_MAX_HEAD = 64 * 2**10  # request line and headers (a token is ~300 bytes)
DEFAULT_BODY_TIMEOUT = 30  # seconds without a byte of an unfinished request before the connection is closed
ACTION_LIFETIME = 600  # seconds a pre-authorized upload/download link stays valid
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
CHUNK = 1 << 20


@dataclass(frozen=True)
class ServeLimits:
    """What `zoo serve` accepts; the middleware (JSON errors) and waitress (bodies, heads, slow clients) enforce the
    same numbers."""

    max_object_size: int = DEFAULT_MAX_OBJECT
    max_batch_body: int = DEFAULT_MAX_BATCH_BODY
    max_head: int = DEFAULT_MAX_HEAD
    body_timeout: int = DEFAULT_BODY_TIMEOUT

    def __post_init__(self):
        for name in ("max_object_size", "max_batch_body", "max_head", "body_timeout"):
            if getattr(self, name) <= 0:
                raise ZooError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be a positive number")

    def waitress(self) -> dict:
        # waitress reads a whole body before the application sees it: it must refuse a larger one itself (it refuses
        # a body of max_request_body_size bytes or more, hence + 1).
        return {"max_request_body_size": max(self.max_object_size, self.max_batch_body) + 1,
                "max_request_header_size": self.max_head, "channel_timeout": self.body_timeout,
                "cleanup_interval": max(1, min(30, self.body_timeout // 2))}  # how often waitress looks for them


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


class _JsonErrorChannel(HTTPChannel):
    error_task_class = _JsonErrorTask


class VerifiedLocalStorage(LocalStorage):
    """giftless's local storage, but an object appears only whole and only when its bytes hash to its name."""

    def __init__(self, path: str | None = None, max_object_size: int = DEFAULT_MAX_OBJECT, **options):
        super().__init__(path, **options)
        self.max_object_size = max_object_size

    def _get_path(self, prefix: str, oid: str) -> Path:
        """git-lfs's own object layout (lfs/objects/ab/cd/<oid>), whatever repository path the client asked under:
        the folder served is laid out like a clone's objects and the repository's store (`zoo serve --storage store`
        serves it as it is), and no part of a request's path ever becomes part of a file's path."""
        return object_path(Path(self.path), oid)

    def exists(self, prefix: str, oid: str) -> bool:
        return servable(Path(self.path), self._get_path(prefix, oid))

    def get(self, prefix: str, oid: str):
        path = self._get_path(prefix, oid)
        if not servable(Path(self.path), path):
            raise giftless_errors.ObjectNotFoundError(f"object {oid} was not found")
        return path.open("rb")

    def put(self, prefix: str, oid: str, data_stream) -> int:
        path = self._get_path(prefix, oid)
        self._create_path(str(path.parent))
        digest, size = hashlib.sha256(), 0
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := data_stream.read(CHUNK):
                    size += len(chunk)
                    if size > self.max_object_size:
                        raise RequestEntityTooLarge(f"object {oid} is larger than this server's limit of "
                                                    f"{self.max_object_size} bytes: refused, nothing stored")
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != oid:
                raise UnprocessableEntity(f"the uploaded bytes ({size}) hash to sha256 {digest.hexdigest()}, not to the "
                                          f"object id {oid}: refused, nothing stored")
            os.replace(temporary, path)  # visible only now, and whole
            return size
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)


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

    def __init__(self, app, max_object_size: int = DEFAULT_MAX_OBJECT, max_batch_body: int = DEFAULT_MAX_BATCH_BODY):
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


def load_secret(secret_file: Path | None = None) -> str | None:
    """The operator's signing secret: --secret-file, else ZOO_SERVE_SECRET; None when neither is set."""
    if secret_file is not None:
        try:
            secret = secret_file.read_text().strip()
        except OSError as exc:
            raise ZooError(f"--secret-file {secret_file}: cannot read it ({exc.strerror})") from None
    else:
        secret = os.environ.get("ZOO_SERVE_SECRET", "").strip()
        if not secret:
            return None
    if len(secret) < MIN_SECRET_LENGTH:
        raise ZooError(f"the server secret is {len(secret)} characters; use at least {MIN_SECRET_LENGTH}, e.g. "
                       "`python -c 'import secrets; print(secrets.token_hex(32))'`")
    return secret


def exposure_warning(host: str, anonymous_writes: bool) -> str | None:
    """What `zoo serve` warns about before it starts: anonymous writes reachable from other machines."""
    if anonymous_writes and host not in LOOPBACK:
        return (f"warning: --anonymous-writes on {host}: anyone who can reach this address can upload objects; "
                "use a secret and tokens for a mirror others can reach")
    return None


def issue_token(secret: str, expires_in: int, subject: str = "publisher") -> str:
    """An upload token: HS256, signed with the server's secret, valid for `expires_in` seconds, all objects."""
    now = int(time.time())
    claims = {"sub": subject, "iat": now, "exp": now + expires_in, "scopes": ["obj:*"]}
    return jwt.encode(claims, secret, algorithm="HS256")


def giftless_config(storage: Path, secret: str | None, anonymous_writes: bool = False, ranges: bool = True,
                    limits: ServeLimits = ServeLimits(), access_log: str | None = "-") -> dict:
    # Action links are signed with the operator's secret, or (no secret) a key of this process only: never with
    # giftless's built-in "change-me", which would let anyone forge an upload link.
    signing_key = secret or secrets.token_hex(32)
    providers = ["giftless.auth.allow_anon:read_write"] if anonymous_writes else [
        *([{"factory": "giftless.auth.jwt:factory", "options": {"algorithm": "HS256", "private_key": secret}}]
          if secret else []),
        "giftless.auth.allow_anon:read_only"]
    middleware = [{"class": "zoo.store.serve:Limits",
                   "kwargs": {"max_object_size": limits.max_object_size, "max_batch_body": limits.max_batch_body}}]
    if ranges:
        middleware.append({"class": "zoo.store.serve:RangeDownloads", "kwargs": {"storage_path": str(storage)}})
    if access_log is not None:
        middleware.append({"class": "zoo.store.serve:AccessLog", "kwargs": {"destination": access_log, "secret": secret}})
    return {
        "LEGACY_ENDPOINTS": False,
        "AUTH_PROVIDERS": providers,
        "PRE_AUTHORIZED_ACTION_PROVIDER": {
            "factory": "giftless.auth.jwt:factory",
            "options": {"algorithm": "HS256", "private_key": signing_key, "default_lifetime": ACTION_LIFETIME,
                        "key_id": "zoo-serve-actions"},
        },
        "TRANSFER_ADAPTERS": {
            "basic": {
                "factory": "giftless.transfer.basic_streaming:factory",
                "options": {"storage_class": "zoo.store.serve:VerifiedLocalStorage",
                            "storage_options": {"path": str(storage), "max_object_size": limits.max_object_size}},
            }
        },
        "MIDDLEWARE": middleware,
    }


def serve(storage: Path, host: str = "127.0.0.1", port: int = 8080, ranges: bool = True, secret: str | None = None,
          anonymous_writes: bool = False, limits: ServeLimits = ServeLimits(), access_log: str | None = "-") -> None:
    """Run the server in this process (blocks)."""
    storage = storage.resolve()
    storage.mkdir(parents=True, exist_ok=True)
    config = giftless_config(storage, secret, anonymous_writes, ranges, limits, access_log)
    fd, config_file = tempfile.mkstemp(prefix="giftless-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # it holds the secret
        yaml.safe_dump(config, f)
    os.environ["GIFTLESS_CONFIG_FILE"] = config_file
    try:
        app = init_app()
    finally:
        os.unlink(config_file)  # read once by init_app
    server = create_server(app, host=host, port=port, threads=8, **limits.waitress())
    server.channel_class = _JsonErrorChannel  # waitress's own refusals as JSON LFS errors
    server.run()
