"""Content-addressed object cache under $ZOO_HOME, laid out as git-lfs lays out its objects.

Objects only enter the cache after their sha256 and size were verified, and always by an atomic
rename, so a crash or a bad download can never leave a poisoned entry behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from filelock import FileLock

from zoo.config import zoo_home
from zoo.errors import IntegrityError
from zoo.fsutil import atomic_copy
from zoo.pointer import Pointer, sha256_file


def object_relpath(oid: str) -> Path:
    """`aa/bb/<oid>`: git-lfs's layout, shared by the cache and bare-repo remotes."""
    return Path(oid[:2]) / oid[2:4] / oid


def lfs_objects(root: Path) -> Path:
    """Where a store laid out as git-lfs lays out a bare repository (the repository's store/, a bare repo, the folder
    `zoo serve` serves) keeps its objects."""
    return root / "lfs" / "objects"


class ObjectCache:
    def __init__(self, root: Path | None = None):
        self.root = root or zoo_home()
        self.objects = self.root / "objects"
        self.partials = self.root / "partial"
        self.locks = self.root / "locks"

    def path(self, oid: str) -> Path:
        return self.objects / object_relpath(oid)

    def partial_path(self, oid: str) -> Path:
        """Where an interrupted download waits to be resumed."""
        self.partials.mkdir(parents=True, exist_ok=True)
        return self.partials / f"{oid}.part"

    def scratch(self) -> tempfile.TemporaryDirectory:
        """A temporary folder on the cache's filesystem, so what is made there is admitted by a rename."""
        self.root.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix="zoo-derive-", dir=self.root)

    def lock(self, oid: str) -> FileLock:
        """Held while an object is downloaded, so concurrent fetches download it once."""
        self.locks.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.locks / f"{oid}.lock"))

    def get(self, pointer: Pointer, verify: bool = True) -> Path | None:
        """The cached object, or None. A cached file that fails verification is evicted."""
        path = self.path(pointer.oid)
        if not path.is_file():
            return None
        if path.stat().st_size != pointer.size or (verify and sha256_file(path) != pointer.oid):
            path.unlink(missing_ok=True)
            return None
        return path

    def admit(self, source: Path, pointer: Pointer, move: bool = False, verified: bool = False) -> Path:
        """Verify `source` against `pointer` (unless the caller hashed it while streaming) and place it atomically."""
        if not verified:
            check_file(source, pointer)
        target = self.path(pointer.oid)
        target.parent.mkdir(parents=True, exist_ok=True)
        if move:
            os.replace(source, target)
        else:
            atomic_copy(source, target)
        return target


def check_file(path: Path, pointer: Pointer) -> None:
    size = path.stat().st_size
    if size != pointer.size:
        raise IntegrityError(f"{path}: size {size} differs from the expected {pointer.size} bytes")
    digest = sha256_file(path)
    if digest != pointer.oid:
        raise IntegrityError(f"{path}: sha256 {digest} differs from the expected {pointer.oid}")
