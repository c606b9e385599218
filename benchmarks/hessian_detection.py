"""Hessian sparsity detection and star coloring: B3 (chained Rosenbrock) and a 2-D total variation.

For each size: the detection time (``asd.hessian_sparsity``, global tracing) and the star coloring
time, both warm medians taken by the harness, the number of star colors, the pattern's nonzeros,
and, where a dense float64 Hessian is affordable, whether the pattern equals its nonzeros at a
random point.

    python benchmarks/hessian_detection.py           # table + benchmarks/results/hessian_detection.json
    python benchmarks/hessian_detection.py --quick   # tiny sizes, JSON into a temporary folder
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (puts the checkout's root on sys.path)
from harness import Session  # noqa: E402

from asd.coloring import check, color  # noqa: E402

import asd.coloring  # noqa: E402

# time the coloring itself: asd keeps colorings of recent patterns by content, and a repeated call
# would measure that memo
asd.coloring.MEMO_ENTRIES = 0
from asd.detection import hessian_sparsity  # noqa: E402
from asd.problems import rosenbrock, total_variation  # noqa: E402
from asd.timing import fmt_seconds, once, table  # noqa: E402

DENSE_LIMIT = 1100  # dense reference Hessians up to this n


def exact(f, n: int, P) -> bool | None:
    if n > DENSE_LIMIT:
        return None
    x = 0.5 + torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    D = (torch.func.hessian(f)(x).reshape(n, n) != 0).numpy()
    return bool((P.toarray() == D).all())


def one(s: Session, problem: str, size: int, f, n: int) -> dict:
    case = f"{problem} {size}"
    x = torch.zeros(n, dtype=torch.float64)
    first, P = once(lambda: hessian_sparsity(f, x))
    t_detect = s.measure(case, "asd.hessian_sparsity", lambda: hessian_sparsity(f, x))
    t_color = s.measure(case, "asd.color star", lambda: color(P, "star"))
    c = color(P, "star")
    return dict(problem=problem, size=size, n=n, nnz=int(P.nnz), detect_s=t_detect.median, detect_first_s=first,
                star_s=t_color.median, star_colors=int(c.ncolors), coloring_checked=bool(check(P, c)),
                one_off_s=t_detect.median + t_color.median, exact=exact(f, n, P),
                timings=harness.timings_json({"detect": t_detect, "star": t_color}))


def main(argv=None) -> dict:
    a = harness.parse(harness.arguments("hessian_detection", __doc__.splitlines()[0]), argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(a.threads)
    s = Session.from_args(a)
    ros = [10, 100] if a.quick else [10**3, 10**4, 10**5, 10**6]
    tv = [4] if a.quick else [32, 100, 316, 1000]
    color(hessian_sparsity(rosenbrock, torch.zeros(10, dtype=torch.float64)), "star")  # numba warm-up
    rows = [one(s, "rosenbrock", n, rosenbrock, n) for n in ros]
    rows += [one(s, "total_variation", N, total_variation(N), N * N) for N in tv]
    print(table([dict(r, det=fmt_seconds(r["detect_s"]), star=fmt_seconds(r["star_s"]),
                      one=fmt_seconds(r["one_off_s"]), ok="-" if r["exact"] is None else ("yes" if r["exact"] else "NO"))
                 for r in rows],
                [("problem", "problem"), ("n", "n"), ("nnz", "nnz"), ("det", "detect"), ("star", "star"),
                 ("star_colors", "colors"), ("one", "one-off"), ("ok", "exact")]))
    meta = dict(harness.machine(), note="detection and star coloring: warm medians (harness policy)")
    return harness.write(s, dict(benchmark="hessian_detection", meta=meta, rows=rows), a.out)


if __name__ == "__main__":
    main()
