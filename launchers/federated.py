"""Federated launcher: a FedAvg server and N clients that train the zoo's fp32 ONNX with onnxruntime-training.

    python launchers/federated.py run --recipe federated-digits [--onnx FILE] [--output-dir D]
        starts the server and the recipe's clients as separate processes on 127.0.0.1 and reports per round
    python launchers/federated.py serve --recipe R --port 8123 [--onnx FILE] [--output-dir D]
    python launchers/federated.py client --recipe R --server http://127.0.0.1:8123 --client-id 0 [--onnx FILE]

Without --onnx the base model is the catalog entry named by the recipe's model (`zoo fetch`, sha256-verified).
The server refuses updates made from another base (sha256) or quantization/precision state, drops clients that
miss a round's deadline, saves after every round and resumes from the last complete one when restarted.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing.
sys.path[0] = str(Path(__file__).resolve().parents[1])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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


def base_model(args, recipe) -> Path:
    if args.onnx:
        from zoo.store.fetch import require_content

        return require_content(args.onnx)
    from zoo.store.fetch import fetch

    return fetch(recipe.model, "fp32", show_progress=False).path


def serve(args, recipe) -> dict:
    from zoo.federated import FedAvgServer, central_baseline
    from zoo.store.pointer import sha256_file
    from zoo.train.tracking import Tracker

    out = args.output_dir or Path("runs") / f"{recipe.model}-{recipe.name}"
    tracker = Tracker(recipe.tracking.enabled and not args.no_tracking, args.tracking_uri or recipe.tracking.uri,
                      recipe.tracking.experiment, f"{recipe.model}-{recipe.name}",
                      {"recipe": recipe.model_dump(mode="json"), "launcher": "federated"})
    try:
        server = FedAvgServer(recipe, base_model(args, recipe), out, log=lambda m: print(m, flush=True), tracker=tracker)
        http = server.serve(args.port)
        print(f"server: listening on http://127.0.0.1:{http.server_address[1]}", flush=True)
        initial = server.evaluate(server.model.parameters()) if not server.history else server.history[0]["initial_accuracy"]
        exit_after = int(os.environ.get("ZOO_FEDERATED_SERVER_EXIT_AFTER", "0"))  # restart tests
        while server.current.number <= recipe.federated.rounds:
            record = server.run_round()
            if record["round"] == 1:
                record["initial_accuracy"] = initial
                server._save()
            if record["round"] == exit_after:
                print(f"server: exiting after round {exit_after} (ZOO_FEDERATED_SERVER_EXIT_AFTER)", flush=True)
                os._exit(19)
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
        from zoo.store.cache import atomic_write_text

        atomic_write_text(out / "federated.json", json.dumps(summary, indent=2) + "\n")
        tracker.metric("federated/central_accuracy", central, len(server.history))
        tracker.artifacts([final, out / "federated.json"])
        tracker.finish()
        return summary
    except BaseException:
        tracker.finish("FAILED")
        raise


def client(args, recipe) -> None:
    from zoo.federated import FederatedClient

    with tempfile.TemporaryDirectory(prefix=f"zoo-client{args.client_id}-") as tmp:
        FederatedClient(recipe, args.client_id, base_model(args, recipe), args.server, Path(tmp),
                        log=lambda m: print(m, flush=True)).run()


def run(args, recipe, argv) -> int:
    """Server and clients as separate local processes (what a fleet does over a network)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    passthrough = [a for a in (argv or sys.argv[1:]) if a != "run"]
    script = [sys.executable, str(Path(__file__).resolve())]
    server = subprocess.Popen([*script, "serve", *passthrough, "--port", str(port)])
    clients = [subprocess.Popen([*script, "client", *passthrough, "--server", f"http://127.0.0.1:{port}",
                                 "--client-id", str(i)]) for i in range(recipe.federated.clients)]
    code = server.wait()
    for c in clients:
        try:
            c.wait(timeout=60 if code == 0 else 0.1)  # a failed server: its clients have nothing left to do
        except subprocess.TimeoutExpired:
            c.kill()
    return code


def main(argv=None) -> None:
    from zoo.errors import ZooError

    args = parse_args(argv)
    try:
        from zoo.recipes import load_recipe

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
            raise SystemExit(run(args, recipe, argv))
    except ZooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
