"""Hessian sparsity detection and star coloring: B3 (chained Rosenbrock) and a 2-D total variation.

For each size: the detection time (``asd.hessian_sparsity``, global tracing, median of repeats after
a warm-up), the star coloring time and number of colors, the pattern's nonzeros, and, where a dense
float64 Hessian is affordable, whether the pattern equals its nonzeros at a random point.

    python benchmarks/hessian_detection.py           # table + benchmarks/results/hessian_detection.json
    python benchmarks/hessian_detection.py --quick   # sizes up to 10^5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asd.coloring import check, color  # noqa: E402
from asd.detection import hessian_sparsity  # noqa: E402
from asd.problems import rosenbrock, total_variation  # noqa: E402
from asd.timing import fmt_seconds, timeit  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DENSE_LIMIT = 1100  # dense reference Hessians up to this n


def exact(f, n: int, P) -> bool | None:
    if n > DENSE_LIMIT:
        return None
    x = 0.5 + torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    D = (torch.func.hessian(f)(x).reshape(n, n) != 0).numpy()
    return bool((P.toarray() == D).all())


def one(problem: str, size: int, f, n: int, repeat: int) -> dict:
    x = torch.zeros(n, dtype=torch.float64)
    t0 = time.perf_counter()
    P = hessian_sparsity(f, x)
    first = time.perf_counter() - t0
    t_detect = timeit(lambda: hessian_sparsity(f, x), repeat=repeat, min_time=0.0, max_time=10.0)
    t0 = time.perf_counter()
    c = color(P, "star")
    t_color = time.perf_counter() - t0
    ok = check(P, c)
    return dict(problem=problem, size=size, n=n, nnz=int(P.nnz), detect_s=t_detect, detect_first_s=first,
                star_s=t_color, star_colors=int(c.ncolors), coloring_checked=bool(ok),
                one_off_s=t_detect + t_color, exact=exact(f, n, P))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="sizes up to 10^5, fewer repeats")
    p.add_argument("--out", default=os.path.join(RESULTS, "hessian_detection.json"))
    a = p.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    ros = [10**3, 10**4, 10**5] + ([] if a.quick else [10**6])
    tv = [32, 100, 316] + ([] if a.quick else [1000])
    repeat = 3 if a.quick else 5
    color(hessian_sparsity(rosenbrock, torch.zeros(10, dtype=torch.float64)), "star")  # numba warm-up
    rows = []
    for n in ros:
        rows.append(one("rosenbrock", n, rosenbrock, n, repeat))
    for N in tv:
        rows.append(one("total_variation", N, total_variation(N), N * N, repeat))

    head = f"{'problem':16s} {'n':>9s} {'nnz':>10s} {'detect':>9s} {'star':>9s} {'colors':>6s} {'one-off':>9s} {'exact':>6s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ex = "-" if r["exact"] is None else ("yes" if r["exact"] else "NO")
        print(f"{r['problem']:16s} {r['n']:9d} {r['nnz']:10d} {fmt_seconds(r['detect_s']):>9s} "
              f"{fmt_seconds(r['star_s']):>9s} {r['star_colors']:6d} {fmt_seconds(r['one_off_s']):>9s} {ex:>6s}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    meta = dict(python=platform.python_version(), torch=torch.__version__, machine=platform.machine(),
                cpus=os.cpu_count(), threads=torch.get_num_threads(), load=os.getloadavg(),
                note="detection: median after a warm-up; star: one call (kernels compiled before)")
    with open(a.out, "w") as fh:
        json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
