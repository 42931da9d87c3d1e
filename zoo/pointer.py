"""Git LFS pointer files (spec v1): three lines naming the object's sha256 and size."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import PointerFileError

SPEC_URL = "https://git-lfs.github.com/spec/v1"
# Pointers are tiny; anything larger is content. git-lfs uses the same bound.
MAX_POINTER_SIZE = 1024
_POINTER_RE = re.compile(
    rb"\Aversion https://git-lfs\.github\.com/spec/v1\n"
    rb"oid sha256:(?P<oid>[0-9a-f]{64})\n"
    rb"size (?P<size>\d+)\n\Z"
)
CHUNK = 1 << 20


@dataclass(frozen=True)
class Pointer:
    oid: str  # sha256 hex of the content
    size: int

    def text(self) -> str:
        return f"version {SPEC_URL}\noid sha256:{self.oid}\nsize {self.size}\n"


def parse_pointer(data: bytes) -> Pointer | None:
    """The pointer in `data`, or None when `data` is not a pointer file."""
    m = _POINTER_RE.match(data)
    return Pointer(m["oid"].decode(), int(m["size"])) if m else None


def read_pointer(path: Path) -> Pointer | None:
    """The pointer stored at `path`, or None when the file holds real content."""
    if path.stat().st_size > MAX_POINTER_SIZE:
        return None
    return parse_pointer(path.read_bytes())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pointer_for(path: Path) -> Pointer:
    """The pointer describing the content at `path`."""
    return Pointer(sha256_file(path), path.stat().st_size)


def ensure_content(path: Path, fetch_command: str = "`zoo fetch NAME --variant VARIANT`") -> Path:
    """Return `path`, or raise a clear error if it is an LFS pointer instead of the real file."""
    pointer = read_pointer(path)
    if pointer is not None:
        raise PointerFileError(
            f"{path} is a Git LFS pointer (sha256 {pointer.oid[:12]}…, {pointer.size} bytes), not the file's "
            f"content; run {fetch_command} or `git -c lfs.fetchexclude= lfs pull --include {path}`"
        )
    return path
