"""Federated learning over the zoo's ONNX models on Flower: onnxruntime-training clients, FedAvg server.

The fleet trains the fp32 ONNX file the zoo publishes, without torch: each Flower ClientApp takes local steps on its
shard with onnxruntime-training; the ServerApp averages the updates (sample-weighted FedAvg, Flower's strategy) and
refuses updates made from another base model (sha256) or quantization/precision state. A failed client costs the
round its update, never the global model; the server saves after each round and a restarted run resumes.

Modules: `client` (the ClientApp and what every participant shares: the shard split, the model state; numpy,
onnx and onnxruntime-training only — no torch), `fleet` (the recipe's data as the fleet sees it, each node's shard
written for its SuperNode), `server` (the global model: the rule, evaluation, per-round saving and resuming, export),
`flower` (the ServerApp and its strategy) and `run` (what launchers/federated.py runs: a local Flower deployment
with TLS and node authentication). This package file imports nothing, so a client imports no torch.
"""
