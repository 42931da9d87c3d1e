"""The architecture registry: families register their builders with `@register_model`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    builder: Callable[..., torch.nn.Module]
    dataset: str  # the dataset its recipes train on by default


REGISTRY: dict[str, ModelSpec] = {}


def register_model(name: str, family: str, dataset: str):
    def decorate(builder: Callable[..., torch.nn.Module]):
        REGISTRY[name] = ModelSpec(name, family, builder, dataset)
        return builder

    return decorate
