"""The zoo's one definition of accuracy, for torch outputs and onnxruntime outputs alike (numpy only)."""

from __future__ import annotations

import math

import numpy as np


def label_accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    """Share of examples whose highest logit is the label."""
    return float((np.asarray(logits).argmax(axis=1) == y).mean())


def wilson_interval(accuracy: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of an accuracy measured on n examples: inside [0, 1] by construction."""
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def confidence(accuracy: float, n: int) -> float:
    """The larger distance from an accuracy to the ends of its 95% Wilson interval (a "±" for tables)."""
    low, high = wilson_interval(accuracy, n)
    return max(high - accuracy, accuracy - low)
