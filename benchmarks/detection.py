"""Detection speed: Brusselator residual (N x N grid, 2 species) and a 10-layer MLP on a batch.

    .venv/bin/python benchmarks/detection.py      # prints a table, writes benchmarks/results/detection.json
"""

from __future__ import annotations

import json
import pathlib
import time

import torch

from asd.detection import jacobian_sparsity


def brusselator(N: int):
    alpha = 10.0 / (N - 1) ** 2

    def f(y):
        u, v = y[0], y[1]
        lap = lambda w: torch.roll(w, 1, 0) + torch.roll(w, -1, 0) + torch.roll(w, 1, 1) + torch.roll(w, -1, 1) - 4 * w  # noqa: E731
        du = 1.0 + u * u * v - 4.4 * u + alpha * lap(u)
        dv = 3.4 * u - u * u * v + alpha * lap(v)
        return torch.stack([du, dv])

    return f, torch.randn(2, N, N, dtype=torch.float64)


def mlp(layers: int = 10, width: int = 32, batch: int = 256):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width, dtype=torch.float64), torch.nn.Tanh()]
    net = torch.nn.Sequential(*mods)
    return (lambda x: net(x)), torch.randn(batch, width, dtype=torch.float64)


def best_of(f, x, repeat=3):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        P = jacobian_sparsity(f, x)
        ts.append(time.perf_counter() - t)
    return min(ts), P


def main():
    rows = []
    for name, (f, x), target in (("brusselator N=256", brusselator(256), 0.3),
                                 ("mlp 10 layers, batch 256, width 32", mlp(), 0.5)):
        t, P = best_of(f, x)
        rows.append(dict(case=name, seconds=t, target_seconds=target, shape=list(P.shape), nnz=int(P.nnz)))
        print(f"{name:40s} {t * 1e3:8.1f} ms (target {target * 1e3:.0f} ms)  pattern {P.shape} nnz {P.nnz}")
    out = pathlib.Path(__file__).parent / "results" / "detection.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
