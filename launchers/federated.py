"""Federated launcher: the zoo's fp32 ONNX trained by a fleet of onnxruntime-training clients on Flower (FedAvg).

    python launchers/federated.py run --recipe federated-digits [--onnx FILE] [--output-dir D] [key=value ...]
        a Flower deployment on 127.0.0.1 (SuperLink, one SuperNode per client, `flwr run zoo/federated/app`) with
        TLS and SuperNode authentication; reports each round next to central training

Without --onnx the base model is the catalog entry named by the recipe's model (`zoo fetch`, sha256-verified).
The server refuses updates made from another base (sha256) or quantization/precision state, goes on without
clients that fail or miss a round's timeout, saves after every round and resumes from the last one when run again.
On several hosts, run the SuperLink, the SuperNodes and `flwr run` yourself (docs/guides/ondevice.md, "Federated
learning on Flower").
"""

import sys
from pathlib import Path

# The repo root replaces this script's folder on the path: run from a checkout without installing.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from zoo.federated.run import main  # noqa: E402

if __name__ == "__main__":
    main(Path(__file__).resolve())
