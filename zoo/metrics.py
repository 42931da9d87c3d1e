"""The zoo's one definition of accuracy, for torch outputs and onnxruntime outputs alike (numpy only)."""

from __future__ import annotations

import numpy as np


def label_accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    """Share of examples whose highest logit is the label."""
    return float((np.asarray(logits).argmax(axis=1) == y).mean())
