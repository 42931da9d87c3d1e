"""`zoo publish`: upload an entry's built objects to an LFS remote and leave pointers in the checkout.

The zoo never installs git-lfs filters in the project checkout, so it writes the pointer files
itself: after a verified upload the content moves into the local cache (it stays fetchable here)
and the checkout keeps the 3-line pointer, ready to commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from zoo.catalog import Entry, get_entry
from zoo.config import REPO_ROOT
from zoo.errors import IntegrityError
from zoo.store.cache import ObjectCache, atomic_write_text
from zoo.store.pointer import pointer_for, read_pointer
from zoo.store.remotes import open_remote


def lfs_patterns(gitattributes: Path = REPO_ROOT / ".gitattributes") -> list[str]:
    """The file patterns .gitattributes routes to LFS."""
    patterns = []
    for line in gitattributes.read_text().splitlines():
        parts = line.split()
        if parts and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            patterns.append(parts[0])
    return patterns


def lfs_files(entry_dir: Path) -> list[Path]:
    patterns = lfs_patterns()
    return sorted(p for p in entry_dir.rglob("*") if p.is_file() and any(fnmatch(p.name, pat) for pat in patterns))


@dataclass
class Published:
    path: Path
    sha256: str
    size: int
    uploaded: bool  # False: the remote already had it


def publish(name: str, to: str) -> list[Published]:
    entry = get_entry(name)
    _check_card_matches(entry)
    remote = open_remote(to)
    cache = ObjectCache()
    done = []
    for path in lfs_files(entry.dir):
        pointer = read_pointer(path)
        if pointer is not None:
            content = cache.get(pointer)
            if content is None:
                continue  # published before and not built here: nothing to upload
        else:
            pointer, content = pointer_for(path), path
        uploaded = remote.upload(content, pointer)
        if content == path:
            cache.admit(path, pointer)
            atomic_write_text(path, pointer.text())
        done.append(Published(path, pointer.oid, pointer.size, uploaded))
    return done


def _check_card_matches(entry: Entry) -> None:
    """Refuse to publish bytes the card does not describe (a stale card means a stale build)."""
    for key, variant in entry.card.variants.items():
        path = entry.variant_path(key)
        if not variant.built or not path.exists():
            continue
        pointer = read_pointer(path) or pointer_for(path)
        if pointer.oid != variant.sha256 or pointer.size != variant.size:
            raise IntegrityError(
                f"{path}: sha256 {pointer.oid[:12]}… differs from the card's {variant.sha256[:12]}…; "
                f"rebuild with `zoo build {entry.name}` so the card describes the files"
            )
