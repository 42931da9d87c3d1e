"""Files cards published before: the repository's store keeps only what today's cards name (`zoo publish` prunes the
rest), while git keeps every object the store ever held. A recipe that continues training from an earlier published
file (`init_from: {entry, variant, sha256, size}`) fetches it like `zoo fetch` does, else from here, verified by its
sha256 before the cache admits it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from zoo.cards import PublishedFile
from zoo.config import REPO_ROOT, REPO_STORE
from zoo.errors import IntegrityError, ObjectNotFoundError
from zoo.pointer import Pointer
from zoo.store.cache import ObjectCache, lfs_objects, object_relpath
from zoo.store.fetch import fetch_object


def from_history(pointer: Pointer, root: Path = REPO_ROOT, store: Path = REPO_STORE) -> Path | None:
    """The object as a commit of the checkout at `root` held it in its store, admitted to the cache once verified;
    None when no commit did (or `root` is no git checkout, or a shallow clone lacks that commit). A committed copy
    with other bytes raises IntegrityError and leaves nothing behind."""
    path = (lfs_objects(store.relative_to(root)) / object_relpath(pointer.oid)).as_posix()
    added = subprocess.run(["git", "log", "--all", "--format=%H", "--diff-filter=A", "--", path], cwd=root,
                           capture_output=True, text=True, timeout=120)
    cache = ObjectCache()
    for commit in added.stdout.split() if added.returncode == 0 else []:
        with cache.lock(pointer.oid):
            if (hit := cache.get(pointer)) is not None:
                return hit
            part = cache.partial_path(pointer.oid)
            with open(part, "wb") as out:
                blob = subprocess.run(["git", "cat-file", "blob", f"{commit}:{path}"], cwd=root, stdout=out,
                                      stderr=subprocess.DEVNULL, timeout=600)
            if blob.returncode != 0:
                part.unlink(missing_ok=True)
                continue
            try:
                return cache.admit(part, pointer, move=True)
            except IntegrityError as exc:
                part.unlink(missing_ok=True)
                raise IntegrityError(f"{path} as commit {commit[:12]} holds it is not the object its name says "
                                     f"({exc}); nothing was cached") from None
    return None


def published_object(file: PublishedFile) -> Path:
    """A published file, verified: the checkout's stores and the cache first (zoo.store.fetch), else the repository's
    store as an earlier commit held it."""
    pointer = Pointer(file.sha256, file.size)
    try:
        return fetch_object(pointer, file.label(), show_progress=False).path
    except ObjectNotFoundError:  # StoreUnreachableError included: the history may still hold it
        found = from_history(pointer)
        if found is None:
            raise ObjectNotFoundError(f"init_from: {file.label()} is in none of the stores `zoo fetch` reads and in no "
                                      "commit of this checkout's store/ (a shallow clone lacks the older ones: "
                                      "`git fetch --unshallow`)") from None
        return found
