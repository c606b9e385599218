"""The figures of the illustrated guide: ``python -m asd figures [folder]``.

Each figure is computed by asd itself (detection, coloring) on the guide's examples.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def conv_jacobian(folder: str) -> str:
    """B2a: the 576 x 784 Jacobian of a 5x5 convolution on a 28x28 image, colored by its coloring."""
    from ... import api
    from ...problems import conv_layer
    from ..spy import spy_coloring

    plt = _plt()
    f, x = conv_layer("a")
    op = api.prepare_jacobian(f, x, mode="forward")
    fig, ax = plt.subplots(figsize=(7.5, 6))
    spy_coloring(op.pattern, op.coloring, ax=ax, markersize=0.6,
                 title=f"conv 5x5 on 28x28: {op.pattern.nnz} nonzeros, {op.ncolors} column colors (vs 784 JVPs)")
    return _save(fig, folder, "conv_jacobian.png")


def coloring_graph(folder: str) -> str | None:
    """The column-intersection graph of a small banded pattern with its coloring (needs igraph)."""
    import importlib.util

    if importlib.util.find_spec("igraph") is None:  # optional extra
        return None
    from ...coloring import color
    from ..coloring import plot_coloring_graph

    plt = _plt()
    n = 10
    P = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(max(0, i - 1), min(n, i + 2)):
            P[i, j] = True
    P[0, n - 1] = True
    c = color(P, "column")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    from ..spy import spy_coloring

    spy_coloring(P, c, ax=axes[0], markersize=12, title=f"pattern, {c.ncolors} column colors")
    plot_coloring_graph(P, c, ax=axes[1])
    axes[1].set_title("column-intersection graph")
    return _save(fig, folder, "coloring_graph.png")


def hessian_star(folder: str) -> str:
    """The chained Rosenbrock Hessian (B3) colored by its star coloring."""
    from ... import api
    from ...problems import rosenbrock
    from ..spy import spy_coloring

    plt = _plt()
    x = torch.rand(16, dtype=torch.float64)
    op = api.prepare_hessian(rosenbrock, x, coloring="star")
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    spy_coloring(op.pattern, op.coloring, ax=ax, markersize=9,
                 title=f"Rosenbrock Hessian: {op.ncolors} star colors = {op.ncolors} HVPs")
    return _save(fig, folder, "rosenbrock_hessian.png")


def benchmark_plot(folder: str, results: str) -> str | None:
    """Time against n for B1 from ``benchmarks/results/jacobian.json``, if it exists."""
    path = os.path.join(results, "jacobian.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        rows = [r for r in json.load(fh)["rows"] if r["problem"].startswith("B1")]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    n = [r["n"] for r in rows]
    series = [("jacfwd", "dense jacfwd", "k"), ("oneoff", "asd one-off", "C0"), ("prepared", "asd prepared", "C1"),
              ("compiled", "asd compiled", "C2")]
    for key, label, col in series:
        pts = [(r["n"], r[key]) for r in rows if r.get(key)]
        if pts:
            ax.loglog(*zip(*pts), "o-", label=label, color=col)
    for peer, col in (("casadi", "C3"), ("asdex", "C4")):
        pts = [(r["n"], r[peer]["call"]) for r in rows if isinstance(r.get(peer), dict) and r[peer].get("call")]
        if pts:
            ax.loglog(*zip(*pts), "s--", label=f"{peer} call", color=col, alpha=0.7)
    ax.set_xlabel("n (Brusselator unknowns)")
    ax.set_ylabel("seconds per Jacobian")
    ax.set_xticks(n, [f"{v:,}" for v in n])
    ax.minorticks_off()
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, folder, "brusselator_timings.png")


def _save(fig, folder: str, name: str) -> str:
    plt = _plt()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def make_figures(folder: str = "figures", results: str | None = None) -> list[str]:
    """Write every figure into ``folder``; returns the paths written."""
    from ...demo import save_figure

    if results is None:
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        results = os.path.join(here, "benchmarks", "results")
    paths = [save_figure(folder), conv_jacobian(folder), coloring_graph(folder), hessian_star(folder),
             benchmark_plot(folder, results)]
    return [p for p in paths if p]
