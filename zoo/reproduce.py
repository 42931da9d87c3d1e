"""`zoo reproduce NAME`: rebuild an entry at the commit its card records, in a temporary git worktree, and compare
every file's sha256 with the card's (the maintainers' publishing check, runnable by anyone).

Bytes are promised only for the same CPU features and library versions as the card's build; the result says
whether those match, so a difference can be told apart from a broken promise. The rebuild is a check, not one of
the user's training runs: its $ZOO_HOME (tracking store, cache, imports) is temporary too, only the prepared
datasets are shared. A commit's own tracking code may keep its experiment's files in the folder it ran in (MLflow's
./mlruns, before zoo.train.tracking artifact_location): in the user's store that experiment would send every later
run's files into the deleted worktree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from zoo.cards import CARD_FILE, ModelCard, load_card
from zoo.catalog import Entry
from zoo.config import REPO_ROOT, data_dir
from zoo.errors import ZooError
from zoo.processes import run_stoppable
from zoo.provenance import commit_available, machine_differences
from zoo.pointer import pointer_for, read_pointer
from zoo.recipes import command_processes


@dataclass
class FileCheck:
    file: str
    card_sha256: str
    rebuilt_sha256: str | None  # None: the rebuild did not produce the file

    @property
    def same(self) -> bool:
        return self.card_sha256 == self.rebuilt_sha256


@dataclass
class Reproduction:
    entry: str
    commit: str
    files: list[FileCheck]
    rebuilt_card: ModelCard
    differences: list[str] = field(default_factory=list)  # how this machine differs from the build's (CPU, libraries)

    @property
    def identical(self) -> bool:
        return all(f.same for f in self.files)

    @property
    def comparable(self) -> bool:
        """Same CPU features and library versions as the card's build: bytes must then be identical."""
        return not self.differences


def card_files(entry: Entry) -> dict[str, str]:
    """Every LFS file the card's build wrote -> its sha256 (card for variants, pointer for the rest)."""
    files = {}
    for key, variant in entry.card.variants.items():
        if variant.built:
            files[variant.file] = variant.sha256
            for other in variant.extra_opsets.values():
                files[other] = _sha(entry.dir / other)
    for path in sorted(entry.dir.glob("test_data_set_*/*.pb")):
        files[str(path.relative_to(entry.dir))] = _sha(path)
    return {k: v for k, v in files.items() if v}


def _sha(path: Path) -> str | None:
    if not path.exists():
        return None
    return (read_pointer(path) or pointer_for(path)).oid


def require_card_commit(entry: Entry) -> str:
    """The clean commit the card's build recorded, present in this clone; else a ZooError saying what to do."""
    t = entry.card.training
    if not t.git_commit or t.reproducible is False:
        why = "was built from uncommitted changes (--allow-dirty)" if t.reproducible is False else "records no commit"
        raise ZooError(f"'{entry.name}' {why}: rebuild it from a clean commit with `zoo build {entry.name}`")
    if not commit_available(t.git_commit):
        raise ZooError(f"commit {t.git_commit} (the card's build) is not in this clone: `git fetch` it "
                       "(a shallow clone lacks history)")
    return t.git_commit


@contextlib.contextmanager
def card_worktree(commit: str, path: Path):
    """A detached git worktree of `commit` at `path`, removed afterwards; one left by a killed run is replaced."""
    _remove_worktree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), commit], cwd=REPO_ROOT, check=True,
                   capture_output=True)
    try:
        yield path
    finally:
        _remove_worktree(path)


def _remove_worktree(path: Path) -> None:
    if path.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=REPO_ROOT, capture_output=True)


def reproduce(entry: Entry, log=print, scratch: Path | None = None) -> Reproduction:
    """Rebuild `entry` at its recorded commit and compare the bytes; raises ZooError when it cannot even start."""
    t = entry.card.training
    require_card_commit(entry)
    expected = card_files(entry)
    with tempfile.TemporaryDirectory(prefix=f"zoo-reproduce-{entry.name}-", dir=scratch) as tmp, \
            card_worktree(t.git_commit, Path(tmp) / "src") as worktree:
        env = {**os.environ, "PYTHONPATH": str(worktree), "ZOO_HOME": str(Path(tmp) / "home"),
               "ZOO_DATA_DIR": str(data_dir())}
        in_catalog = entry.dir.resolve().is_relative_to((REPO_ROOT / "zoo" / "entries").resolve())
        if in_catalog:  # the card as it was at that commit, in the worktree's own catalog
            env.pop("ZOO_ENTRIES", None)
            built_dir = worktree / "zoo" / "entries" / entry.name
        else:  # an entry kept elsewhere (ZOO_ENTRIES): its card, built by that commit's code
            built_dir = Path(tmp) / "entries" / entry.name
            built_dir.mkdir(parents=True)
            shutil.copyfile(entry.dir / CARD_FILE, built_dir / CARD_FILE)
            env["ZOO_ENTRIES"] = str(built_dir.parent)
        command = [sys.executable, "-m", "zoo.cli", "build", entry.name, "--threads", str(t.threads or 1),
                   "--nproc", str(command_processes(t.command))]
        log(f"[{entry.name}] rebuilding commit {t.git_commit[:12]} in a temporary worktree")
        result = run_stoppable(command, f"rebuilding '{entry.name}'", cwd=worktree, env=env,
                               stdout=sys.stderr)  # stdout is the caller's (--json)
        if result.returncode != 0:
            raise ZooError(f"rebuilding '{entry.name}' at {t.git_commit[:12]} failed (its output is above)")
        rebuilt = load_card(built_dir / CARD_FILE)
        files = [FileCheck(f, sha, _sha(built_dir / f)) for f, sha in expected.items()]
    differences = machine_differences(t)
    return Reproduction(entry.name, t.git_commit, files, rebuilt, differences)
