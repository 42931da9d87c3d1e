"""Federated launcher: a FedAvg server and N clients that train the zoo's fp32 ONNX with onnxruntime-training.

    python launchers/federated.py run --recipe federated-digits [--onnx FILE] [--output-dir D]
        starts the server and the recipe's clients as separate processes on 127.0.0.1 and reports per round
    python launchers/federated.py serve --recipe R --port 8123 [--onnx FILE] [--output-dir D]
    python launchers/federated.py client --recipe R --server http://127.0.0.1:8123 --client-id 0 [--onnx FILE]

Without --onnx the base model is the catalog entry named by the recipe's model (`zoo fetch`, sha256-verified).
The server refuses updates made from another base (sha256) or quantization/precision state, drops clients that
miss a round's deadline, saves after every round and resumes from the last complete one when restarted.
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.federated.run import main  # noqa: E402

if __name__ == "__main__":
    main(Path(__file__).resolve())
