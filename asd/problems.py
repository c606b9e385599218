"""The standard benchmark problems of ``shared/design/PEERS.md``, as plain PyTorch functions."""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch


def brusselator(N: int, alpha: float = 10.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """B1: the 2-D Brusselator residual on an N x N periodic grid, x = [u; v] flattened (n = 2 N^2)."""
    h2 = (1.0 / (N - 1)) ** 2

    def lap(w: torch.Tensor) -> torch.Tensor:
        return (torch.roll(w, 1, 0) + torch.roll(w, -1, 0) + torch.roll(w, 1, 1) + torch.roll(w, -1, 1) - 4 * w) / h2

    def f(x: torch.Tensor) -> torch.Tensor:
        u, v = x.reshape(2, N, N)
        uuv = u * u * v
        du = 1 + uuv - 4.4 * u + alpha * lap(u)
        dv = 3.4 * u - uuv + alpha * lap(v)
        return torch.stack([du, dv]).reshape(-1)

    f.__name__ = f"brusselator_{N}"
    return f


def brusselator_input(N: int, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(2 * N * N, dtype=dtype, generator=g)


def conv_layer(case: str = "a", dtype=torch.float64, seed: int = 0):
    """B2: a convolution layer as a function of its input. ``case`` "a": 1x1x28x28 with one 5x5
    filter, no padding (576 x 784); "b": 1x3x64x64, 8 output channels, 3x3, padding 1."""
    g = torch.Generator().manual_seed(seed)
    if case == "a":
        w = torch.randn(1, 1, 5, 5, dtype=dtype, generator=g)
        x = torch.randn(1, 1, 28, 28, dtype=dtype, generator=g)
        pad = 0
    elif case == "b":
        w = torch.randn(8, 3, 3, 3, dtype=dtype, generator=g)
        x = torch.randn(1, 3, 64, 64, dtype=dtype, generator=g)
        pad = 1
    else:
        raise ValueError("case must be 'a' or 'b'")

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w, padding=pad)

    f.__name__ = f"conv_{case}"
    return f, x


def rosenbrock(x: torch.Tensor) -> torch.Tensor:
    """B3: the chained Rosenbrock function (tridiagonal Hessian)."""
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def total_variation(N: int, eps: float = 1e-2) -> Callable[[torch.Tensor], torch.Tensor]:
    """A smoothed 2-D total variation of an N x N image (Hessian: 3 x 3 stencils)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        u = x.reshape(N, N)
        dx = u[1:, :-1] - u[:-1, :-1]
        dy = u[:-1, 1:] - u[:-1, :-1]
        return torch.sqrt(dx * dx + dy * dy + eps * eps).sum() + 0.5 * (x * x).sum()

    f.__name__ = f"total_variation_{N}"
    return f


def cartpole(K: int):
    """B5: cart-pole swing-up by trapezoidal direct collocation (PEERS.md; Kelly 2017).

    Returns ``(objective, constraints, x0, lb, ub)`` for ``minimize objective(x)`` subject to
    ``constraints(x) == 0`` and ``lb <= x <= ub``; ``x`` interleaves ``[q1, q2, q1', q2', u]`` for
    ``k = 0..K`` (``n = 5 (K + 1)``, ``m = 4 K``). At K = 2000 the optimum is 58.80789827.
    """
    m1, m2, ell, g, T = 1.0, 0.3, 0.5, 9.81, 2.0
    h = T / K

    def dynamics(z: torch.Tensor) -> torch.Tensor:
        q2, dq1, dq2, u = z[:, 1], z[:, 2], z[:, 3], z[:, 4]
        s, c = torch.sin(q2), torch.cos(q2)
        den = m1 + m2 * (1 - c * c)
        ddq1 = (ell * m2 * s * dq2 * dq2 + u + m2 * g * c * s) / den
        ddq2 = -(ell * m2 * c * s * dq2 * dq2 + u * c + (m1 + m2) * g * s) / (ell * den)
        return torch.stack([dq1, dq2, ddq1, ddq2], dim=1)

    def objective(x: torch.Tensor) -> torch.Tensor:
        u = x.reshape(K + 1, 5)[:, 4]
        return (h / 2) * (u[:-1] ** 2 + u[1:] ** 2).sum()

    def constraints(x: torch.Tensor) -> torch.Tensor:
        z = x.reshape(K + 1, 5)
        f = dynamics(z)
        return (z[1:, :4] - z[:-1, :4] - (h / 2) * (f[:-1] + f[1:])).reshape(-1)

    x0 = np.zeros((K + 1, 5))
    x0[:, 0] = np.linspace(0.0, 1.0, K + 1)
    x0[:, 1] = np.linspace(0.0, np.pi, K + 1)
    lb = np.full((K + 1, 5), -2e19)
    ub = np.full((K + 1, 5), 2e19)
    lb[:, 0], ub[:, 0] = -2.0, 2.0
    lb[:, 4], ub[:, 4] = -20.0, 20.0
    lb[0, :4] = ub[0, :4] = 0.0
    lb[K, :4] = ub[K, :4] = (1.0, np.pi, 0.0, 0.0)
    return objective, constraints, x0.reshape(-1), lb.reshape(-1), ub.reshape(-1)


def banded_pattern(n: int, rho: int) -> sp.csr_array:
    """A symmetric banded pattern with ``rho`` off-diagonal bands (half-bandwidth ``rho // 2``):
    star coloring needs ``2 * (rho // 2) + 1`` colors, acyclic ``rho // 2 + 1``."""
    k = rho // 2
    offsets = list(range(-k, k + 1))
    return sp.csr_array(sp.diags([np.ones(n - abs(d)) for d in offsets], offsets, format="csr").astype(bool))


def arrowhead_pattern(N: int, K: int) -> sp.csr_array:
    """Hessian pattern of SparseConnectivityTracer's ArrowHead(K) benchmark: a band of half-width
    ``K - 1`` plus the first ``K`` variables coupled to all."""
    a = np.arange(N)
    r, c = [], []
    for d in range(-(K - 1), K):
        ok = (a + d >= 0) & (a + d < N)
        r.append(a[ok])
        c.append(a[ok] + d)
    for j in range(K):
        r += [a, np.full(N, j)]
        c += [np.full(N, j), a]
    r, c = np.concatenate(r), np.concatenate(c)
    return sp.csr_array((np.ones(r.size, dtype=bool), (r, c)), shape=(N, N))
