"""One registry of model architectures: `@register_model` builders, `build_model(name)`.

Architecture names are separate from catalog entries (as timm separates `resnet50` from
`resnet50.a1_in1k`): an entry's card says which architecture and which run made its weights.
"""

from __future__ import annotations

import difflib

import torch

from zoo.errors import UnknownModelError, ZooError
from zoo.models import bert, cnn, rnn  # noqa: F401  (each registers its architectures)
from zoo.models.registry import REGISTRY, ModelSpec


def model_spec(name: str) -> ModelSpec:
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.6)
        hint = f"; did you mean: {', '.join(close)}?" if close else f"; known models: {', '.join(sorted(REGISTRY))}"
        raise UnknownModelError(f"unknown model '{name}'{hint}")
    return REGISTRY[name]


def build_model(name: str, num_classes: int, **kwargs) -> torch.nn.Module:
    return model_spec(name).builder(num_classes=num_classes, **kwargs)


def model_for(name: str, data, **model_args) -> torch.nn.Module:
    """Architecture `name` shaped for a dataset: its classes and the arguments the data fixes (a vocabulary's size),
    then the recipe's `model_args`."""
    return build_model(name, num_classes=len(data.labels), **{**data.model_args, **model_args})


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parallel_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks a family shards one by one (FSDP2 `fully_shard` per block); [] means the root only."""
    units = getattr(model, "parallel_units", None)
    return list(units()) if units else []


def pipeline_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The family's split points: blocks that, chained, compute `model(x)`. A block takes the previous
    block's output (a tensor, or a tuple passed as separate arguments) and shares the model's parameters."""
    blocks = getattr(model, "pipeline_blocks", None)
    if blocks is None:
        raise ZooError(f"{type(model).__name__} declares no pipeline split points (pipeline_blocks)")
    return list(blocks())
