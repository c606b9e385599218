"""The guide's demonstration: ASD against dense AD as the problem grows, timed by :mod:`asd.timing`.

Three problems of :mod:`asd.problems`: the Brusselator Jacobian, the convolution layer's Jacobian
(its 5x5 filter applied to ever larger images) and the chained Rosenbrock Hessian. At every size,
asd one-off (detection, coloring and evaluation, no cache), asd prepared (evaluation only) and the
dense baselines of :mod:`torch.func` are timed warm with :func:`asd.timing.measure`, and asd's
result is checked against the dense one.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ... import api
from ...problems import brusselator, brusselator_input, conv_layer, rosenbrock
from ...timing import QUICK, Policy, measure
from ..palette import PALETTE

#: the default policy: few short samples, so the whole guide stays well under a minute; three warm-up
#: calls, since TorchScript (used by asd's decompression) optimizes a function on its second and third calls.
POLICY = Policy(warmup=3, repeat=3, min_time=0.005, budget=0.25)

#: the series of one plot: key in a row, legend label, palette color, line style.
SERIES: tuple[tuple[str, str, str, str], ...] = (
    ("dense_forward", "dense forward (jacfwd)", PALETTE[8], "s--"),
    ("dense_reverse", "dense reverse (jacrev)", PALETTE[9], "D--"),
    ("asd_oneoff", "asd one-off", PALETTE[1], "o-"),
    ("asd_prepared", "asd prepared", PALETTE[0], "o-"),
)


@dataclass(frozen=True)
class Case:
    """One size of one problem: the function, the input, and how its size is reported."""

    size: int
    f: Callable[[torch.Tensor], torch.Tensor]
    x: torch.Tensor


@dataclass(frozen=True)
class Problem:
    """A problem of the demonstration: its cases and whether it is a Hessian (scalar ``f``)."""

    name: str
    title: str
    size_label: str
    hessian: bool
    cases: Callable[[Sequence[int]], list[Case]]
    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...]


def _brusselator_cases(grid: Sequence[int]) -> list[Case]:
    return [Case(2 * N * N, brusselator(N), brusselator_input(N)) for N in grid]


def _conv_cases(images: Sequence[int]) -> list[Case]:
    f, _ = conv_layer("a")
    g = torch.Generator().manual_seed(0)
    return [Case(s * s, f, torch.randn(1, 1, s, s, dtype=torch.float64, generator=g)) for s in images]


def _rosenbrock_cases(sizes: Sequence[int]) -> list[Case]:
    return [Case(n, rosenbrock, torch.linspace(-1.0, 1.5, n, dtype=torch.float64)) for n in sizes]


PROBLEMS: tuple[Problem, ...] = (
    Problem("brusselator", "Brusselator Jacobian", "n = 2 N² unknowns", False, _brusselator_cases,
            (4, 8, 12, 16, 24, 32), (4, 8)),
    Problem("conv_layer", "5x5 convolution layer Jacobian", "n = input pixels", False, _conv_cases,
            (12, 16, 20, 24, 32), (12, 16)),
    Problem("rosenbrock", "chained Rosenbrock Hessian", "n unknowns", True, _rosenbrock_cases,
            (16, 64, 256, 1024), (16, 64)),
)


def _dense(f: Callable, x: torch.Tensor, hessian: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """The dense baselines, each returning the matrix flattened to (m, n)."""
    n = x.numel()
    if hessian:
        fwd, rev = torch.func.hessian(f), torch.func.jacrev(torch.func.jacrev(f))
    else:
        fwd, rev = torch.func.jacfwd(f), torch.func.jacrev(f)
    return {"dense_forward": lambda: fwd(x).reshape(-1, n), "dense_reverse": lambda: rev(x).reshape(-1, n)}


def _asd(f: Callable, x: torch.Tensor, hessian: bool):
    """asd one-off (no cache: detection and coloring every call) and the prepared operator."""
    if hessian:
        op = api.prepare_hessian(f, x)
        oneoff = lambda: api.sparse_hessian(f, x, cache=False)  # noqa: E731
    else:
        op = api.prepare_jacobian(f, x)
        oneoff = lambda: api.sparse_jacobian(f, x, cache=False)  # noqa: E731
    return op, {"asd_oneoff": oneoff, "asd_prepared": lambda: op(x)}


def time_case(case: Case, hessian: bool, policy: Policy) -> dict:
    """Time asd (one-off, prepared) and dense AD on one case, and check asd against dense AD.

    Returns
    -------
    dict
        ``size``, ``m``, ``nnz``, ``ncolors``, the median seconds of every series of
        :data:`SERIES`, and ``max_error`` (max |asd - dense forward|).
    """
    with warnings.catch_warnings():  # the smallest cases are meant to show where compression does not pay
        warnings.simplefilter("ignore", RuntimeWarning)
        op, fns = _asd(case.f, case.x, hessian)
        return _time_fns(case, op, fns, hessian, policy)


def _time_fns(case: Case, op, fns: dict, hessian: bool, policy: Policy) -> dict:
    fns.update(_dense(case.f, case.x, hessian))
    row = dict(size=case.size, m=int(op.pattern.shape[0]), nnz=int(op.pattern.nnz), ncolors=op.ncolors)
    for key, fn in fns.items():
        timing = measure(fn, policy)
        row[key], row[key + "_min"] = timing.median, timing.min
    dense = fns["dense_forward"]()
    row["max_error"] = float((op(case.x).to_dense() - dense).abs().max())
    return row


def break_even(rows: list[dict], key: str) -> int | None:
    """The smallest size from which ``key`` beats both dense modes at every larger size measured.

    ``None`` when asd is slower at the largest size; the smallest size measured when asd is
    faster everywhere (the break-even then lies at or below the range).
    """
    wins = [r[key] < min(r["dense_forward"], r["dense_reverse"]) for r in rows]
    if not wins or not wins[-1]:
        return None
    k = len(wins)
    while k > 0 and wins[k - 1]:
        k -= 1
    return rows[k]["size"]


def run_problem(problem: Problem, *, quick: bool = False, policy: Policy | None = None) -> dict:
    """Every size of one problem: its rows and the break-even sizes of asd one-off and prepared."""
    policy = policy or (QUICK if quick else POLICY)
    rows = [time_case(c, problem.hessian, policy) for c in problem.cases(problem.quick_sizes if quick
                                                                         else problem.sizes)]
    return dict(name=problem.name, title=problem.title, size_label=problem.size_label, hessian=problem.hessian,
                rows=rows, break_even={k: break_even(rows, k) for k in ("asd_oneoff", "asd_prepared")})


def data_demonstration(quick: bool = False) -> dict:
    """The demonstration's numbers: every problem of :data:`PROBLEMS`, JSON-ready.

    Parameters
    ----------
    quick : bool
        Two small sizes per problem and :data:`asd.timing.QUICK` (for tests).
    """
    policy = QUICK if quick else POLICY
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the benchmark harness does by default: steadier on a shared machine
    try:
        problems = [run_problem(p, quick=quick, policy=policy) for p in PROBLEMS]
    finally:
        torch.set_num_threads(threads)
    return dict(policy=policy.to_json(), quick=quick, torch=torch.__version__, threads=1, problems=problems)


def write_json(data: dict, path: str) -> str:
    """Write the demonstration's numbers next to its figure; returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
    return path


def fig_demonstration(data: dict):
    """Seconds per Jacobian (Hessian) against the size, one panel per problem, break-even marked."""
    from .draw import plt

    problems = data["problems"]
    fig, axes = plt().subplots(1, len(problems), figsize=(4.6 * len(problems), 4.0))
    for ax, p in zip(axes, problems):
        _panel(ax, p)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, -0.04))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _panel(ax, p: dict) -> None:
    sizes = [r["size"] for r in p["rows"]]
    for key, label, color, style in SERIES:
        ax.loglog(sizes, [r[key] for r in p["rows"]], style, color=color, label=label, markersize=4)
    for key, name, color, height in (("asd_prepared", "prepared", PALETTE[0], 0.97),
                                     ("asd_oneoff", "one-off", PALETTE[1], 0.62)):
        _mark_break_even(ax, p["break_even"][key], sizes[0], name, color, height)
    ax.set_title(p["title"], fontsize=10)
    ax.set_xlabel(p["size_label"], fontsize=9)
    ax.set_ylabel("seconds per call (median)", fontsize=9)
    ax.set_xticks(sizes, [f"{s:,}" for s in sizes], fontsize=8)
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def _mark_break_even(ax, n: int | None, smallest: int, name: str, color: str, height: float) -> None:
    if n is None:
        return
    ax.axvline(n, color=color, linestyle=":", linewidth=1.4)
    where = f"n ≤ {n:,}" if n == smallest else f"n = {n:,}"
    left = n > smallest  # label on the line's left, inside the axes, unless the line is at the left edge
    ax.annotate(f"break-even\n{name}: {where}", xy=(n, height), xycoords=("data", "axes fraction"),
                xytext=(-4 if left else 4, 0), textcoords="offset points", ha="right" if left else "left",
                va="top", fontsize=8, color=color,
                bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.8))
