"""``python -m asd demo``: sparse Jacobians of the 2-D Brusselator next to dense AD."""

from __future__ import annotations

import argparse
import os
import time

import torch

from . import api
from .problems import brusselator, brusselator_input
from .timing import Policy, Progress, fmt_seconds, measure, ratio, table

DENSE_LIMIT = 8192  # largest n for which the dense Jacobian is timed (about 5 s a call with jacfwd)
POLICY = Policy(warmup=1, repeat=5, min_time=0.02, budget=2.0)  # warm medians; slow calls get fewer samples


def warm_up() -> float:
    """Load/compile the Numba kernels and initialise torch.func once; returns the seconds taken."""
    t0 = time.perf_counter()
    f = brusselator(4)
    api.sparse_jacobian(f, brusselator_input(4), cache=False)
    return time.perf_counter() - t0


def run(sizes=(16, 32, 64, 128), dense_limit: int = DENSE_LIMIT, figures: str = "figures") -> list[dict]:
    first = warm_up()
    print(f"first call of the session (Numba kernels loaded from cache or compiled, torch.func set up): "
          f"{fmt_seconds(first)}\n")
    rows = []
    progress = Progress(len(sizes), "brusselator")
    for N in sizes:
        x = brusselator_input(N)
        n = x.numel()
        f = brusselator(N)  # a fresh function: nothing cached
        t_oneoff = measure(lambda: api.sparse_jacobian(f, x, cache=False), POLICY).median
        op = api.prepare_jacobian(f, x)
        t_call = measure(lambda: op(x), POLICY).median
        row = dict(N=N, n=n, nnz=op.pattern.nnz, colors=op.ncolors, mode=op.mode,
                   detect=fmt_seconds(op.timings["detection"]), color=fmt_seconds(op.timings["coloring"]),
                   oneoff=fmt_seconds(t_oneoff), prepared=fmt_seconds(t_call))
        if n <= dense_limit:
            dense = {}
            t_dense = measure(lambda: dense.update(J=torch.func.jacfwd(f)(x)), POLICY).median
            err = (op(x).to_dense() - dense["J"]).abs().max().item()
            row.update(dense=fmt_seconds(t_dense), speedup_prepared=f"{ratio(t_dense, t_call):,.1f}x",
                       speedup_oneoff=f"{ratio(t_dense, t_oneoff):,.1f}x", max_err=f"{err:.1e}")
        rows.append(row)
        progress.step(f"N={N}")
    print()
    print(table(rows, [("N", "N"), ("n", "n"), ("nnz", "nnz"), ("colors", "colors"), ("mode", "mode"),
                       ("detect", "detection"), ("color", "coloring"), ("oneoff", "one-off"),
                       ("prepared", "prepared call"), ("dense", "dense jacfwd"),
                       ("speedup_prepared", "vs dense (prepared)"), ("speedup_oneoff", "vs dense (one-off)"),
                       ("max_err", "max |J - J_dense|")]))
    path = save_figure(figures)
    print(f"\nspy plot of the Brusselator pattern colored by its coloring: {path}")
    return rows


def save_figure(folder: str, N: int = 6) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .viz.spy import spy_coloring

    x = brusselator_input(N)
    op = api.prepare_jacobian(brusselator(N), x, mode="forward")
    fig, ax = plt.subplots(figsize=(6.5, 6.5))
    spy_coloring(op.pattern, op.coloring, ax=ax, markersize=4,
                 title=f"Brusselator N={N}: {op.pattern.nnz} nonzeros, {op.ncolors} column colors")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "brusselator_coloring.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m asd demo", description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--dense-limit", type=int, default=DENSE_LIMIT)
    p.add_argument("--figures", default="figures")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: on a small shared machine more threads oversubscribe)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    run(a.sizes, a.dense_limit, a.figures)
