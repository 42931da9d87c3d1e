"""`zoo fetch`: get a variant's bytes, verified, from the first place that has them.

Order: the real file in the checkout, the local cache, then each configured remote. A download is
taken under a per-object file lock, so concurrent fetches of one object download it once.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from zoo.catalog import Entry, entries, get_entry
from zoo.config import lfs_remote_urls
from zoo.errors import IntegrityError, ObjectNotFoundError, RemoteError
from zoo.store.cache import ObjectCache, atomic_copy
from zoo.store.pointer import Pointer, ensure_content, read_pointer, sha256_file
from zoo.store.remotes import NotOnRemote, open_remote


@dataclass
class FetchResult:
    name: str
    variant: str
    path: Path
    size: int
    sha256: str
    source: str  # "checkout", "cache" or the remote's URL
    resumed_from: int = 0  # bytes an interrupted earlier download had already fetched
    metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**asdict(self), "path": str(self.path)}


@contextlib.contextmanager
def _progress_bar(label: str, total: int, show: bool):
    if not show:
        yield lambda n: None
        return
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)


def fetch_object(
    pointer: Pointer,
    label: str,
    checkout_path: Path | None = None,
    remotes: list[str] | None = None,
    build_hint: str = "",
    show_progress: bool = True,
    rate_limit: float | None = None,
) -> tuple[Path, str, int]:
    """(path, source, resumed_from) of the verified object. Raises with everything that was tried."""
    tried: list[str] = []
    if checkout_path is not None:
        if not checkout_path.exists():
            tried.append(f"checkout {checkout_path}: absent")
        elif read_pointer(checkout_path) is not None:
            tried.append(f"checkout {checkout_path}: a Git LFS pointer")
        elif checkout_path.stat().st_size == pointer.size and sha256_file(checkout_path) == pointer.oid:
            return checkout_path, "checkout", 0
        else:
            tried.append(f"checkout {checkout_path}: content differs from the card's sha256")

    cache = ObjectCache()
    if (hit := cache.get(pointer)) is not None:
        return hit, "cache", 0
    tried.append(f"cache {cache.path(pointer.oid)}: absent")

    urls = lfs_remote_urls() if remotes is None else remotes
    with cache.lock(pointer.oid):
        # Another process may have downloaded it while this one waited for the lock.
        if (hit := cache.get(pointer)) is not None:
            return hit, "cache", 0
        part = cache.partial_path(pointer.oid)
        for url in urls:
            try:
                remote = open_remote(url, rate_limit=rate_limit)
                with _progress_bar(label, pointer.size, show_progress) as advance:
                    resumed_from = remote.download(pointer, part, advance)
            except NotOnRemote:
                tried.append(f"remote {url}: not there")
                continue
            except IntegrityError as exc:
                part.unlink(missing_ok=True)
                raise IntegrityError(f"{label}: {exc}") from None
            except RemoteError as exc:
                # Keep the .part for a later resume; try the next remote.
                tried.append(f"remote {exc}")
                continue
            return cache.admit(part, pointer, move=True, verified=True), url, resumed_from
    if not urls:
        tried.append("no LFS remote configured (set ZOO_LFS_URL or git's lfs.url)")
    raise ObjectNotFoundError(f"{label} (sha256 {pointer.oid[:12]}…) was not found: {'; '.join(tried)}.{build_hint}")


def fetch(
    name: str,
    variant: str = "fp32",
    dest: Path | None = None,
    remotes: list[str] | None = None,
    show_progress: bool = True,
    rate_limit: float | None = None,
) -> FetchResult:
    """Fetch one variant of a zoo model; returns where its verified bytes are."""
    entry = get_entry(name)
    spec = entry.variant(variant)
    if not spec.built:
        raise ObjectNotFoundError(f"model '{name}' variant '{variant}' has not been built or published yet;{build_hint(entry)}")
    pointer = Pointer(spec.sha256, spec.size)
    path, source, resumed_from = fetch_object(
        pointer,
        f"{name} {variant}",
        checkout_path=entry.variant_path(variant),
        remotes=remotes,
        build_hint=build_hint(entry),
        show_progress=show_progress,
        rate_limit=rate_limit,
    )
    if dest is not None:
        target = Path(dest) / Path(spec.file).name
        if not (target.exists() and target.stat().st_size == spec.size and sha256_file(target) == spec.sha256):
            atomic_copy(path, target)
        path = target
    return FetchResult(name, variant, path, spec.size, spec.sha256, source, resumed_from, dict(spec.metrics))


def build_hint(entry: Entry) -> str:
    how = [f"`zoo build {entry.name}`"]
    if entry.card.training.command and entry.card.training.command not in how[0]:
        how.append(f"`{entry.card.training.command}`")
    if entry.card.training.imported_from or entry.card.family == "bert":
        how.append(f"`zoo import {entry.name} --from <checkpoint dir>`")
    return " Build it instead with " + " or ".join(how)



def require_content(path: Path) -> Path:
    """`path` if it holds real content; for a pointer, an error naming the exact `zoo fetch` command."""
    path = Path(path).resolve()
    if read_pointer(path) is None:
        return path
    for entry in entries().values():
        for key in entry.card.variants:
            if entry.variant_path(key) == path:
                return ensure_content(path, f"`zoo fetch {entry.name} --variant {key}`")
    return ensure_content(path)
