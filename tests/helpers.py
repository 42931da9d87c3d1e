"""Shared test helpers: real ONNX files, temporary catalogs, the `zoo` CLI in a subprocess, a real LFS server."""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import requests
import yaml
from filelock import FileLock
from onnx import TensorProto, helper, numpy_helper

from zoo import catalog
from zoo.pointer import pointer_for
from zoo.processes import LOWEST_NICENESS, background_niceness

REPO = Path(__file__).resolve().parents[1]


EXCEPTION_LINE = re.compile(r"^\s*(\[rank\d+\]:\s*)?[\w.]*(Error|Exception|Interrupt)\b.*")


def failed_run(cmd: list[str], stdout: str, stderr: str) -> str:
    """A failed command's report for an assertion: the exception lines first (a rank's long exception message, or
    torchrun's Root Cause section, can push them out of the tail), then the tails of its output."""
    causes = list(dict.fromkeys(line.strip() for line in stderr.splitlines() if EXCEPTION_LINE.match(line)))
    return (f"{' '.join(map(str, cmd))} failed\nexceptions: {causes[:6]}\n--- stdout (tail)\n{stdout[-2000:]}\n"
            f"--- stderr (tail)\n{stderr[-5000:]}")


def fresh_python(script: str) -> subprocess.CompletedProcess:
    """`script` run in a fresh interpreter (what importing does to a process); its assertions must hold."""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def make_onnx(path: Path, n_in: int = 8, n_out: int = 3, seed: int = 0) -> Path:
    """A real (tiny) linear classifier as ONNX: logits = x @ W + b."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((n_in, n_out)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(n_out).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["logits"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_out])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def card_dict(name: str, variants: dict[str, dict]) -> dict:
    return {
        "name": name,
        "architecture": "linear",
        "family": "linear",
        "task": "classification",
        "description": "A test entry.",
        "license": "Apache-2.0",
        "dataset": {"name": "synthetic-test", "source": "tests/helpers.py", "license": "CC0-1.0",
                    "splits": {"test": 10}},
        "preprocessing": ["none"],
        "inputs": [{"name": "x", "shape": ["batch", 8], "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": ["batch", 3], "dtype": "float32", "labels": ["a", "b", "c"]}],
        "num_params": 27,
        "training": {"command": "python tests/helpers.py", "seed": 0},
        "variants": variants,
    }


def write_entry(entries: Path, name: str, n_in: int = 8, seed: int = 0, accuracy: float = 0.9) -> Path:
    """An entry folder with a real fp32 ONNX file and a card whose sha256/size describe it."""
    folder = entries / name
    model = make_onnx(folder / "model.onnx", n_in=n_in, seed=seed)
    pointer = pointer_for(model)
    variant = {"file": "model.onnx", "precision": "fp32", "opset": 17, "sha256": pointer.oid,
               "size": pointer.size, "metrics": {"accuracy": accuracy}}
    (folder / "card.yaml").write_text(yaml.safe_dump(card_dict(name, {"fp32": variant}), sort_keys=False))
    return folder


# CPU leases. `make test` runs pytest-xdist workers on two cores (three in its single-process part, two in the others);
# every test holds a shared lease on the CPUs (tests/conftest.py), and whatever starts several busy processes at once
# (torchrun ranks, `zoo build`, horovodrun) trades it for an exclusive one while it runs: those processes never share
# the cores with another test's, and the other workers go on with single-process tests the rest of the time. A local
# Flower deployment keeps the shared lease: its processes take turns and mostly wait (tests/test_federated.py).
# The turnstile keeps an exclusive request from being starved by a stream of shared ones. Without xdist nothing waits.
# Seconds this process spent waiting for a lease and holding both CPUs (tests/conftest.py reports them per file: the
# held seconds of all files run one after another, whatever the other worker has to do).
_LEASE: dict = {"file": None, "exclusive": 0, "waited_s": 0.0, "exclusive_s": 0.0}


def _lock(mode: int) -> None:
    folder = Path(os.environ["ZOO_TEST_LEASES"])
    start = time.perf_counter()
    with open(folder / "turnstile", "a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(_LEASE["file"], mode)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
    _LEASE["waited_s"] += time.perf_counter() - start


def lease_seconds() -> tuple[float, float]:
    """(waited, held exclusively) so far in this process."""
    return _LEASE["waited_s"], _LEASE["exclusive_s"]


@contextlib.contextmanager
def shared_cpus():
    """One test's lease (taken by tests/conftest.py around its setup, call and teardown)."""
    _LEASE["file"] = open(Path(os.environ["ZOO_TEST_LEASES"]) / "cpus", "a")
    try:
        _lock(fcntl.LOCK_SH)
        yield
    finally:
        _LEASE["file"].close()  # closing releases the lock
        _LEASE["file"] = None


@contextlib.contextmanager
def all_cpus():
    """Both CPUs for what runs inside (several busy processes); back to the shared lease afterwards."""
    if _LEASE["file"] is None or _LEASE["exclusive"]:  # outside a test (a helper run by hand) or already exclusive
        _LEASE["exclusive"] += 1
        try:
            yield
        finally:
            _LEASE["exclusive"] -= 1
        return
    fcntl.flock(_LEASE["file"], fcntl.LOCK_UN)
    _lock(fcntl.LOCK_EX)
    _LEASE["exclusive"] = 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _LEASE["exclusive"] = 0
        _LEASE["exclusive_s"] += time.perf_counter() - start
        fcntl.flock(_LEASE["file"], fcntl.LOCK_SH)  # converted in place: through the turnstile it could deadlock


def background() -> bool:
    """Whether this process runs at a background priority: idle (SCHED_IDLE, as `make test` runs its beside part and
    validation) or the lowest niceness, 19: the kernel gives it a CPU only when the tests at normal priority leave
    one, and it may wait minutes at a time."""
    return background_niceness() >= LOWEST_NICENESS  # zoo.processes: idle priority counts as the lowest niceness


def wall_limit(seconds: float) -> float | None:
    """A child process's wall-clock limit, which catches a hang: `seconds`, or none at a background priority
    (`background`): there a child may wait minutes at a time for a CPU with its work done, so pytest's own limit per
    test (ci/test.sh: --timeout) catches hangs instead; subprocess.run kills its child when that limit ends the test."""
    return None if background() else seconds


def side_by_side(*jobs: tuple[list[str], dict, Path], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Independent commands of one test (command, environment, working folder), started together and awaited: most
    of a training job or a build is one busy process at a time (torchrun and the ranks starting, rank 0 exporting
    while the others wait), so two take little more wall time than one, and their results never depend on it. The
    output goes to files (a pipe nobody reads while another command is awaited would stall its writer); a command
    still running when the limit ends or the test fails is stopped (SIGTERM: torchrun and `zoo build` stop their
    ranks), then killed."""
    limit = wall_limit(timeout)
    deadline = None if limit is None else time.monotonic() + limit
    with tempfile.TemporaryDirectory(prefix="zoo-side-by-side-") as tmp:
        started = []
        try:
            for i, (command, env, cwd) in enumerate(jobs):
                with open(f"{tmp}/{i}.out", "w") as out, open(f"{tmp}/{i}.err", "w") as err:
                    started.append(subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=err, text=True))
            for process in started:
                process.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            for process in started:
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
        return [subprocess.CompletedProcess(p.args, p.returncode, Path(f"{tmp}/{i}.out").read_text(),
                                            Path(f"{tmp}/{i}.err").read_text()) for i, p in enumerate(started)]


# `zoo` commands that start torchrun ranks (two busy processes).
RANK_COMMANDS = {"build", "import", "train"}


def zoo_cli(*args: str, env: dict | None = None, check: bool = False, timeout: float = 300,
            ranks: bool | None = None) -> subprocess.CompletedProcess:
    """`zoo ARGS` in a fresh process. `ranks`: whether it starts training ranks (both CPUs while it runs); by default
    the commands that may (RANK_COMMANDS, --build). A command the test expects refused before any rank starts passes
    ranks=False, so it does not wait for both CPUs to say one line."""
    if ranks is None:
        ranks = bool(args) and args[0] in RANK_COMMANDS or "--build" in args
    lease = all_cpus() if ranks else contextlib.nullcontext()
    with lease:
        result = subprocess.run([sys.executable, "-m", "zoo.cli", *args], capture_output=True, text=True,
                                env={**os.environ, **(env or {})}, timeout=wall_limit(timeout), cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"zoo {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def stopped_by_sigterm(process: subprocess.Popen, ready, what: str, wait_s: float = 180) -> str:
    """Send SIGTERM to `process` once `ready()` holds (`what` names that moment for the failure message) and return
    its stderr; a process still running after that is killed."""
    try:
        deadline = time.monotonic() + wait_s
        while not ready() and process.poll() is None:
            assert time.monotonic() < deadline, f"{what}: not within {wait_s:.0f} s"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        return process.communicate(timeout=120)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LfsServer:
    """`zoo serve` (giftless) in its own process on 127.0.0.1, started and stopped by PID."""

    def __init__(self, storage: Path, ranges: bool = True, anonymous_writes: bool = True, secret: str | None = None,
                 extra_args: tuple[str, ...] = ()):
        """Anonymous read-write by default (the store tests publish to it); with `secret` (and anonymous_writes=False)
        the production setup: anonymous read, uploads with a token."""
        self.storage = storage
        self.port = free_port()
        self.ranges = ranges
        self.anonymous_writes, self.secret, self.extra_args = anonymous_writes, secret, extra_args
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/zoo/models.git/info/lfs"

    def start(self) -> "LfsServer":
        args = [sys.executable, "-m", "zoo.cli", "serve", "--storage", str(self.storage), "--port", str(self.port)]
        if not self.ranges:
            args.append("--no-ranges")
        if self.anonymous_writes:
            args.append("--anonymous-writes")
        args += ["--access-log", "", *self.extra_args] if "--access-log" not in self.extra_args else list(self.extra_args)
        env = {**os.environ, "ZOO_SERVE_SECRET": self.secret or ""}
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"LFS server exited: {self.proc.stderr.read().decode()}")
            try:
                requests.post(f"{self.url}/objects/batch", json={"operation": "download", "objects": []},
                              headers={"Accept": "application/vnd.git-lfs+json"}, timeout=2)
                return self
            except requests.ConnectionError:
                time.sleep(0.2)
        raise RuntimeError("LFS server did not answer within 60 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def object_path(self, oid: str) -> Path:
        matches = list(self.storage.rglob(oid))
        assert matches, f"object {oid} not in server storage"
        return matches[0]


# A derived kind a card may declare (made from the fp32 file by `zoo build`): onnxruntime-training artifacts.
ARTIFACTS = {"ort-training": {"file": "model.ort-training.zip", "precision": "fp32", "format": "ort-training", "opset": 17}}


def quick_recipe(root: Path, steps: int = 250, qat_steps: int = 50, tracking: bool = False) -> Path:
    """A short copy of the qat-int8 recipe (digits-cnn) at root/quick.yaml (MLflow tracking off unless asked)."""
    data = yaml.safe_load((REPO / "recipes" / "qat-int8.yaml").read_text())
    data.update(name="quick", steps=steps, tracking={"enabled": tracking})
    data.pop("epochs")
    data["quantization"]["qat_steps"] = qat_steps
    # int8-dynamic comes from `zoo export` in the tests of a kind added to a built card (test_validate).
    data["export"]["variants"] = [v for v in data["export"]["variants"] if v != "int8-dynamic"]
    recipe = root / "quick.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(yaml.safe_dump(data))
    return recipe


def quick_digits_entry(root: Path, name: str = "quick-digits", steps: int = 250, card: dict | None = None,
                       tracking: bool = False) -> dict:
    """A real digits-cnn entry built by `zoo build` with a short qat-int8 recipe; returns the CLI environment.
    `card`: more hand-written card fields (e.g. derived variants to declare); `tracking`: the build logs to MLflow
    (sqlite under the environment's $ZOO_HOME) and registers its variants."""
    recipe = quick_recipe(root, steps, tracking=tracking)
    entries = root / "entries"
    (entries / name).mkdir(parents=True)
    hand_written = {"name": name, "architecture": "digits-cnn", "family": "cnn", "task": "image-classification",
                    "description": "test build", "license": "Apache-2.0", "training": {"recipe": str(recipe)},
                    **(card or {})}
    (entries / name / "card.yaml").write_text(yaml.safe_dump(hand_written))
    env = catalog_env(root)
    zoo_cli("build", name, *build_flags(), env=env, check=True, timeout=600)
    return env


def catalog_env(root: Path) -> dict:
    """The CLI environment of a test catalog at root/entries with its $ZOO_HOME at root/home and no store."""
    return {"ZOO_ENTRIES": str(root / "entries"), "ZOO_HOME": str(root / "home"), "ZOO_LFS_URL": "", "ZOO_STORE": ""}


@contextlib.contextmanager
def _no_lease():
    """While waiting on another worker, hold no CPU lease: it may need both CPUs to finish what this one waits for."""
    if _LEASE["file"] is None or _LEASE["exclusive"]:
        yield
        return
    fcntl.flock(_LEASE["file"], fcntl.LOCK_UN)
    try:
        yield
    finally:
        _lock(fcntl.LOCK_SH)


def made_once(name: str, make) -> Path:
    """A folder made once per test run and shared by both pytest-xdist workers ($ZOO_TEST_SHARED, tests/conftest.py):
    the first test that wants it runs make(folder); the others, in either worker, wait for it and reuse it. Users
    copy it before changing anything (copy_of). A failed make leaves nothing behind: the next test makes it again."""
    folder = Path(os.environ["ZOO_TEST_SHARED"]) / name
    done = folder / ".made"
    lock = FileLock(f"{folder}.lock")
    with _no_lease():
        lock.acquire()
    try:
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    finally:
        lock.release()
    return folder


def shared_digits_entry() -> Path:
    """One quick digits-cnn entry per test run, built by `zoo build` (quick_digits_entry) with MLflow tracking on and
    a card declaring the ort-training artifacts as well: the tests of a built entry (test_entries, test_validate)
    read it from here, and copy it (copy_of) before changing it. Returns the folder holding entries/ and home/."""
    return made_once("quick-digits", lambda folder: quick_digits_entry(folder, card={"variants": ARTIFACTS},
                                                                         tracking=True))


# The quick entry of the on-device tests (tests/test_ondevice.py): its card declares a trainable split (the first conv
# block frozen), the ort-training artifacts and a federated variant, all made by `zoo build`.
ONDEVICE_TRAINABLE = ["features.2.*", "head.*"]


def ondevice_digits_entry() -> Path:
    """One quick digits-cnn entry per test run whose card declares the trainable split ONDEVICE_TRAINABLE and both
    derived variants (ort-training and a federated retraining): made once, read through copy_of like
    shared_digits_entry."""
    def make(folder: Path) -> None:
        fed = folder / "fed-quick.yaml"
        fed.write_text(yaml.safe_dump({
            "name": "fed-quick", "model": "digits-cnn", "seed": 0, "tracking": {"enabled": False},
            "federated": {"clients": 2, "rounds": 2, "local_steps": 15, "local_batch_size": 32, "lr": 0.003,
                          "dirichlet_alpha": 0.5, "shift": "rot90", "round_timeout_s": 120, "min_clients": 1}}))
        quick_digits_entry(folder, card={"trainable": ONDEVICE_TRAINABLE, "variants": {
            **ARTIFACTS,
            "federated": {"file": "model.federated.onnx", "precision": "fp32", "opset": 17, "recipe": str(fed)}}})

    return made_once("quick-digits-ondevice", make)


def prepared_datasets() -> None:
    """Every dataset prepared into the run's cache ($ZOO_DATA_DIR; zoo.data caches each once), each in a process of
    its own, side by side: the two tokenizations of the language-ID texts (half a CPU-minute each) run at once after
    the first of them has read the texts (half a CPU-minute; the other waits on zoo.data's lock, then reads its file)."""
    from zoo.data import dataset_names  # lazy: imports every dataset module, which only this needs

    def prepared(name: str) -> None:
        script = f"from zoo.data import load_dataset\nload_dataset({name!r})"
        subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=1200)

    names = dataset_names()
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(prepared, names))


def made_first() -> None:
    """What the tests share and only several busy processes make (the quick entries' `zoo build`s), and the prepared
    datasets, made before they start: `make test` runs this (python -m tests.helpers) ahead of its parts, so no
    pytest-xdist worker waits, its CPU idle, while the other one builds with both CPUs, and no test waits for a
    dataset that an idle-priority process (ci/test.sh) is preparing with the idle class's share of a CPU. Side by
    side: each build leaves a CPU idle while its rank 0 exports and measures, the others fill it."""
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for made in [pool.submit(prepared_datasets), pool.submit(shared_digits_entry),
                     pool.submit(ondevice_digits_entry)]:
            made.result()


def copy_of(root: Path, dest: Path) -> dict:
    """A private copy of a shared built entry's catalog and $ZOO_HOME (its recipe stays shared, read only): the CLI
    environment pointing at the copy."""
    for part in ("entries", "home"):
        if (root / part).exists():  # a build without tracking or cached objects leaves no home
            shutil.copytree(root / part, dest / part, symlinks=True)
    return catalog_env(dest)


def repo_is_clean() -> bool:
    """CI tests a fresh clone (clean); a developer's tree with uncommitted changes is not."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                            text=True, check=True)
    return not status.stdout.strip()


def build_flags() -> tuple[str, ...]:
    """`zoo build` refuses a dirty tree; test builds of work in progress are recorded as not reproducible instead."""
    return () if repo_is_clean() else ("--allow-dirty",)


def train_onnx(tmp_path: Path, out: str, *args: str) -> Path:
    """Train with launchers/ddp.py (one process, fp32 export only) and return the model.onnx it wrote."""
    cmd = [sys.executable, str(REPO / "launchers" / "ddp.py"), "--output-dir", str(tmp_path / out), "--no-tracking",
           "quantization.scheme=none", "export.variants=[fp32]", "export.opsets=[17]", *args]
    env = {**os.environ, "ZOO_HOME": str(tmp_path.parent / "zoo-home"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return tmp_path / out / "model.onnx"


def run_use_it(entries: Path, name: str, tmp: Path, env: dict | None = None) -> list[str]:
    """Generate `name`'s docs page from the catalog at `entries`, run its "Use it" block as a user would (a fresh
    Python process), and return the labels it printed."""
    from zoo import docs  # here: torch, onnxruntime and MLflow (3.4 s), which every pytest process would import

    page = docs.model_page(catalog.entries(entries)[name], {}, tmp)
    block = page.split("## Use it", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp / f"use-{name}.py"
    script.write_text(block)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp, timeout=300,
                            env={**os.environ, "ZOO_ENTRIES": str(entries), **(env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1].replace("'", '"'))


def entry_of(entries: Path, name: str, fp32: Path, dataset: str | None = None) -> Path:
    """A catalog entry `name` (the repo card's hand-written fields) whose only variant is the given fp32 file, trained
    on `dataset` (default: the card's)."""
    card = yaml.safe_load((REPO / "zoo" / "entries" / name / "card.yaml").read_text())
    if dataset:
        card["dataset"]["name"] = dataset
    folder = entries / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fp32, folder / "model.onnx")
    pointer = pointer_for(folder / "model.onnx")
    card["variants"] = {"fp32": {**card["variants"]["fp32"], "sha256": pointer.oid, "size": pointer.size,
                                 "extra_opsets": {}, "opset_range": None, "speed": None}}
    card["variants"]["fp32"] = {k: v for k, v in card["variants"]["fp32"].items() if v is not None}
    (folder / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
    return folder


if __name__ == "__main__":
    made_first()
