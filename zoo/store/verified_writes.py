"""Downloads written and verified as they arrive: the sha256 is computed while the bytes are written (a resumed
download continues from the partial file's hash), and a finished file is kept only when it is the object it claims."""

from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path

from zoo.errors import IntegrityError
from zoo.pointer import CHUNK, Pointer


def hash_existing(part: Path) -> "hashlib._Hash":
    """sha256 state of the bytes already in a partial download (a resumed one continues from it)."""
    digest = hashlib.sha256()
    if part.exists():
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return digest


class HashingWriter:
    """Writes chunks to a file in the caller's thread while a second thread feeds them to sha256 (hashlib releases the
    GIL on large buffers): verification overlaps the copy instead of adding to it. `digest` may carry the hash of
    bytes already in the file (a resumed download)."""

    _DONE = object()

    def __init__(self, out, digest=None, depth: int = 16):
        self.out, self.digest = out, digest or hashlib.sha256()
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._hash, daemon=True)
        self.thread.start()

    def _hash(self) -> None:
        while (chunk := self.queue.get()) is not self._DONE:
            self.digest.update(chunk)

    def write(self, chunk: bytes) -> None:
        self.queue.put(chunk)
        self.out.write(chunk)

    def close(self):
        """Wait for the hash to catch up; returns the digest."""
        self.queue.put(self._DONE)
        self.thread.join()
        return self.digest

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self.thread.is_alive():
            self.close()


def finish_part(part: Path, digest, pointer: Pointer) -> None:
    """Keep a completed `.part` only when its size and sha256 are the pointer's; else remove it and say so."""
    size = part.stat().st_size
    if size != pointer.size or digest.hexdigest() != pointer.oid:
        part.unlink(missing_ok=True)  # never resume from bytes that proved wrong
        raise IntegrityError(
            f"downloaded object has sha256 {digest.hexdigest()} and {size} bytes, expected {pointer.oid} and "
            f"{pointer.size} bytes; the remote's copy is corrupt (nothing was cached)"
        )
