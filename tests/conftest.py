from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import LfsServer
from zoo import catalog


def pytest_configure(config):
    """One prepared-data cache for the whole run (zoo.config.data_dir): tests isolate $ZOO_HOME, but the prepared
    datasets are derived, versioned files that every test and subprocess may share (the text data takes minutes)."""
    if "ZOO_DATA_DIR" not in os.environ:
        config._zoo_data_dir = tempfile.mkdtemp(prefix="zoo-test-data-")
        os.environ["ZOO_DATA_DIR"] = config._zoo_data_dir


def pytest_unconfigure(config):
    folder = getattr(config, "_zoo_data_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("ZOO_DATA_DIR", None)


# Where the suite's time goes, per test file: wall seconds and CPU seconds (this process and the children it waited
# for: CLI runs, torchrun, servers stopped by the test), printed at the end and written to build/test-times.json.
_FILE_TIMES: dict[str, dict[str, float]] = {}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, cpu = time.perf_counter(), _cpu_seconds()
    yield
    row = _FILE_TIMES.setdefault(item.location[0], {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
    row["tests"] += 1
    row["wall_s"] += time.perf_counter() - wall
    row["cpu_s"] += _cpu_seconds() - cpu


def pytest_terminal_summary(terminalreporter):
    if not _FILE_TIMES:
        return
    rows = sorted(_FILE_TIMES.items(), key=lambda item: -item[1]["wall_s"])
    terminalreporter.write_sep("=", "time per test file (wall and CPU seconds, 2 cores: CPU/wall up to 2)")
    terminalreporter.write_line(f"{'file':36} {'tests':>5} {'wall s':>8} {'CPU s':>8} {'CPU/wall':>8}")
    for file, row in rows:
        terminalreporter.write_line(f"{file:36} {row['tests']:5d} {row['wall_s']:8.1f} {row['cpu_s']:8.1f} "
                                    f"{row['cpu_s'] / max(row['wall_s'], 1e-9):8.2f}")
    total = {k: sum(r[k] for _, r in rows) for k in ("tests", "wall_s", "cpu_s")}
    terminalreporter.write_line(f"{'all':36} {int(total['tests']):5d} {total['wall_s']:8.1f} {total['cpu_s']:8.1f}")
    out = Path(__file__).resolve().parents[1] / "build" / "test-times.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"files": dict(rows), "total": total}, indent=2) + "\n")


@pytest.fixture
def zoo_env(tmp_path, monkeypatch):
    """An isolated zoo: its own cache ($ZOO_HOME), catalog ($ZOO_ENTRIES) and no remotes."""
    home, entries = tmp_path / "home", tmp_path / "entries"
    entries.mkdir()
    monkeypatch.setenv("ZOO_HOME", str(home))
    monkeypatch.setenv("ZOO_ENTRIES", str(entries))
    monkeypatch.setenv("ZOO_LFS_URL", "")
    monkeypatch.setenv("ZOO_STORE", "")  # nor the repository's store
    catalog.reload()
    yield {"home": home, "entries": entries, "tmp": tmp_path}
    catalog.reload()


@pytest.fixture
def lfs_server(tmp_path):
    server = LfsServer(tmp_path / "lfs-storage").start()
    yield server
    server.stop()
