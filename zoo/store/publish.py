"""`zoo publish`: put an entry's built objects in the repository's store (or a mirror) and leave pointers.

The repository's store (`store/`, git-lfs's object layout, committed as ordinary content) is where published bytes
live: a build's bytes exist nowhere else once its machine is gone, so publishing is a commit of the card, its
pointers and its objects together. Objects no card names any more are removed from it when an entry is published.

What a store must hold is an entry's primaries (fp32, int8-qat, retrained variants) and its test data; the
derived variants (`--derived`) are optional there, since `zoo fetch` makes them from fp32 and checks their sha256.
`check_store` lists the card objects a store is missing or holds corrupt.

The zoo never installs git-lfs filters in the project checkout, so it writes the pointer files
itself: after a verified upload the content moves into the local cache (it stays fetchable here)
and the checkout keeps the 3-line pointer, ready to commit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import tempfile

from zoo.catalog import Entry, entries, generated_paths, get_entry, store_objects
from zoo.config import REPO_ROOT, REPO_STORE
from zoo.errors import IntegrityError, RemoteError, ZooError
from zoo.fsutil import atomic_write_text, contained
from zoo.provenance import tree_state
from zoo.store.cache import ObjectCache, lfs_objects, object_relpath
from zoo.pointer import Pointer, pointer_for, read_pointer, sha256_file
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


def publish(name: str, to: str | None = None, derived: bool = False) -> list[Published]:
    """Upload the entry's store objects (primaries + test data; `derived` adds the rest, for mirrors) and turn every
    built file of the entry into its pointer (content kept in the local cache), ready to commit. `to`: a mirror; by
    default the repository's store, which takes only a build of the checked-out commit (`zoo build` at a clean
    tree, then `zoo publish`, then one commit of card, pointers and objects)."""
    entry = get_entry(name)
    _check_card_matches(entry)
    into_repo = to is None or _is_repo_store(to)
    if into_repo:
        if derived:
            raise ZooError("the repository's store holds what cannot be made on any CPU (primaries, stored kinds, test "
                           "data); --derived is for mirrors: `zoo publish NAME --to URL --derived`")
        _check_publishable(entry)
        REPO_STORE.mkdir(parents=True, exist_ok=True)
        to = str(REPO_STORE)
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
    if into_repo:
        prune_repo_store()
    return done


def _is_repo_store(to: str) -> bool:
    path = Path(to.removeprefix("file://")).expanduser()
    return "://" not in to.removeprefix("file://") and path.resolve() == REPO_STORE.resolve()


def _check_publishable(entry: Entry) -> None:
    """The repository's store takes the bytes a build of the checked-out commit wrote, and nothing else: the card
    must record HEAD as its clean build commit, and the tree may differ from HEAD only in what builds of HEAD and the
    publishing write (the folders of the entries built at HEAD, the files generated from the cards, the store)."""
    state = tree_state()
    if state.commit is None:
        raise ZooError(f"{REPO_ROOT} is not a git checkout: the repository's store is published by a commit")
    t = entry.card.training
    if not t.git_commit or not t.reproducible:
        raise ZooError(f"{entry.name}'s card records no clean build commit (built with --allow-dirty?): build it with "
                       f"`zoo build {entry.name}` at a clean commit, then publish")
    if t.git_commit != state.commit:
        raise ZooError(f"{entry.name}'s card was built at {t.git_commit[:12]}, the checkout is at {state.commit[:12]}: "
                       f"publish from the commit it was built at, or rebuild (`zoo build {entry.name}`) here")
    built_here = [e.dir.resolve() for e in entries().values() if e.card.training.git_commit == state.commit]
    stray = state.outside([*built_here, REPO_STORE.resolve(), *(p.resolve() for p in generated_paths())])
    if stray:
        shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
        raise ZooError(f"uncommitted changes outside the entries built at {state.commit[:12]} and the store ({shown}): "
                       "publishing is one commit of cards, pointers and objects; commit or stash the rest first")


def named_objects() -> dict[str, str]:
    """oid -> what names it, for every object the repository's store must hold: each built entry's primaries,
    stored kinds and test data, as its card and pointer files say."""
    named = {}
    for name, entry in entries().items():
        for label, path in store_objects(entry):
            pointer = _expected(entry, label, path)
            if pointer is not None:
                named.setdefault(pointer.oid, f"{name} {label}")
    return named


def stored_objects(root: Path = REPO_STORE) -> dict[str, Path]:
    """oid (the file's name) -> path of every file under the store's lfs/objects."""
    objects = lfs_objects(root)
    return {p.name: p for p in sorted(objects.rglob("*")) if p.is_file() or p.is_symlink()} if objects.is_dir() else {}


def prune_repo_store() -> list[Path]:
    """Remove the store's objects no card or pointer names any more (an entry rebuilt, a variant dropped)."""
    named = named_objects()
    removed = []
    for oid, path in stored_objects().items():
        if oid not in named:
            path.unlink()
            removed.append(path)
            for folder in (path.parent, path.parent.parent):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
    return removed


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
    if isinstance(remote, FileRemote) and not remote.objects.is_dir() and not (remote.root / "HEAD").is_file():
        what = "does not exist" if not remote.root.exists() else "is not a store (no lfs/objects folder, not a git repository)"
        raise ZooError(f"{to} {what}: name a bare repository or a folder in git-lfs's layout, such as the repository's "
                       "store/")
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
