"""A self-hosted LFS server for mirrors of the zoo: giftless, plus HTTP Range on object downloads.

Single points of failure killed the ONNX Model Zoo (LFS bandwidth quotas); anyone can mirror the
zoo's objects with `zoo serve`. Giftless streams objects without Range support, so a small WSGI
middleware answers ranged GETs from the same local storage (what nginx would do in front of it).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import yaml
import waitress
from giftless.app import init_app
from werkzeug.wrappers import Request, Response
from werkzeug.wsgi import wrap_file

_STORAGE_GET = re.compile(r"^/(?P<prefix>.+?)(?:\.git/info/lfs)?/objects/storage/(?P<oid>[0-9a-f]{64})$")


class RangeDownloads:
    """Serve object downloads (ranged or whole) from the storage in 1 MiB blocks; everything else goes to giftless.

    Giftless hands its file object to werkzeug, which iterates a binary file by *lines*: 12 MiB/s measured on a
    64 MiB object. This server is anonymous read-write by design (keep it on loopback or behind a proxy)."""

    def __init__(self, app, storage_path: str):
        self.app = app
        self.storage = Path(storage_path)

    def __call__(self, environ, start_response):
        match = _STORAGE_GET.match(environ.get("PATH_INFO", ""))
        if environ.get("REQUEST_METHOD") != "GET" or match is None:
            return self.app(environ, start_response)

        path = self.storage / match["prefix"] / match["oid"]
        if not path.is_file():
            return self.app(environ, start_response)
        request = Request(environ)
        response = Response(wrap_file(environ, open(path, "rb"), buffer_size=1 << 20),
                            mimetype="application/octet-stream", direct_passthrough=True)
        response.make_conditional(request, accept_ranges=True, complete_length=path.stat().st_size)
        return response(environ, start_response)


def giftless_config(storage: Path) -> dict:
    return {
        "LEGACY_ENDPOINTS": False,
        "AUTH_PROVIDERS": ["giftless.auth.allow_anon:read_write"],
        "TRANSFER_ADAPTERS": {
            "basic": {
                "factory": "giftless.transfer.basic_streaming:factory",
                "options": {"storage_class": "giftless.storage.local_storage:LocalStorage",
                            "storage_options": {"path": str(storage)}},
            }
        },
        "MIDDLEWARE": [{"class": "zoo.store.serve:RangeDownloads", "kwargs": {"storage_path": str(storage)}}],
    }


def serve(storage: Path, host: str = "127.0.0.1", port: int = 8080, ranges: bool = True) -> None:
    """Run the server in this process (blocks). Read-write for anonymous users: keep it on loopback or behind auth."""
    storage = storage.resolve()
    storage.mkdir(parents=True, exist_ok=True)
    config = giftless_config(storage)
    if not ranges:
        config["MIDDLEWARE"] = []
    fd, config_file = tempfile.mkstemp(prefix="giftless-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    os.environ["GIFTLESS_CONFIG_FILE"] = config_file

    try:
        waitress.serve(init_app(), host=host, port=port, threads=8, _quiet=True)
    finally:
        os.unlink(config_file)
