"""The on-device training split, recorded in the fp32 file's metadata.

- `zoo.trainable`: JSON list of the ONNX initializers a device may change (the rest stay frozen).
- `zoo.trainable.globs`: the recipe's parameter-name patterns they came from.
Files without the key (older exports) treat every float weight as trainable.
"""

from __future__ import annotations

import json
from fnmatch import fnmatch

import numpy as np
import onnx
from onnx import numpy_helper

from zoo.errors import ZooError

TRAINABLE_KEY = "zoo.trainable"
TRAINABLE_GLOBS_KEY = "zoo.trainable.globs"


def trainable_initializers(onnx_model: onnx.ModelProto, named_params: dict[str, np.ndarray],
                           patterns: list[str] | None) -> list[str]:
    """ONNX initializer names holding the torch parameters that match `patterns` (None: all).

    Exporters rename folded weights (a Linear on 3-D input becomes MatMul with a transposed initializer
    called `onnx::MatMul_123`), so parameters are found by value, as stored or transposed."""
    wanted = {n: v for n, v in named_params.items() if patterns is None or any(fnmatch(n, p) for p in patterns)}
    by_value: dict[bytes, list[str]] = {}
    for init in onnx_model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32 and array.ndim >= 1:
            by_value.setdefault(array.tobytes(), []).append(init.name)
    names = []
    for value in wanted.values():
        candidates = [np.ascontiguousarray(c) for c in ([value, value.T] if value.ndim == 2 else [value])]
        found = next((by_value[c.tobytes()] for c in candidates if c.tobytes() in by_value), [])
        # Not found: the graph does not use that parameter (e.g. BERT's pooler under mean pooling).
        names += [n for n in found if n not in names]
    if not names:
        raise ZooError(f"trainable patterns {patterns} match no initializer of the ONNX graph")
    return names


def float_weights(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.initializer
            if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) >= 1]


def trainable_of(model: onnx.ModelProto) -> list[str]:
    """The file's own trainable set (metadata), or every float weight for files that carry none."""
    props = {p.key: p.value for p in model.metadata_props}
    if TRAINABLE_KEY in props:
        names = json.loads(props[TRAINABLE_KEY])
        missing = set(names) - {i.name for i in model.graph.initializer}
        if missing:
            raise ZooError(f"{TRAINABLE_KEY} names initializers the graph lacks: {sorted(missing)[:3]}")
        return names
    return float_weights(model)
