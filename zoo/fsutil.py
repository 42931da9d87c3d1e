"""Atomic file writes: a temporary file beside the target, then a rename, so no reader ever sees half a file."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_beside(target: Path) -> tuple[int, str]:
    target.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")


def replace_into(tmp: str | Path, target: Path) -> None:
    """Give a finished temporary file normal permissions (mkstemp makes 0600) and rename it into place."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, target)


def atomic_copy(source: Path, target: Path) -> None:
    """Copy through a temporary file in the target's folder, then rename: never a half-written target."""
    fd, tmp = _temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
        replace_into(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(target: Path, data: bytes) -> None:
    fd, tmp = _temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        replace_into(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(target: Path, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))
