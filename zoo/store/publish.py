"""`zoo publish`: upload an entry's built objects to an LFS remote and leave pointers in the checkout.

What a store must hold is an entry's primaries (fp32, int8-qat, retrained variants) and its test data; the
derived variants (`--derived`) are optional there, since `zoo fetch` makes them from fp32 and checks their sha256.
`check_store` lists the card objects a store is missing or holds corrupt.

The zoo never installs git-lfs filters in the project checkout, so it writes the pointer files
itself: after a verified upload the content moves into the local cache (it stays fetchable here)
and the checkout keeps the 3-line pointer, ready to commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import tempfile

from zoo.catalog import Entry, entries, get_entry, store_objects
from zoo.config import REPO_ROOT
from zoo.errors import IntegrityError, RemoteError
from zoo.fsutil import atomic_write_text, contained
from zoo.store.cache import ObjectCache, object_relpath
from zoo.store.pointer import Pointer, pointer_for, read_pointer, sha256_file
from zoo.store.remotes import FileRemote, NotOnRemote, open_remote


def lfs_patterns(gitattributes: Path = REPO_ROOT / ".gitattributes") -> list[str]:
    """The file patterns .gitattributes routes to LFS."""
    patterns = []
    for line in gitattributes.read_text().splitlines():
        parts = line.split()
        if parts and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            patterns.append(parts[0])
    return patterns


def lfs_files(entry_dir: Path) -> list[Path]:
    """The entry's files .gitattributes routes to LFS; a link that leads out of the entry folder is refused (its
    target would be uploaded as the model) before anything is uploaded or rewritten."""
    patterns = lfs_patterns()
    files = sorted(p for p in entry_dir.rglob("*") if p.is_file() and any(fnmatch(p.name, pat) for pat in patterns))
    for path in files:
        contained(entry_dir, path.relative_to(entry_dir), f"{entry_dir / 'card.yaml'}", role="entry folder")
    return files


@dataclass
class Published:
    path: Path
    sha256: str
    size: int
    uploaded: bool  # False: the remote already had it


def publish(name: str, to: str, derived: bool = False) -> list[Published]:
    """Upload the entry's store objects (primaries + test data; `derived` adds the rest) and turn every built file
    of the entry into its pointer (content kept in the local cache), ready to commit."""
    entry = get_entry(name)
    _check_card_matches(entry)
    remote = open_remote(to)
    cache = ObjectCache()
    wanted = {p.resolve() for _, p in store_objects(entry, derived=derived)}
    done = []
    for path in lfs_files(entry.dir):
        pointer = read_pointer(path)
        if pointer is not None:
            content = cache.get(pointer)
        else:
            pointer, content = pointer_for(path), path
        uploaded = False
        if path.resolve() in wanted:
            if content is None:
                continue  # published before and not built here: nothing to upload
            uploaded = remote.upload(content, pointer)
        if content == path:
            cache.admit(path, pointer)
            atomic_write_text(path, pointer.text())
        if path.resolve() in wanted:
            done.append(Published(path, pointer.oid, pointer.size, uploaded))
    return done


def store_size(to: str) -> int | None:
    """Bytes of every LFS object a bare-repo store holds (None for HTTP stores, which do not list objects)."""
    remote = open_remote(to)
    if not isinstance(remote, FileRemote):
        return None
    return sum(p.stat().st_size for p in remote.objects.rglob("*") if p.is_file()) if remote.objects.is_dir() else 0


@dataclass
class StoreProblem:
    entry: str
    label: str
    path: str
    sha256: str
    status: str  # "missing" or "corrupt"


def check_store(to: str, derived: bool = False) -> tuple[list[StoreProblem], int]:
    """(missing or corrupt card objects, objects checked): every object is read and hashed."""
    remote = open_remote(to)
    problems, total = [], 0
    with tempfile.TemporaryDirectory(prefix="zoo-check-") as tmp:
        for name, entry in entries().items():
            for label, path in store_objects(entry, derived=derived):
                pointer = _expected(entry, label, path)
                if pointer is None:
                    continue
                total += 1
                status = _object_status(remote, pointer, Path(tmp) / "object.part")
                if status != "ok":
                    problems.append(StoreProblem(name, label, str(path.relative_to(entry.dir)), pointer.oid, status))
    return problems, total


def _expected(entry: Entry, label: str, path: Path) -> Pointer | None:
    variant = entry.card.variants.get(label)
    if variant is not None:
        return Pointer(variant.sha256, variant.size)
    return (read_pointer(path) or pointer_for(path)) if path.exists() else None


def _object_status(remote, pointer: Pointer, part: Path) -> str:
    if isinstance(remote, FileRemote):
        stored = remote.objects / object_relpath(pointer.oid)
        if not stored.is_file():
            return "missing"
        ok = stored.stat().st_size == pointer.size and sha256_file(stored) == pointer.oid
        return "ok" if ok else "corrupt"
    try:
        remote.download(pointer, part, lambda n: None)
    except NotOnRemote:
        return "missing"
    except IntegrityError:
        return "corrupt"
    except RemoteError as exc:
        return f"error: {exc}"
    finally:
        part.unlink(missing_ok=True)
    return "ok"


def _check_card_matches(entry: Entry) -> None:
    """Refuse to publish bytes the card does not describe (a stale card means a stale build)."""
    for key, variant in entry.card.variants.items():
        path = entry.variant_path(key)
        if not variant.built or not path.exists():
            continue
        pointer = read_pointer(path) or pointer_for(path)
        if pointer.oid != variant.sha256 or pointer.size != variant.size:
            raise IntegrityError(
                f"{path}: sha256 {pointer.oid} differs from the card's {variant.sha256}; "
                f"rebuild with `zoo build {entry.name}` so the card describes the files"
            )
