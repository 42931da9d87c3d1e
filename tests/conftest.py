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

from tests.helpers import LfsServer, all_cpus, free_port, lease_seconds, shared_cpus
from zoo import catalog


# The parts of `make test`: ci/test.sh runs pytest once per part (--part NAME), each selecting its tests by marker
# (below) and writing its times to build/test-times-NAME.json.
PARTS = {"shared": "not ranks and not beside", "ranks": "ranks", "beside": "beside"}


def pytest_addoption(parser):
    parser.addoption("--part", choices=sorted(PARTS), help="one part of `make test` (ci/test.sh): its tests and its "
                                                           "file of times, build/test-times-PART.json")


def pytest_configure(config):
    """One prepared-data cache for the whole run (zoo.config.data_dir): tests isolate $ZOO_HOME, but the prepared
    datasets are derived, versioned files that every test and subprocess may share (the text data takes minutes).
    Set before pytest-xdist starts its workers, so they inherit it (and the CPU lease folder, tests/helpers.py)."""
    part = config.getoption("part")
    if part and config.option.markexpr:
        raise pytest.UsageError(f"--part {part} selects its tests itself (-m \"{PARTS[part]}\"): drop -m")
    if part:
        config.option.markexpr = PARTS[part]
    if "ZOO_DATA_DIR" not in os.environ:
        config._zoo_data_dir = tempfile.mkdtemp(prefix="zoo-test-data-")
        os.environ["ZOO_DATA_DIR"] = config._zoo_data_dir
    if "ZOO_TEST_LEASES" not in os.environ:
        config._zoo_leases = tempfile.mkdtemp(prefix="zoo-test-leases-")
        os.environ["ZOO_TEST_LEASES"] = config._zoo_leases
    if "ZOO_TEST_SHARED" not in os.environ:  # what tests/helpers.py made_once makes once per run
        config._zoo_shared = tempfile.mkdtemp(prefix="zoo-test-shared-")
        os.environ["ZOO_TEST_SHARED"] = config._zoo_shared


def pytest_unconfigure(config):
    for attr, var in (("_zoo_data_dir", "ZOO_DATA_DIR"), ("_zoo_leases", "ZOO_TEST_LEASES"),
                      ("_zoo_shared", "ZOO_TEST_SHARED")):
        folder = getattr(config, attr, None)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
            os.environ.pop(var, None)


# The files that take longest first (CPU seconds per part at 47f702e, AMD EPYC AVX2): pytest-xdist hands whole files
# to the workers in this order (`make test` passes --no-loadscope-reorder), so the long ones overlap and the short
# ones fill the end of each part instead of one long file running alone at the end. test_parallel leads the ranks
# part; the single-process part starts with the files that hold most of its work (test_federated: its Flower
# deployments wait minutes on round timeouts, while the other workers go on).
LONGEST_FIRST = ["test_parallel", "test_federated", "test_validate", "test_ondevice", "test_families", "test_hostile",
                 "test_rebuild", "test_mlflow", "test_training", "test_reproducible", "test_catalog", "test_units",
                 "test_store", "test_docs", "test_repo_store", "test_data", "test_entries"]


# `make test` (ci/test.sh) runs pytest three times (PARTS): `--part shared` (the single-process majority, three workers
# side by side: many wait part of the time on a server, a browser or a timeout), then `--part ranks` (the tests that
# hold both CPUs for several busy processes) and, beside both in the background (idle priority: a CPU the other parts
# leave; ci/test.sh runs validation below it), `--part beside`: single-process tests that only compute (builds,
# rebuilds, training runs; no server, no deadline a starved minute could miss), which fill the seconds the other parts
# leave a CPU idle. In one mixed run a test that wants both CPUs waits, one CPU idle, for the other worker's current
# test to end: 663 worker-seconds of a 2,149-second run on 2026-12-05 (AMD EPYC, AVX2). A test is
# `ranks` when it asks for the whole_machine fixture (directly or through a fixture) or carries @pytest.mark.ranks
# (it takes tests/helpers.py all_cpus() itself); a test that held both CPUs without it is named at the end of the run
# (it still runs correctly, only less packed).
@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if "whole_machine" in item.fixturenames and item.get_closest_marker("ranks") is None:
            item.add_marker(pytest.mark.ranks)
        if item.get_closest_marker("ranks") and item.get_closest_marker("beside"):
            raise pytest.UsageError(f"{item.nodeid}: a test that holds both CPUs (ranks) cannot run beside the others")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest keep their order


# Where the suite's time goes, per test file: wall seconds, CPU seconds (this process and the children it waited
# for: CLI runs, torchrun, servers stopped by the test), seconds waiting for a CPU lease and seconds holding both CPUs
# (tests/helpers.py), measured around each test's setup, call and teardown in the process that ran it (an xdist
# worker or pytest itself), carried to the controller on the teardown report, printed at the end and written to
# build/test-times.json. The exclusive seconds of all files run one after another: with the other files' wall
# seconds less their waits, shared by two workers, they bound the run from below.
_FILE_TIMES: dict[str, dict[str, float]] = {}
_TEST_TIMES: dict[str, dict[str, float]] = {}  # the same per test, in the JSON only
_STARTED: dict[str, tuple[float, ...]] = {}
_KEYS = ("wall_s", "cpu_s", "wait_s", "exclusive_s")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _STARTED[item.nodeid] = (time.perf_counter(), _cpu_seconds(), *lease_seconds())
    with shared_cpus():  # tests/helpers.py: all_cpus() trades it for both CPUs while ranks run
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and item.nodeid in _STARTED:
        now = (time.perf_counter(), _cpu_seconds(), *lease_seconds())
        report = outcome.get_result()
        report.user_properties.append(("zoo_times", tuple(b - a for a, b in zip(_STARTED.pop(item.nodeid), now))))
        report.user_properties.append(("zoo_ranks_marked", item.get_closest_marker("ranks") is not None))


_UNMARKED: list[str] = []  # tests that held both CPUs without the ranks marker


def pytest_runtest_logreport(report):
    properties = dict(report.user_properties)
    if report.when != "teardown" or "zoo_times" not in properties:
        return
    times = properties["zoo_times"]
    if not properties["zoo_ranks_marked"] and times[3] > 1.0:  # held both CPUs for over a second
        _UNMARKED.append(report.nodeid)
    row = _FILE_TIMES.setdefault(report.location[0], {"tests": 0, **dict.fromkeys(_KEYS, 0.0)})
    row["tests"] += 1
    own = dict(zip(_KEYS, times))
    for key, seconds in own.items():
        row[key] += seconds
    _TEST_TIMES[report.nodeid] = {key: round(seconds, 2) for key, seconds in own.items()}


def pytest_terminal_summary(terminalreporter, config):
    if not _FILE_TIMES:
        return
    rows = sorted(_FILE_TIMES.items(), key=lambda item: -item[1]["wall_s"])
    terminalreporter.write_sep("=", "time per test file (seconds summed over its tests; with two workers the files "
                                    "overlap; wait: for a CPU lease, both CPUs: held alone)")
    terminalreporter.write_line(f"{'file':34} {'tests':>5} {'wall':>7} {'CPU':>7} {'wait':>7} {'both CPUs':>9}")
    total = {k: sum(r[k] for _, r in rows) for k in ("tests", *_KEYS)}
    for file, row in [*rows, ("all", total)]:
        terminalreporter.write_line(f"{file:34} {int(row['tests']):5d} {row['wall_s']:7.1f} {row['cpu_s']:7.1f} "
                                    f"{row['wait_s']:7.1f} {row['exclusive_s']:9.1f}")
    if _UNMARKED:
        terminalreporter.write_line(f"held both CPUs without @pytest.mark.ranks (a module fixture's build, or a test "
                                    f"to mark so `make test` runs it with the ranks): {', '.join(sorted(_UNMARKED))}")
    # one file per part of `make test` (ci/test.sh), build/test-times.json for any other selection
    part = config.getoption("part")
    out = Path(__file__).resolve().parents[1] / "build" / (f"test-times-{part}.json" if part else "test-times.json")
    out.parent.mkdir(exist_ok=True)
    tests = dict(sorted(_TEST_TIMES.items(), key=lambda item: (-item[1]["exclusive_s"], -item[1]["wall_s"])))
    out.write_text(json.dumps({"files": dict(rows), "total": total, "unmarked_both_cpus": sorted(_UNMARKED),
                               "tests": tests}, indent=2) + "\n")


@pytest.fixture
def whole_machine():
    """Both CPUs for the whole test (several busy processes at once: torchrun ranks, horovodrun); tests/helpers.py."""
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
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            # MLflow 3's job runner (eight processes importing the server, ~150 CPU-s while the
                            # module's tests ran under load) serves GenAI scoring jobs the zoo never submits.
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
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
