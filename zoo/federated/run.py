"""What launchers/federated.py runs: a Flower deployment of the zoo's federated app on this machine.

A SuperLink, one SuperNode per client of the recipe and `flwr run zoo/federated/app`, as separate processes on
127.0.0.1, started and stopped by PID. Always with TLS (a CA and a server certificate for 127.0.0.1 made for the run)
and SuperNode authentication (each node's P-384 key registered with the SuperLink before it connects). Across hosts
the same three commands run on different machines (docs/guides/ondevice.md, "Federated learning on Flower").
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from zoo.catalog import require_content
from zoo.config import REPO_ROOT
from zoo.errors import ZooError
from zoo.fleet import write_shard
from zoo.fsutil import atomic_write_bytes, atomic_write_text
from zoo.recipes import Recipe, load_recipe, recipe_path
from zoo.store.fetch import fetch

APP = Path(__file__).resolve().parent / "app"
BIN = Path(sys.executable).parent
CONNECTION = "zoo-local"
# Offline and quiet: no telemetry, no update check, no `uv sync` of app dependencies (the zoo is installed).
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
              "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Federated training of a zoo fp32 ONNX model on Flower (FedAvg, "
                                                 "onnxruntime-training clients), deployed on this machine.")
    parser.add_argument("mode", choices=["run", "simulate"],
                        help="run: one SuperNode process per client (Flower's deployment runtime); simulate: the "
                             "recipe's clients as virtual SuperNodes of Flower's simulation runtime (Ray)")
    parser.add_argument("--recipe", default="federated-digits")
    parser.add_argument("--onnx", type=Path, help="base fp32 ONNX (default: the recipe model's catalog entry)")
    parser.add_argument("--output-dir", type=Path, help="server state, history and the federated model "
                                                        "(default runs/<model>-<recipe>)")
    parser.add_argument("--tracking-uri")
    parser.add_argument("--no-tracking", action="store_true")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides, e.g. federated.rounds=3")
    return parser.parse_intermixed_args(argv)


def base_model(onnx: Path | None, recipe: Recipe) -> Path:
    """The fp32 file the fleet starts from: the given one, or the recipe model's catalog entry (sha256-verified)."""
    if onnx:
        return require_content(onnx).resolve()
    return fetch(recipe.model, "fp32", show_progress=False).path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tls(folder: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it (one-day validity, made for this run)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key, issuer_name, issuer_key, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "zoo federated run CA")])
    ca = certificate("zoo federated run CA", ca_key, ca_name, ca_key, ca=True)
    server = certificate("127.0.0.1", server_key, ca_name, ca_key, ca=False)
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    atomic_write_bytes(paths["ca"], ca.public_bytes(serialization.Encoding.PEM))
    atomic_write_bytes(paths["cert"], server.public_bytes(serialization.Encoding.PEM))
    atomic_write_bytes(paths["key"], server_key.private_bytes(serialization.Encoding.PEM,
                                                              serialization.PrivateFormat.PKCS8,
                                                              serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's P-384 key pair in OpenSSH format (what `flwr supernode register` and the SuperNode read)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    atomic_write_bytes(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                  serialization.NoEncryption()))
    private.chmod(0o600)
    atomic_write_bytes(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                             serialization.PublicFormat.OpenSSH))
    return private, public


class LocalFederation:
    """SuperLink + SuperNodes on 127.0.0.1 with TLS and node authentication; processes stopped by PID on exit. With
    `virtual_nodes`, a SuperLink of Flower's simulation runtime instead, whose virtual SuperNodes run in Ray."""

    def __init__(self, workdir: Path, nodes: list[str], log=print, virtual_nodes: int = 0):
        self.workdir, self.node_configs, self.log, self.virtual_nodes = workdir, nodes, log, virtual_nodes
        self.processes: list[subprocess.Popen] = []
        self.port = free_port()
        self.home = workdir / "flwr-home"
        self.env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(self.home),
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                                # Ray's sockets (simulation): a unix socket path must stay under 108 characters
                    "RAY_TMPDIR": tempfile.mkdtemp(prefix="zoo-ray-"),
                    # the ServerApp and ClientApp processes import the zoo from this checkout
                    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}

    def __enter__(self) -> "LocalFederation":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def exe(self, name: str) -> str:
        """A Flower command from the environment the zoo runs in (its bin folder first)."""
        found = shutil.which(name, path=self.env["PATH"])
        if found is None:
            raise ZooError(f"`{name}` not found: Flower (flwr) is not installed; run `make setup`")
        return found

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                   start_new_session=True)
        process.log_file = log
        self.processes.append(process)
        return process

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tls = make_tls(self.workdir / "tls")
        self.home.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.home / "config.toml",
                          f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                          f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{tls["ca"]}"\n')
        mode = ["--simulation"] if self.virtual_nodes else ["--enable-supernode-auth"]
        self._spawn("superlink", [self.exe("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
                                  "--ssl-ca-certfile", str(tls["ca"]), "--ssl-certfile", str(tls["cert"]),
                                  "--ssl-keyfile", str(tls["key"]), *mode, "--disable-runtime-dependency-installation"])
        self._wait_for_superlink()
        if self.virtual_nodes:
            self.log(f"federation: simulation SuperLink 127.0.0.1:{self.port} (TLS), {self.virtual_nodes} virtual "
                     f"SuperNodes in Ray; logs in {self.workdir}")
            return
        for i, node_config in enumerate(self.node_configs):
            private, public = make_node_key(self.workdir / "node-keys", f"node{i}")
            self.flwr("supernode", "register", str(public), CONNECTION)
            self._spawn(f"supernode{i}", [self.exe("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
                                          "--root-certificates", str(tls["ca"]), "--host", "127.0.0.1",
                                          "--port", str(free_port()), "--auth-supernode-private-key", str(private),
                                          "--node-config", node_config])
        self.log(f"federation: SuperLink 127.0.0.1:{self.port} (TLS, SuperNode authentication), "
                 f"{len(self.node_configs)} SuperNodes; logs in {self.workdir}")

    def _wait_for_superlink(self, patience: float = 60.0) -> None:
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            if self.processes[0].poll() is not None:
                raise ZooError(f"the Flower SuperLink exited ({self.processes[0].returncode}); see "
                               f"{self.workdir / 'superlink.log'}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        raise ZooError(f"the Flower SuperLink did not listen on 127.0.0.1:{self.port} within {patience:.0f} s")

    def flwr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([self.exe("flwr"), *args], env=self.env, capture_output=True, text=True,
                              cwd=self.workdir, timeout=600)
        if check and done.returncode != 0:
            raise ZooError(f"`flwr {' '.join(args)}` failed: {(done.stderr or done.stdout).strip()[-600:]}")
        return done

    def run(self, run_config: dict, patience: float) -> str:
        """`flwr run` the zoo's app and wait for it; returns Flower's final status (e.g. finished:completed)."""
        # A TOML file: values with quotes or spaces do not survive the inline key=value form.
        config = self.workdir / "run-config.toml"
        atomic_write_text(config, "".join(f"{k} = {json.dumps(v)}\n" for k, v in run_config.items()))
        # Simulation: the virtual SuperNodes, one CPU each (Ray runs as many at once as there are cores).
        simulation = (["--federation-config", f"num-supernodes={self.virtual_nodes} client-resources-num-cpus=1"]
                      if self.virtual_nodes else [])
        started = self.flwr("run", str(APP), CONNECTION, "--run-config", str(config), *simulation, "--format", "json")
        answer = json.loads(started.stdout)
        if not answer.get("success"):
            raise ZooError(f"`flwr run` refused the run: {answer.get('error-message', started.stdout)}")
        run_id = answer["run-id"]
        # The run's own log (the ServerApp's rounds) on this console while it runs.
        streamer = subprocess.Popen([self.exe("flwr"), "log", str(run_id), CONNECTION, "--stream"], env=self.env,
                                    cwd=self.workdir, start_new_session=True)
        try:
            deadline, asked, app_seen, app_gone = time.monotonic() + patience, 0.0, False, None
            while (left := deadline - time.monotonic()) > 0:
                # Two signs the run is over, watched each second: the SuperLink ends the log stream when the run
                # finishes, and the ServerApp's process (the SuperLink's child) exits, also when it dies, which Flower
                # itself reports only after its heartbeat patience (about a minute). Flower's status (`flwr ls`,
                # seconds of CPU each, taken from the run's own processes) is asked only then, or every 30 s.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    streamer.wait(timeout=min(left, 1.0))
                alive = self._server_app_alive()
                app_seen |= alive
                if app_seen and not alive and app_gone is None:
                    app_gone = time.monotonic()
                now = time.monotonic()
                signalled = streamer.poll() is not None or app_gone is not None
                if now - asked < (2.0 if signalled else 30.0):
                    continue
                asked, status = now, self.status(run_id)
                if status.startswith("finished"):
                    return status
                if app_gone is not None and now - app_gone > 10:  # the ServerApp is gone and Flower has not noticed
                    return "finished:failed (its ServerApp process exited)"
        finally:
            if streamer.poll() is None:
                os.killpg(streamer.pid, signal.SIGTERM)
            streamer.wait()
        raise ZooError(f"Flower run {run_id} did not finish within {patience:.0f} s; see {self.workdir}")

    def _server_app_alive(self) -> bool:
        """Whether the SuperLink's ServerApp process (flwr-serverapp, or flwr-simulation's) is running."""
        try:
            children = psutil.Process(self.processes[0].pid).children(recursive=True)
        except (psutil.Error, IndexError):
            return False
        for child in children:
            with contextlib.suppress(psutil.Error):
                if any(Path(arg).name in ("flwr-serverapp", "flwr-simulation") for arg in child.cmdline()[:2]):
                    return True
        return False

    def status(self, run_id: int) -> str:
        """Flower's status of a run (e.g. running, finished:completed)."""
        listed = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json").stdout
        return (json.loads(listed).get("runs") or [{}])[0].get("status", "unknown")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            process.log_file.close()
        self.processes.clear()
        shutil.rmtree(self.env["RAY_TMPDIR"], ignore_errors=True)


def run_local(args: argparse.Namespace, recipe: Recipe) -> dict:
    """The recipe's fleet as a local Flower deployment; returns federated.json."""
    out = (args.output_dir or Path("runs") / f"{recipe.model}-{recipe.name}").resolve()
    base = base_model(args.onnx, recipe)
    out.mkdir(parents=True, exist_ok=True)
    workdir = out / "flower"
    shutil.rmtree(workdir, ignore_errors=True)  # certificates, keys and logs of this run only
    simulate = args.mode == "simulate"
    # Each SuperNode holds its own shard (what a device would hold) and its own folder.
    nodes = [] if simulate else [f'partition-id={i} base-onnx="{base}" workdir="{workdir / f"node{i}"}" '
                                 f'data="{write_shard(recipe, i, workdir / f"node{i}" / "data.npz")}"'
                                 for i in range(recipe.federated.clients)]
    # The recipe as given (a catalog name or a .yaml path), resolved here: the ServerApp and ClientApps load it again.
    run_config = {"recipe": str(recipe_path(args.recipe).resolve()), "overrides": json.dumps(list(args.overrides)),
                  "base-onnx": str(base), "output-dir": str(out), "tracking": not args.no_tracking,
                  "tracking-uri": args.tracking_uri or ""}
    patience = recipe.federated.rounds * (recipe.federated.round_timeout_s + 60) + 300
    with LocalFederation(workdir, nodes, virtual_nodes=recipe.federated.clients if simulate else 0) as federation:
        status = federation.run(run_config, patience)
    if status != "finished:completed" or not (out / "federated.json").exists():
        raise ZooError(f"the federated run ended {status}; the ServerApp's output is in {workdir / 'superlink.log'}"
                       + (" (rounds completed so far are saved: run again to resume)"
                          if (out / "history.json").exists() else ""))
    return json.loads((out / "federated.json").read_text())


def main(script: Path, argv: list[str] | None = None) -> None:
    """The launcher's entry point: one clean line and a non-zero exit on any zoo error."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if recipe.federated is None:
            raise ZooError(f"recipe '{recipe.name}' has no federated section (see recipes/federated-digits.yaml)")
        summary = run_local(args, recipe)
        rounds = ", ".join(f"{r['round']}: {r['accuracy']:.4f}" for r in summary["rounds"])
        print(f"federated: initial {summary['initial_accuracy']:.4f}; per round {rounds}; "
              f"central {summary['central_accuracy']:.4f}", flush=True)
    except ZooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
