"""The catalog: one folder per entry under `zoo/entries/`, each described by its card.yaml.

The manifest (entries/MANIFEST.json, like onnx/models' ONNX_HUB_MANIFEST.json) is generated from
the cards by `zoo manifest`, never hand-edited; `zoo manifest --check` and the tests catch drift.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from zoo.cards import CARD_FILE, ModelCard, Variant, check_inside, check_paths, load_card, read_yaml
from zoo.config import REPO_ROOT, entries_dir
from zoo.errors import CardError, UnknownModelError, ZooError
from zoo.fsutil import atomic_write_text
from zoo.pointer import ensure_content, pointer_for, read_pointer
from zoo.kinds import is_primary

MANIFEST_FILE = "MANIFEST.json"
# The README's catalog table (primaries' bytes per entry) sits between these markers; `zoo manifest` rewrites it.
README = REPO_ROOT / "README.md"
README_BEGIN, README_END = "<!-- catalog-sizes:begin (zoo manifest writes this table) -->", "<!-- catalog-sizes:end -->"
# The launchers guide's table of launchers and layouts (zoo.layouts.launchers_table) and its launcher x precision x QAT
# matrix (zoo.train.parallel.support_matrix); `zoo manifest` rewrites them too.
LAUNCHERS_GUIDE = REPO_ROOT / "docs" / "guides" / "launchers.md"
LAYOUTS_TABLE = ("<!-- layouts:begin (zoo manifest writes this table from zoo.layouts) -->", "<!-- layouts:end -->")
LAUNCHER_MATRIX = ("<!-- launcher-matrix:begin (zoo manifest writes this table from zoo.train.parallel.support_matrix) -->",
                   "<!-- launcher-matrix:end -->")


@dataclass(frozen=True)
class Entry:
    card: ModelCard
    dir: Path

    @property
    def name(self) -> str:
        return self.card.name

    def variant(self, key: str) -> Variant:
        if key not in self.card.variants:
            known = ", ".join(self.card.variants)
            raise ZooError(f"model '{self.name}' has no variant '{key}'; its variants are: {known}")
        return self.card.variants[key]

    def variant_path(self, key: str) -> Path:
        return check_inside(self.dir, self.variant(key).file, f"{self.dir / CARD_FILE}: variants.{key}.file")


@dataclass(frozen=True)
class Catalog:
    entries: dict[str, Entry]
    broken: dict[str, str]  # folder name -> why its entry cannot be used (one line)


@cache
def _load(root: Path) -> Catalog:
    """Every entry folder's card. A card that does not parse, or an entry folder or card that is a link leading out
    of the catalog folder, breaks only its own entry: the others list, fetch and validate."""
    good, broken = {}, {}
    if root.is_dir():
        for card_path in sorted(root.glob(f"*/{CARD_FILE}")):
            folder = card_path.parent
            try:
                if not card_path.resolve().is_relative_to(root) or folder.resolve().parent != root:
                    raise CardError(f"{folder}: the entry folder or its card is a link leading out of {root} (to "
                                    f"{card_path.resolve().parent}); an entry is a real folder of the catalog")
                card = load_card(card_path)
            except ZooError as exc:
                broken[folder.name] = str(exc).splitlines()[0]
                continue
            good[card.name] = Entry(card, folder)
    return Catalog(good, broken)


def entries(root: Path | None = None) -> dict[str, Entry]:
    """The usable entries (broken ones: `broken()`)."""
    return _load((root or entries_dir()).resolve()).entries


def broken(root: Path | None = None) -> dict[str, str]:
    """Entry folders whose card cannot be used, each with its one-line error."""
    return _load((root or entries_dir()).resolve()).broken


def reload() -> None:
    """Forget loaded cards (after a build or publish rewrote them)."""
    _load.cache_clear()


def list_models(task: str | None = None) -> list[str]:
    """The catalog's names, or those of one task (an unknown task is an error naming the known ones)."""
    catalog = entries()
    tasks = sorted({e.card.task for e in catalog.values()})
    if task is not None and task not in tasks:
        raise UnknownModelError(f"no model in the catalog has task '{task}'; its tasks are: {', '.join(tasks)}")
    return [name for name, e in catalog.items() if task is None or e.card.task == task]


def get_entry(name: str) -> Entry:
    """The catalog entry `name` (its folder and parsed card); an unknown name is an error suggesting close ones."""
    catalog = entries()
    if name in catalog:
        return catalog[name]
    if name in (bad := broken()):
        raise CardError(bad[name])
    close = difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.6)
    hint = f"; did you mean: {', '.join(close)}?" if close else "; `zoo list` shows the catalog"
    raise UnknownModelError(f"unknown model '{name}'{hint}")


def raw_card(name: str) -> tuple[Path, dict]:
    """The card of entry `name` as written (`zoo build` and `zoo export` fill in its measured fields), its file paths
    checked to stay inside the entry folder before anything is trained or written."""
    path = entries_dir() / name / CARD_FILE
    if not path.exists():
        get_entry(name)  # raises with did-you-mean suggestions
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise CardError(f"{path}: the top level must be a mapping of card fields")
    check_paths(raw, path.parent, str(path))
    return path, raw


def get_card(name: str) -> ModelCard:
    """The parsed, schema-checked model card of `name` (zoo.cards.ModelCard): data, preprocessing, variants with
    their sha256, metrics and measured speed."""
    return get_entry(name).card


def build_manifest(root: Path | None = None) -> list[dict]:
    root = (root or entries_dir()).resolve()
    manifest = []
    for name, entry in entries(root).items():
        card = entry.card
        manifest.append({
            "name": name,
            "family": card.family,
            "task": card.task,
            "num_params": card.num_params,
            "license": card.license,
            "dataset": card.dataset.name,
            "variants": [
                {
                    "variant": key,
                    "path": f"{name}/{v.file}",
                    "precision": v.precision,
                    "quantization": v.quantization,
                    "format": v.format,
                    "opset": v.opset,
                    "sha256": v.sha256,
                    "size": v.size,
                    card.primary_metric: v.metrics.get(card.primary_metric),
                }
                for key, v in card.variants.items()
            ],
        })
    return manifest


def manifest_text(root: Path | None = None) -> str:
    return json.dumps(build_manifest(root), indent=2, sort_keys=False) + "\n"


def manifest_path(root: Path | None = None) -> Path:
    return (root or entries_dir()) / MANIFEST_FILE


def generated_paths() -> list[Path]:
    """The checkout's files generated from the cards (a build and a publish may leave them changed): the manifest
    and the README with its catalog table."""
    return [manifest_path(), README]


def require_every_card(root: Path | None = None, being_built: tuple[str, ...] = ()) -> None:
    """The manifest needs every card (a manifest silently missing an entry would publish a smaller catalog): refuse
    while one is broken, apart from entries a build is about to (re)write."""
    if bad := {k: v for k, v in broken(root).items() if k not in being_built}:
        name, error = next(iter(bad.items()))
        raise CardError(f"the manifest needs every card; {len(bad)} broken, e.g. {name}: {error}")


def write_manifest(root: Path | None = None) -> Path:
    """Regenerate MANIFEST.json from the cards (after a build, describe or `zoo manifest`), and for the project's
    own catalog the README's size table."""
    reload()
    require_every_card(root)
    path = manifest_path(root)
    atomic_write_text(path, manifest_text(root))
    if path.parent.resolve() == (REPO_ROOT / "zoo" / "entries").resolve() and README.exists():
        atomic_write_text(README, readme_text(README.read_text(), root))
    return path


def store_objects(entry: Entry, derived: bool = False) -> list[tuple[str, Path]]:
    """(label, checkout path) of the LFS objects a store holds for an entry: its primaries and test data, and with
    `derived` the files `zoo fetch` can make from fp32 (int8-ptq, fp16, ort-training, other opsets)."""
    objects = []
    for key, variant in entry.card.variants.items():
        if variant.built and (derived or is_primary(key, variant)):
            objects.append((key, entry.variant_path(key)))
            if derived:
                objects += [(f"{key} opset {o}", check_inside(entry.dir, f, f"{entry.dir}/card.yaml"))
                            for o, f in variant.extra_opsets.items()]
    if any(v.built for v in entry.card.variants.values()):
        objects += [(f"test data {p.parent.name}/{p.name}", p) for p in sorted(entry.dir.glob("test_data_set_*/*.pb"))]
    return objects


def primary_bytes(entry: Entry) -> int:
    """Bytes of what the store must hold for an entry (primaries + test data), from the cards and pointers."""
    total = 0
    for key, path in store_objects(entry):
        if key in entry.card.variants:
            total += entry.card.variants[key].size or 0
        elif path.exists():
            total += (read_pointer(path) or pointer_for(path)).size
    return total


def readme_table(root: Path | None = None) -> str:
    rows = ["| entry | primaries (published) | bytes | derived on fetch |", "| --- | --- | ---: | --- |"]
    total = 0
    for name, entry in entries(root).items():
        built = {k: v for k, v in entry.card.variants.items() if v.built}
        if not built:
            rows.append(f"| {name} | not built | - | - |")
            continue
        size = primary_bytes(entry)
        total += size
        primaries = [k for k, v in built.items() if is_primary(k, v)] + ["test data"]
        derived = [k for k, v in built.items() if not is_primary(k, v)]
        derived += [f"opset {o}" for v in built.values() for o in v.extra_opsets]
        rows.append(f"| {name} | {', '.join(primaries)} | {size:,} | {', '.join(derived) or '-'} |")
    rows.append(f"| **catalog** | | **{total:,}** ({total / 2**20:.1f} MiB) | |")
    return "\n".join(rows)


def readme_text(text: str, root: Path | None = None) -> str:
    return replace_block(text, README_BEGIN, README_END, readme_table(root))


def replace_block(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between the markers `begin` and `end` replaced by `body` (unchanged without them)."""
    if begin not in text or end not in text:
        return text
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


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
