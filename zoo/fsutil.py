"""Where the zoo writes: paths held inside their folder, and atomic writes (a temporary file beside the target, then a
rename, so no reader ever sees half a file)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from zoo.errors import ZooError


class PathEscapeError(ZooError):
    """A path from a card, recipe or argument that leads outside the folder it belongs to."""


def contained(folder: Path, name: str | Path, where: str, error: type[ZooError] = PathEscapeError,
              role: str = "folder") -> Path:
    """`folder / name`, resolved, or `error` when it leaves `folder`: an absolute name, `..` parts, or a symlink (of
    the file or of a folder on the way) that points outside. Every path the zoo writes or uploads from a card, a
    recipe or an argument goes through here before anything is written."""
    base = Path(folder).resolve()
    target = (Path(folder) / name).resolve()
    if Path(name).is_absolute() or not target.is_relative_to(base):
        raise error(f"{where}: {str(name)!r} escapes its {role} {base.name}/ (paths must stay inside it)")
    return target


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


@contextlib.contextmanager
def atomic_folder(target: Path) -> Iterator[Path]:
    """A temporary folder beside `target` to fill; renamed to `target` when the block ends without an exception (a
    reader sees the whole folder or none), removed otherwise. `target` must not exist yet."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def human_size(size: int) -> str:
    """Bytes as people read them, in binary units (KiB, MiB, GiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def plural(n: int, word: str) -> str:
    """`1 thread`, `2 threads`, `1 process`, `2 processes`."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}{'es' if word.endswith(('s', 'sh', 'ch', 'x')) else 's'}"
