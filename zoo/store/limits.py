"""What `zoo serve` accepts (zoo.store.serve): in a module of its own, without giftless, so the CLI can show the
defaults without importing the server (~0.4 s a `zoo` command)."""

from __future__ import annotations

from dataclasses import dataclass

from zoo.errors import ZooError

DEFAULT_MAX_OBJECT = 2 * 2**30  # 2 GiB: the largest zoo files are a few hundred MiB
DEFAULT_MAX_BATCH_BODY = 2**20  # 1 MiB: ~10,000 objects per batch request
DEFAULT_MAX_HEAD = 64 * 2**10  # request line and headers (a token is ~300 bytes)
DEFAULT_BODY_TIMEOUT = 30  # seconds without a byte of an unfinished request before the connection is closed


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
