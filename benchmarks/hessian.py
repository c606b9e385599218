"""Sparse Hessians: B3 (chained Rosenbrock) and a 2-D total variation, against dense AD and peers.

Prints a table and writes benchmarks/results/hessian.json; every ratio is taken within this run.
Run with ``make bench`` (installs the peers) or ``python benchmarks/hessian.py --help``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import asd  # noqa: E402
import peers  # noqa: E402
from common import RESULTS, Targets, peer, report  # noqa: E402
from asd.problems import rosenbrock, total_variation  # noqa: E402
from asd.timing import Progress, fmt_seconds, once, table, timeit  # noqa: E402

DENSE_LIMIT = 4000


def fresh_rosenbrock():
    def f(x):
        return rosenbrock(x)
    return f


def warm_up() -> float:
    t0 = time.perf_counter()
    x = torch.rand(10, dtype=torch.float64)
    for col in ("star", "acyclic"):
        asd.sparse_hessian(fresh_rosenbrock(), x, coloring=col, cache=False)
    asd.gradient_and_hessian(fresh_rosenbrock(), x, cache=False)
    return time.perf_counter() - t0


def measure(name: str, make_f, n: int, *, dense: bool, compile: bool, big: bool) -> dict:
    x = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    f = make_f()
    t_oneoff, H = once(lambda: asd.sparse_hessian(f, x, cache=False))
    op = asd.prepare_hessian(f, x)
    star = asd.prepare_hessian(f, x, coloring="star", pattern=op.pattern)
    r = dict(problem=name, n=n, nnz=int(op.pattern.nnz), coloring=op.coloring.problem, colors=op.ncolors,
             star_colors=star.ncolors, detection=op.timings["detection"], coloring_time=op.timings["coloring"],
             oneoff=t_oneoff, prepared=timeit(lambda: op(x), max_time=2 if big else 5))
    if compile:
        best = None
        for col in ("star", op.coloring.problem):
            opc = asd.prepare_hessian(f, x, coloring=col, compile=True, pattern=op.pattern)
            first, _ = once(lambda: opc(x))
            t = timeit(lambda: opc(x), max_time=2 if big else 5)
            if best is None or t < best[1]:
                best = (col, t, first)
        r["compiled_coloring"], r["compiled"], r["compile_first_call"] = best
    if dense and n <= DENSE_LIMIT:
        r["dense_hessian"], Hd = once(lambda: torch.func.hessian(f)(x))
        r["max_abs_err"] = float((H.to_dense() - Hd).abs().max())
    return r


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 10**4, 10**5, 10**6])
    p.add_argument("--peer-sizes", type=int, nargs="+", default=[10**4, 10**5])
    p.add_argument("--tv-sizes", type=int, nargs="+", default=[64, 316])
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--no-dense", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=os.path.join(RESULTS, "hessian.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    first = warm_up()
    jobs = [("B3", n) for n in a.sizes] + [("TV", N) for N in a.tv_sizes]
    bar = Progress(len(jobs), "hessian")
    rows = []
    for kind, size in jobs:
        if kind == "B3":
            r = measure(f"B3 n={size:g}", fresh_rosenbrock, size, dense=not a.no_dense,
                        compile=not a.no_compile and size <= 10**5, big=size >= 10**6)
            if not a.no_peers and size in a.peer_sizes:
                r["casadi"] = peers.casadi_rosenbrock_hessian(size)
                r["asdex"] = peers.asdex("rosenbrock", size)
        else:
            r = measure(f"TV {size}x{size}", lambda: total_variation(size), size * size, dense=not a.no_dense,
                        compile=False, big=False)
        rows.append(r)
        bar.step(r["problem"])
    return report("hessian", "issue 4", rows, render(rows), targets(rows), first_call=first, threads=a.threads,
                  out=a.out)

def render(rows) -> str:
    out = []
    for r in rows:
        out.append(dict(problem=r["problem"], nnz=r["nnz"], col=f"{r['colors']} {r['coloring']}",
                        star=r["star_colors"], det=fmt_seconds(r["detection"]), ct=fmt_seconds(r["coloring_time"]),
                        one=fmt_seconds(r["oneoff"]), prep=fmt_seconds(r["prepared"]),
                        comp=(f"{fmt_seconds(r['compiled'])} ({r['compiled_coloring']})" if r.get("compiled") else "-"),
                        dense=fmt_seconds(r.get("dense_hessian")),
                        x=f"{r['dense_hessian'] / r['prepared']:,.0f}x" if r.get("dense_hessian") else "-",
                        ca1=fmt_seconds(peer(r, "casadi", "oneoff")), ca2=fmt_seconds(peer(r, "casadi", "call")),
                        ax1=fmt_seconds(peer(r, "asdex", "oneoff")), ax2=fmt_seconds(peer(r, "asdex", "call"))))
    return table(out, [("problem", "problem"), ("nnz", "nnz"), ("col", "colors"), ("star", "star colors"),
                       ("det", "detect"), ("ct", "color"), ("one", "one-off"), ("prep", "prepared"),
                       ("comp", "compiled"), ("dense", "dense hessian"), ("x", "dense/prepared"),
                       ("ca1", "CasADi one-off"), ("ca2", "CasADi call"), ("ax1", "asdex one-off"),
                       ("ax2", "asdex call")])


def targets(rows) -> list[dict]:
    t = Targets()
    add = t.add

    b3 = [r for r in rows if r["problem"].startswith("B3")]
    if b3:
        add("B3: 3 star colors at every n", all(r["star_colors"] == 3 for r in b3), [r["star_colors"] for r in b3])
    for r in b3:
        if r["n"] == 4000 and r.get("dense_hessian"):
            add("n=4000 prepared >= 500x faster than dense torch.func.hessian", r["dense_hessian"] / r["prepared"] >= 500,
                f"{r['dense_hessian'] / r['prepared']:.0f}x")
        if r["n"] == 10**5:
            peer_oneoffs = [v for v in (peer(r, "casadi", "oneoff"), peer(r, "asdex", "oneoff")) if v is not None]
            if peer_oneoffs:
                add("n=1e5 one-off >= 5x faster than the faster peer", min(peer_oneoffs) / r["oneoff"] >= 5,
                    f"{min(peer_oneoffs) / r['oneoff']:.1f}x")
            best = min(v for v in (r["prepared"], r.get("compiled", math.inf)))
            for who in ("casadi", "asdex"):
                pc = peer(r, who, "call")
                if pc is not None:
                    add(f"n=1e5 prepared call faster than {who}'s", best < pc, f"{pc / best:.2f}x")
        if r["n"] == 10**6:
            add("n=1e6 one-off < 3 s", r["oneoff"] < 3, fmt_seconds(r["oneoff"]))
    return t.items


if __name__ == "__main__":
    main()
