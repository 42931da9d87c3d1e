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
import os
import secrets
import tempfile
import time
from pathlib import Path

import jwt
import yaml
from giftless.app import init_app
from giftless.storage import exc as giftless_errors
from giftless.storage.local_storage import LocalStorage
from waitress.server import create_server
from werkzeug.exceptions import RequestEntityTooLarge, UnprocessableEntity

from zoo.errors import ZooError
from zoo.store.limits import DEFAULT_MAX_OBJECT, ServeLimits
from zoo.store.serve_wsgi import LOOPBACK, JsonErrorChannel, object_path, servable

MIN_SECRET_LENGTH = 32
ACTION_LIFETIME = 600  # seconds a pre-authorized upload/download link stays valid
CHUNK = 1 << 20


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
    middleware = [{"class": "zoo.store.serve_wsgi:Limits",
                   "kwargs": {"max_object_size": limits.max_object_size, "max_batch_body": limits.max_batch_body}}]
    if ranges:
        middleware.append({"class": "zoo.store.serve_wsgi:RangeDownloads", "kwargs": {"storage_path": str(storage)}})
    if access_log is not None:
        middleware.append({"class": "zoo.store.serve_wsgi:AccessLog", "kwargs": {"destination": access_log, "secret": secret}})
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
    server.channel_class = JsonErrorChannel  # waitress's own refusals as JSON LFS errors
    server.run()
