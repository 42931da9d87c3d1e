from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests.helpers import LfsServer, all_cpus, free_port, shared_cpus
from zoo import catalog


def pytest_configure(config):
    """One prepared-data cache for the whole run (zoo.config.data_dir): tests isolate $ZOO_HOME, but the prepared
    datasets are derived, versioned files that every test and subprocess may share (the text data takes minutes).
    Set before pytest-xdist starts its workers, so they inherit it (and the CPU lease folder, tests/helpers.py)."""
    if "ZOO_DATA_DIR" not in os.environ:
        config._zoo_data_dir = tempfile.mkdtemp(prefix="zoo-test-data-")
        os.environ["ZOO_DATA_DIR"] = config._zoo_data_dir
    if "ZOO_TEST_LEASES" not in os.environ:
        config._zoo_leases = tempfile.mkdtemp(prefix="zoo-test-leases-")
        os.environ["ZOO_TEST_LEASES"] = config._zoo_leases


def pytest_unconfigure(config):
    for attr, var in (("_zoo_data_dir", "ZOO_DATA_DIR"), ("_zoo_leases", "ZOO_TEST_LEASES")):
        folder = getattr(config, attr, None)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
            os.environ.pop(var, None)


# Where the suite's time goes, per test file: wall seconds and CPU seconds (this process and the children it waited
# for: CLI runs, torchrun, servers stopped by the test), measured around each test's setup, call and teardown in the
# process that ran it (an xdist worker or pytest itself), carried to the controller on the teardown report, printed
# at the end and written to build/test-times.json.
_FILE_TIMES: dict[str, dict[str, float]] = {}
_STARTED: dict[str, tuple[float, float]] = {}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with shared_cpus():  # tests/helpers.py: all_cpus() trades it for both CPUs while ranks run
        _STARTED[item.nodeid] = (time.perf_counter(), _cpu_seconds())
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and item.nodeid in _STARTED:
        wall, cpu = _STARTED.pop(item.nodeid)
        outcome.get_result().user_properties.append(
            ("zoo_times", (time.perf_counter() - wall, _cpu_seconds() - cpu)))


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "zoo_times" and report.when == "teardown":
            row = _FILE_TIMES.setdefault(report.location[0], {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
            row["tests"] += 1
            row["wall_s"] += value[0]
            row["cpu_s"] += value[1]


def pytest_terminal_summary(terminalreporter):
    if not _FILE_TIMES:
        return
    rows = sorted(_FILE_TIMES.items(), key=lambda item: -item[1]["wall_s"])
    terminalreporter.write_sep("=", "time per test file (wall and CPU seconds summed over its tests; with two "
                                    "workers the files overlap)")
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
def whole_machine():
    """Both CPUs for the whole test (several busy processes: torchrun ranks, a Flower deployment); tests/helpers.py."""
    with all_cpus():
        yield


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


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 (sqlite backend, local artifacts), one per test module; stopped by PID."""
    tmp_path = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    proc = subprocess.Popen([mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                             "--default-artifact-root", str(tmp_path / "artifacts")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                break
        except requests.RequestException:  # not listening yet, or listening but still starting (slow answer)
            pass
        time.sleep(1)
    else:
        os.killpg(proc.pid, 9)
        raise RuntimeError("mlflow server did not answer /health in 240 s")
    yield url
    os.killpg(proc.pid, 9)
    proc.wait()
