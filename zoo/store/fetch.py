"""`zoo fetch`: get a variant's bytes, verified, from the first place that has them.

Order: the real file in the checkout, the local cache, the repository's store (`store/`, read in place), then each
configured store (mirrors). A corrupt copy in a store is reported on stderr, naming the store, and the next one tried.
A download is taken under a per-object file lock, so concurrent fetches of one object download it once. A derived
variant (int8-ptq, fp16, ort-training, another opset) that no store has is made from the fetched fp32
file and checked against the card's sha256 before it is cached, like a download. A file only the training run makes
(fp32, int8-qat) that no store has can be built from the entry's recipe at the card's commit, when allowed
(zoo.store.build_on_miss: --build/--no-build, ZOO_BUILD_ON_MISS).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from zoo.catalog import Entry, entries, get_entry
from zoo.config import lfs_remote_urls, repo_store
from zoo.errors import IntegrityError, ObjectNotFoundError, RemoteError, StoreUnreachableError, ZooError
from zoo.fsutil import atomic_copy, contained
from zoo.provenance import last_commit, machine_differences
from zoo.recipes import import_command
from zoo.store.cache import ObjectCache
from zoo.pointer import Pointer, pointer_for, read_pointer, sha256_file
from zoo.store.build_on_miss import build_estimate, build_on_miss, build_took, buildable, local_build, plan
from zoo.store.remotes import FileRemote, NotOnRemote, open_remote
from zoo.kinds import kind_of, made_from_fp32


@dataclass
class FetchResult:
    name: str
    variant: str
    path: Path
    size: int
    sha256: str
    source: str  # "checkout", "cache", the remote's URL, or "derived from fp32 …"
    resumed_from: int = 0  # bytes an interrupted earlier download had already fetched
    metrics: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # stores passed over before `source`, each with why

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


class Found(NamedTuple):
    path: Path
    source: str
    resumed_from: int = 0
    skipped: tuple[str, ...] = ()  # stores passed over (corrupt copy, unreachable, timed out), each with why


def fetch_object(
    pointer: Pointer,
    label: str,
    checkout_path: Path | None = None,
    remotes: list[str] | None = None,
    build_hint: Callable[[], str] = str,
    show_progress: bool = True,
    rate_limit: float | None = None,
    cached: bool = True,
) -> Found:
    """The verified object: the checkout's real file, the cache, else the first store with a good copy; every store
    skipped on the way is warned about on stderr and listed in `skipped`. Raises IntegrityError when stores hold only
    corrupt copies (naming them), StoreUnreachableError when no store could be reached at all, else
    ObjectNotFoundError, each listing every store tried (and `build_hint()`: what else the user can do).
    `cached=False`: only the checkout and the stores count, not what this machine cached before (validation makes a
    derived file no store has again, whatever an earlier fetch left in the cache); a download is still cached."""
    if (checkout_path is not None and checkout_path.is_file() and read_pointer(checkout_path) is None
            and checkout_path.stat().st_size == pointer.size and sha256_file(checkout_path) == pointer.oid):
        return Found(checkout_path, "checkout")
    cache = ObjectCache()
    if cached and (hit := cache.get(pointer)) is not None:
        return Found(hit, "cache")
    corrupt, unreachable, tried = [], [], []  # tried: every store's outcome, in order
    if remotes is None and (store := repo_store()) is not None:
        # The repository's own store: read in place and verified, never copied or modified.
        try:
            return Found(FileRemote(store).read_in_place(pointer), f"repository store ({store})")
        except NotOnRemote:
            tried.append(f"{store} (the repository's store): not there")
        except IntegrityError as exc:
            corrupt.append(f"{store} (the repository's store): corrupt copy ({exc})")
            tried.append(corrupt[-1])
            _warn(f"warning: {label}: {corrupt[-1]}; trying the next store")

    urls = lfs_remote_urls() if remotes is None else remotes
    with cache.lock(pointer.oid):
        # Another process may have downloaded it while this one waited for the lock.
        if cached and (hit := cache.get(pointer)) is not None:
            return Found(hit, "cache", 0, tuple(corrupt + unreachable))
        part = cache.partial_path(pointer.oid)
        for url in urls:
            try:
                remote = open_remote(url, rate_limit=rate_limit)
                with _progress_bar(label, pointer.size, show_progress) as advance:
                    resumed_from = remote.download(pointer, part, advance)
            except NotOnRemote:
                tried.append(f"{url}: not there")
                continue
            except IntegrityError as exc:  # that store's copy is bad: say so (its owner must learn), try the next one
                part.unlink(missing_ok=True)
                corrupt.append(f"{url}: corrupt copy ({exc})")
                tried.append(corrupt[-1])
                _warn(f"warning: {label}: {corrupt[-1]}; trying the next store")
                continue
            except RemoteError as exc:
                # Keep the .part for a later resume; try the next remote.
                unreachable.append(str(exc) if str(exc).startswith(url) else f"{url}: {exc}")
                tried.append(unreachable[-1])
                if url != urls[-1]:
                    _warn(f"warning: {label}: {unreachable[-1]}; trying the next store")
                continue
            return Found(cache.admit(part, pointer, move=True, verified=True), url, resumed_from,
                         tuple(corrupt + unreachable))
    if corrupt:
        raise IntegrityError(f"{label} (sha256 {pointer.oid}): " + "; ".join(tried)
                             + "; nothing was cached. Republish it (`zoo publish`) or fetch from another mirror.")
    stores = tried or ["no LFS store configured"]
    if unreachable and len(unreachable) == len(tried):  # no store answered at all: maybe one of them has it
        raise StoreUnreachableError(
            f"{label} (sha256 {pointer.oid}): no store could be reached, so none could say whether it has it:\n"
            + "\n".join(f"  {t}" for t in stores)
            + "\nRetry when the store is back, or add a mirror: ZOO_LFS_URL=<LFS URL or bare repo>." + build_hint())
    raise ObjectNotFoundError(f"{label} (sha256 {pointer.oid}) is in no store. Tried:\n"
                              + "\n".join(f"  {t}" for t in stores)
                              + "\nAdd a mirror: ZOO_LFS_URL=<LFS URL or bare repo> (space separated for several)."
                              + build_hint())


def _warn(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(message, markup=False, highlight=False)


def fetch(
    name: str,
    variant: str = "fp32",
    dest: Path | None = None,
    remotes: list[str] | None = None,
    show_progress: bool = True,
    rate_limit: float | None = None,
    opset: int | None = None,
    build: bool | None = None,
) -> FetchResult:
    """Fetch one variant of a zoo model; returns where its verified bytes are. `opset`: the fp32 weights at
    another opset (re-exported through the family's torch model when no store has that file). `build`: whether a
    file no store has may be built from the entry's recipe (None: ZOO_BUILD_ON_MISS, default ask)."""
    entry = get_entry(name)
    if opset is not None:
        if variant != "fp32":
            raise ZooError(f"--opset re-exports the fp32 weights; it cannot be combined with --variant {variant}")
        return _deliver(_fetch_opset(entry, opset, remotes, show_progress, rate_limit, build), dest)
    spec = entry.variant(variant)
    if not spec.built:
        raise ObjectNotFoundError(f"model '{name}' variant '{variant}' has not been built or published yet; "
                                  f"{unbuilt_routes(entry)}")
    pointer = Pointer(spec.sha256, spec.size)
    path, source, resumed_from, skipped = _fetch_or_derive(entry, variant, None, pointer, f"{name} {variant}",
                                                           entry.variant_path(variant), remotes, show_progress,
                                                           rate_limit, build)
    result = FetchResult(name, variant, path, spec.size, spec.sha256, source, resumed_from, dict(spec.metrics),
                         list(skipped))
    if source.startswith("rebuilt locally") and (kept := local_build(spec.sha256)) is not None and kept[0] == path:
        record = kept[1]  # other bytes than the card's (zoo.store.build_on_miss): say which, and what they measured
        result.sha256, result.size = record.sha256, record.size
        result.metrics[entry.card.primary_metric] = record.accuracy
    return _deliver(result, dest, Path(spec.file).name)


def _fetch_or_derive(entry: Entry, key: str, opset: int | None, pointer: Pointer, label: str, checkout: Path,
                     remotes, show_progress: bool, rate_limit, build: bool | None = None) -> Found:
    """Download the object; when no store has it and it is made from fp32 (a derived variant, or an opset the card
    lists), make it from the fetched fp32 file and admit it only if it has the card's bytes; when only the training
    run makes it, build it from the recipe if allowed (zoo.store.build_on_miss)."""
    variant = entry.variant(key)
    try:
        return fetch_object(pointer, label, checkout_path=checkout, remotes=remotes,
                            build_hint=lambda: publish_hint(entry, remotes) + build_hint(entry),
                            show_progress=show_progress, rate_limit=rate_limit)
    except ObjectNotFoundError as missing:
        if opset is None and not made_from_fp32(key, variant):
            if kind_of(key, variant).made != "training":
                raise
            path, source = build_on_miss(entry, key, pointer, label, missing, build,
                                         lambda m: Console(stderr=True, soft_wrap=True).print(m, markup=False, highlight=False))
            return Found(path, source)
    fp32_result = fetch(entry.name, "fp32", remotes=remotes, show_progress=show_progress, rate_limit=rate_limit,
                        build=build)
    if fp32_result.sha256 != entry.variant("fp32").sha256:
        raise IntegrityError(f"{label} is made from the fp32 file, and the fp32 file here is a local rebuild with "
                             f"other bytes than the card's ({fp32_result.source}): fetch it from a store that has it")
    fp32 = fp32_result.path
    from zoo.variants.make import derive  # lazy: torch + onnxruntime (~5 s), only when a file must be made here
    from zoo.variants.opsets import Origin  # lazy: as above; a fetch from the cache or a store stays ~0.5 s

    cache = ObjectCache()
    with cache.lock(pointer.oid):
        if (hit := cache.get(pointer)) is not None:
            return Found(hit, "cache")
        with cache.scratch() as tmp:
            made = derive(key, variant, fp32, Path(tmp) / "derived", Origin.of(entry.card), opset)
            got = pointer_for(made)
            if got != pointer:
                t = entry.card.training
                differences = machine_differences(t, cpu_matters=opset is None and kind_of(key, variant).cpu_dependent)
                raise IntegrityError(
                    f"{label} made here from the fp32 file has sha256 {got.oid}, the card promises {pointer.oid} ("
                    + ("; ".join(differences) if differences else "same CPU flags and libraries as the build")
                    + "); nothing was cached")
            return Found(cache.admit(made, pointer, move=True, verified=True), "derived from fp32", 0,
                         tuple(fp32_result.skipped))


def _deliver(result: FetchResult, dest: Path | None, filename: str | None = None) -> FetchResult:
    if dest is None:
        return result
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ZooError(f"--dest {dest} is a file: give the folder to copy the model into")
    target = contained(dest, filename or result.path.name, "--dest")
    if target.is_dir():
        raise ZooError(f"--dest {dest}: {target.name} there is a folder; remove it or choose another folder")
    try:
        if not (target.exists() and target.stat().st_size == result.size and sha256_file(target) == result.sha256):
            atomic_copy(result.path, target)
    except OSError as exc:
        raise ZooError(f"cannot write {target}: {exc.strerror or exc} (choose a writable --dest)") from None
    result.path = target
    return result


def _fetch_opset(entry: Entry, opset: int, remotes, show_progress: bool, rate_limit,
                 build: bool | None = None) -> FetchResult:
    """The fp32 weights at `opset`: the card's file when it lists that opset (sha256-checked, from a store or made
    here), else re-exported here and checked to predict fp32's labels on the entry's test set before it is served."""
    spec = entry.variant("fp32")
    if opset == spec.opset:
        return fetch(entry.name, "fp32", remotes=remotes, show_progress=show_progress, rate_limit=rate_limit,
                     build=build)
    low, high = spec.opset_range or (spec.opset, spec.opset)
    if opset not in spec.extra_opsets and not low <= opset <= high:
        raise ZooError(f"'{entry.name}' exports at opsets {low}-{high} (measured by `zoo build`); {opset} is outside it")
    label = f"{entry.name} fp32 opset {opset}"
    if opset in spec.extra_opsets:  # published: its pointer in the checkout names the bytes
        checkout = entry.dir / spec.extra_opsets[opset]
        pointer = read_pointer(checkout) or pointer_for(checkout)
        found = _fetch_or_derive(entry, "fp32", opset, pointer, label, checkout, remotes, show_progress, rate_limit,
                                 build)
        return FetchResult(entry.name, f"fp32-opset{opset}", found.path, pointer.size, pointer.oid, found.source,
                           found.resumed_from, dict(spec.metrics), list(found.skipped))
    fp32 = fetch(entry.name, "fp32", remotes=remotes, show_progress=show_progress, build=build).path
    from zoo.variants.opsets import Origin, reexport_checked  # lazy: torch + onnxruntime, only to make the file

    cache = ObjectCache()
    with cache.scratch() as tmp:
        made, agreement, examples = reexport_checked(fp32, opset, Path(tmp) / "derived", Origin.of(entry.card), label)
        pointer = pointer_for(made)
        path = cache.admit(made, pointer, move=True, verified=True)
    return FetchResult(entry.name, f"fp32-opset{opset}", path, pointer.size, pointer.oid,
                       f"derived from fp32 (same predictions on {agreement:.2%} of {examples} test examples)", 0,
                       dict(spec.metrics))


def publish_hint(entry: Entry, remotes: list[str] | None = None) -> str:
    """For an object the repository's store lacks: the commit that last changed the card, which should have
    committed the object with it (publishing is one commit: card, pointers, objects)."""
    if remotes is not None or repo_store() is None:
        return ""
    commit = last_commit(entry.dir / "card.yaml")
    return (f"\nThe repository's store should hold it: commit {commit[:12]} (the card's last change) should have "
            f"published it with `zoo publish {entry.name}`." if commit else "")


def unbuilt_routes(entry: Entry) -> str:
    """The ways to get an entry nobody has built: its recipe (with what that costs) and, for architectures that
    take one, an upstream checkpoint."""
    from zoo.models import model_spec  # lazy: torch; only this message about an unbuilt entry needs the registry

    try:  # what it costs, when the recipe and the family's built entries say
        estimate = build_estimate(entry.card, entries())
    except ZooError:
        estimate = ""
    routes = [f"build it from its recipe with `zoo build {entry.name}`" + (f" ({estimate})" if estimate else "")]
    try:
        imports = model_spec(entry.card.architecture).imports
    except ZooError:  # an architecture this checkout does not define: `zoo build` will say so
        imports = None
    if imports:
        routes.append(f"import {imports} with `{import_command(entry.name)}`")
    return "; or ".join(routes) + "."


def build_hint(entry: Entry) -> str:
    t = entry.card.training
    if buildable(entry.card):
        return f"\nOr build it from its recipe: `zoo fetch {entry.name} --build` ({plan(entry)})."
    how = import_command(entry.name) if t.imported_from and not t.import_source \
        else f"zoo build {entry.name}"
    took = f" ({build_took(t)})" if t.build_time_s else ""
    return f"\nOr build it from its recipe: `{how}`{took}."
