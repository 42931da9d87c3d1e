"""What launchers/federated.py runs: the server (rounds, then the global model and a central baseline), a client,
or both as separate local processes (what a fleet does over a network)."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zoo import faults
from zoo.catalog import require_content
from zoo.errors import ZooError
from zoo.federated.client import FederatedClient
from zoo.federated.server import FedAvgServer, central_baseline
from zoo.fsutil import atomic_write_text
from zoo.recipes import Recipe, load_recipe
from zoo.store.fetch import fetch
from zoo.store.pointer import sha256_file
from zoo.train.tracking import Tracker


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Federated training of a zoo fp32 ONNX model (FedAvg, "
                                                 "onnxruntime-training clients).")
    parser.add_argument("mode", choices=["run", "serve", "client"])
    parser.add_argument("--recipe", default="federated-digits")
    parser.add_argument("--onnx", type=Path, help="base fp32 ONNX (default: the recipe model's catalog entry)")
    parser.add_argument("--output-dir", type=Path, help="server state, history and the federated model "
                                                        "(default runs/<model>-<recipe>)")
    parser.add_argument("--port", type=int, default=0, help="serve: port on 127.0.0.1 (run: chosen free)")
    parser.add_argument("--server", help="client: the server's URL")
    parser.add_argument("--client-id", type=int, default=0)
    parser.add_argument("--tracking-uri")
    parser.add_argument("--no-tracking", action="store_true")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides, e.g. federated.rounds=3")
    return parser.parse_intermixed_args(argv)


def base_model(onnx: Path | None, recipe: Recipe) -> Path:
    """The fp32 file the fleet starts from: the given one, or the recipe model's catalog entry (sha256-verified)."""
    if onnx:
        return require_content(onnx)
    return fetch(recipe.model, "fp32", show_progress=False).path


def serve(args: argparse.Namespace, recipe: Recipe) -> dict:
    """Run every round, then export the global model, measure the central baseline and write federated.json."""
    out = args.output_dir or Path("runs") / f"{recipe.model}-{recipe.name}"
    tracker = Tracker(recipe.tracking.enabled and not args.no_tracking, args.tracking_uri or recipe.tracking.uri,
                      recipe.tracking.experiment, f"{recipe.model}-{recipe.name}",
                      {"recipe": recipe.model_dump(mode="json"), "launcher": "federated"})
    try:
        server = FedAvgServer(recipe, base_model(args.onnx, recipe), out, log=lambda m: print(m, flush=True),
                              tracker=tracker)
        http = server.serve(args.port)
        print(f"server: listening on http://127.0.0.1:{http.server_address[1]}", flush=True)
        initial = server.evaluate(server.model.parameters()) if not server.history else server.history[0]["initial_accuracy"]
        exit_after = faults.armed("federated-server")
        while server.current.number <= recipe.federated.rounds:
            record = server.run_round()
            if record["round"] == 1:
                record["initial_accuracy"] = initial
                server.save()
            if exit_after == (record["round"],):
                faults.die("federated-server", f"server: exiting after round {record['round']}")
        time.sleep(3)  # let polling clients see that the run is done
        http.shutdown()
        final = server.export_global()
        with tempfile.TemporaryDirectory() as tmp:
            central = central_baseline(recipe, server.base, Path(tmp))
        summary = {
            "recipe": recipe.name, "base_sha256": server.base_sha, "state": server.state, "initial_accuracy": initial,
            "rounds": [{k: r[k] for k in ("round", "clients", "dropped", "refused", "accuracy")} for r in server.history],
            "central_accuracy": central,
            "variant": {"file": final.name, "sha256": sha256_file(final), "size": final.stat().st_size,
                        "metrics": {"accuracy": server.history[-1]["accuracy"]}},
        }
        atomic_write_text(out / "federated.json", json.dumps(summary, indent=2) + "\n")
        tracker.metric("federated/central_accuracy", central, len(server.history))
        tracker.artifacts([final, out / "federated.json"])
        tracker.finish()
        return summary
    except BaseException:
        tracker.finish("FAILED")
        raise


def client(args: argparse.Namespace, recipe: Recipe) -> None:
    with tempfile.TemporaryDirectory(prefix=f"zoo-client{args.client_id}-") as tmp:
        FederatedClient(recipe, args.client_id, base_model(args.onnx, recipe), args.server, Path(tmp),
                        log=lambda m: print(m, flush=True)).run()


def run_local(script: Path, argv: list[str], recipe: Recipe) -> int:
    """Server and clients as separate local processes of `script` (the launcher), on a free port of 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    passthrough = [a for a in argv if a != "run"]
    command = [sys.executable, str(script)]
    server = subprocess.Popen([*command, "serve", *passthrough, "--port", str(port)])
    clients = [subprocess.Popen([*command, "client", *passthrough, "--server", f"http://127.0.0.1:{port}",
                                 "--client-id", str(i)]) for i in range(recipe.federated.clients)]
    code = server.wait()
    for c in clients:
        try:
            c.wait(timeout=60 if code == 0 else 0.1)  # a failed server: its clients have nothing left to do
        except subprocess.TimeoutExpired:
            c.kill()
    return code


def main(script: Path, argv: list[str] | None = None) -> None:
    """The launcher's entry point: one clean line and a non-zero exit on any zoo error."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if recipe.federated is None:
            raise ZooError(f"recipe '{recipe.name}' has no federated section (see recipes/federated-digits.yaml)")
        if args.mode == "client" and not args.server:
            raise ZooError("client mode needs --server http://HOST:PORT")
        if args.mode == "serve":
            summary = serve(args, recipe)
            rounds = ", ".join(f"{r['round']}: {r['accuracy']:.4f}" for r in summary["rounds"])
            print(f"federated: initial {summary['initial_accuracy']:.4f}; per round {rounds}; "
                  f"central {summary['central_accuracy']:.4f}", flush=True)
        elif args.mode == "client":
            client(args, recipe)
        else:
            raise SystemExit(run_local(script, argv, recipe))
    except ZooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
