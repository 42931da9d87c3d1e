"""The zoo's ONNX metadata (ModelProto.metadata_props) read with the onnx library alone: no torch, so a federated
client or a device can check what a file is (zoo.export defines the keys and writes them)."""

from __future__ import annotations

from pathlib import Path

import onnx


def read_metadata(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
