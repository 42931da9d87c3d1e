"""Small convolutional classifiers: 2-D for 8x8 digit images, 1-D for MNIST-1D sequences."""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.registry import register_model


class ConvClassifier(nn.Module):
    """Two conv+ReLU blocks, a max-pool, and a two-layer MLP head. `dims` picks Conv1d or Conv2d."""

    def __init__(self, num_classes: int, in_channels: int, pooled_size: int, dims: int, width: int = 32,
                 hidden: int = 128, kernel: int = 3):
        super().__init__()
        conv = nn.Conv2d if dims == 2 else nn.Conv1d
        pool = nn.MaxPool2d if dims == 2 else nn.MaxPool1d
        self.features = nn.Sequential(
            conv(in_channels, width // 2, kernel, padding=kernel // 2), nn.ReLU(),
            conv(width // 2, width, kernel, padding=kernel // 2), nn.ReLU(),
            pool(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(width * pooled_size, hidden), nn.ReLU(),
                                  nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def parallel_units(self) -> list[nn.Module]:
        return [self.features, self.head]

    def pipeline_blocks(self) -> list[nn.Module]:
        return [*self.features, *self.head]

    def tensor_parallel_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # lazy: TP ranks only

        # The MLP head holds most parameters: hidden units column-wise, the logits layer row-wise.
        return {"head.1": ColwiseParallel(), "head.3": RowwiseParallel()}


@register_model("digits-cnn", family="cnn", dataset="digits")
def digits_cnn(num_classes: int = 10) -> nn.Module:
    # 8x8 inputs -> 4x4 after pooling.
    return ConvClassifier(num_classes, in_channels=1, pooled_size=16, dims=2, width=32, hidden=64)


@register_model("mnist1d-cnn", family="cnn", dataset="mnist1d")
def mnist1d_cnn(num_classes: int = 10) -> nn.Module:
    # 40-sample sequences -> 20 after pooling.
    return ConvClassifier(num_classes, in_channels=1, pooled_size=20, dims=1, width=64, hidden=256, kernel=5)
