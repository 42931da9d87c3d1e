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
    # The upstream checkpoints `zoo import` converts into it (None: none; an entry of it is trained from scratch).
    imports: str | None = None
    # A transformer encoder: onnxruntime's transformer optimizer fuses its fp32 graph (attention, layer norms).
    transformer: bool = False

    def offers(self, method: str, **model_args) -> bool:
        """Whether the architecture's model declares `method` (a parallel layout's need: tensor_parallel_plan,
        pipeline_blocks, parallel_units). Built on the meta device: no weights are allocated."""
        with torch.device("meta"):
            return hasattr(self.builder(num_classes=2, **model_args), method)


REGISTRY: dict[str, ModelSpec] = {}


def register_model(name: str, family: str, dataset: str, imports: str | None = None, transformer: bool = False):
    def decorate(builder: Callable[..., torch.nn.Module]):
        REGISTRY[name] = ModelSpec(name, family, builder, dataset, imports, transformer)
        return builder

    return decorate
