"""Detection speed: Brusselator residual (N x N grid, 2 species) and a 10-layer MLP on a batch.

    python benchmarks/detection.py           # prints a table, writes benchmarks/results/detection.json
    python benchmarks/detection.py --quick   # tiny sizes, JSON into a temporary folder
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (puts the checkout's root on sys.path)
from harness import Session  # noqa: E402

from asd.detection import jacobian_sparsity  # noqa: E402
from asd.timing import fmt_seconds, table  # noqa: E402


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


def main(argv=None) -> dict:
    a = harness.parse(harness.arguments("detection", __doc__), argv)
    torch.set_num_threads(a.threads)
    s = Session.from_args(a)
    N, layers, batch = (8, 2, 4) if a.quick else (256, 10, 256)
    rows = []
    for name, (f, x), target in ((f"brusselator N={N}", brusselator(N), 0.3),
                                 (f"mlp {layers} layers, batch {batch}, width 32", mlp(layers, batch=batch), 0.5)):
        t = s.measure(name, "asd.detection.jacobian_sparsity", lambda: jacobian_sparsity(f, x))
        P = jacobian_sparsity(f, x)
        rows.append(dict(case=name, seconds=t.median, target_seconds=target, met=t.median < target,
                         shape=list(P.shape), nnz=int(P.nnz), timing=t.to_json()))
    print(table([dict(r, t=fmt_seconds(r["seconds"]), goal=fmt_seconds(r["target_seconds"])) for r in rows],
                [("case", "case"), ("t", "detection"), ("goal", "target"), ("met", "met"), ("shape", "pattern"),
                 ("nnz", "nnz")]))
    return harness.write(s, dict(benchmark="detection", rows=rows), a.out)


if __name__ == "__main__":
    main()
