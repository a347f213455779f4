"""User-defined networks given to opcost as import paths (``toymodels.nets:tiny_mlp``)."""

import torch
from torch import nn


class Scale(nn.Module):
    """A module type nobody listed: its plain attribute ``factor`` must be captured."""

    def __init__(self, factor: float = 2.0) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.scale = Scale(0.5)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        h = h + torch.tanh(h)  # two functional ops outside any leaf module
        return self.fc2(self.scale(h))


def tiny_mlp() -> nn.Module:
    return TinyMLP()


def not_a_module() -> int:
    return 3
