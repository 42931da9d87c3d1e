"""One registry of model architectures: `@register_model` builders, `build_model(name)`.

Architecture names are separate from catalog entries (as timm separates `resnet50` from
`resnet50.a1_in1k`): an entry's card says which architecture and which run made its weights.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zoo.errors import UnknownModelError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    builder: Callable[..., torch.nn.Module]
    dataset: str  # the dataset its recipes train on by default
    input_names: tuple[str, ...] = ("input",)


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(name: str, family: str, dataset: str, input_names: tuple[str, ...] = ("input",)):
    def decorate(builder: Callable[..., torch.nn.Module]):
        _REGISTRY[name] = ModelSpec(name, family, builder, dataset, input_names)
        return builder

    return decorate


def _load_families() -> None:
    from zoo.models import bert, cnn, rnn  # noqa: F401  (registers on import)


def model_spec(name: str) -> ModelSpec:
    _load_families()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.6)
        hint = f"; did you mean: {', '.join(close)}?" if close else f"; known models: {', '.join(sorted(_REGISTRY))}"
        raise UnknownModelError(f"unknown model '{name}'{hint}")
    return _REGISTRY[name]


def list_architectures() -> list[str]:
    _load_families()
    return sorted(_REGISTRY)


def build_model(name: str, num_classes: int, **kwargs) -> torch.nn.Module:
    return model_spec(name).builder(num_classes=num_classes, **kwargs)


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
        from zoo.errors import ZooError

        raise ZooError(f"{type(model).__name__} declares no pipeline split points (pipeline_blocks)")
    return list(blocks())
