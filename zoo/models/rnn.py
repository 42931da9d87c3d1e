"""Recurrent classifiers. The GRU is written out with nn.Linear gates (unrolled over time) rather than
nn.GRU so that PT2E quantization annotates its matmuls and the exported ONNX runs int8 kernels."""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.registry import register_model


class GRUClassifier(nn.Module):
    def __init__(self, num_classes: int, input_size: int, hidden: int, steps: int):
        super().__init__()
        self.hidden, self.steps = hidden, steps
        self.input_gates = nn.Linear(input_size, 3 * hidden)  # reset, update, candidate from x_t
        self.hidden_gates = nn.Linear(hidden, 3 * hidden)  # the same from h_{t-1}
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(x))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The last hidden state. x: [batch, 1, steps], one scalar input per time step."""
        sequence = x.transpose(1, 2)  # [batch, steps, 1]
        gates_x = self.input_gates(sequence)  # all time steps at once
        h = torch.zeros(x.shape[0], self.hidden, dtype=x.dtype, device=x.device)
        for t in range(self.steps):
            xr, xz, xn = gates_x[:, t].chunk(3, dim=1)
            hr, hz, hn = self.hidden_gates(h).chunk(3, dim=1)
            r = torch.sigmoid(xr + hr)
            z = torch.sigmoid(xz + hz)
            n = torch.tanh(xn + r * hn)
            h = (1 - z) * n + z * h
        return h

    def pipeline_blocks(self) -> list[nn.Module]:
        # The recurrence is sequential in time: one stage runs it, the next the head.
        return [_Recurrence(self), self.head]


class _Recurrence(nn.Module):
    def __init__(self, gru: GRUClassifier):
        super().__init__()
        self.input_gates, self.hidden_gates = gru.input_gates, gru.hidden_gates
        self._encode = gru.encode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._encode(x)


@register_model("mnist1d-gru", family="rnn", dataset="mnist1d")
def mnist1d_gru(num_classes: int = 10) -> nn.Module:
    return GRUClassifier(num_classes, input_size=1, hidden=128, steps=40)
