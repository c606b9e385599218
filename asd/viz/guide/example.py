"""The guide's running example: f = h o g on R^6, small enough to print every number."""

from __future__ import annotations

import torch

N = 6


def g(x: torch.Tensor) -> torch.Tensor:
    """Products of neighbours: g_i(x) = x_i x_{i+1} (R^6 -> R^5)."""
    return x[:-1] * x[1:]


def h(y: torch.Tensor) -> torch.Tensor:
    """h_0(y) = sin(y_0), h_i(y) = y_i - y_{i-1}^2 (R^5 -> R^5)."""
    return torch.cat([torch.sin(y[:1]), y[1:] - y[:-1] ** 2])


def f(x: torch.Tensor) -> torch.Tensor:
    """The composition f = h o g whose Jacobian the guide takes apart."""
    return h(g(x))


def point() -> torch.Tensor:
    """The point x at which every derivative of the guide is taken."""
    return torch.tensor([1.0, 2.0, -1.0, 0.5, 1.5, -2.0], dtype=torch.float64)
