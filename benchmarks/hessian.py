"""Sparse Hessians: B3 (chained Rosenbrock) and a 2-D total variation, against dense AD and peers.

Prints a table and writes benchmarks/results/hessian.json. Every figure is a warm median taken by
the harness in this one run (dense torch.func.hessian included); every ratio is taken within it.
Run with ``make bench`` (installs the peers) or ``python benchmarks/hessian.py --help``.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (puts the checkout's root on sys.path)
import peers  # noqa: E402
from harness import Session, Targets, peer_value  # noqa: E402

import asd  # noqa: E402
from asd.coloring.choose import one_call_prefers_star  # noqa: E402
from asd.problems import rosenbrock, total_variation  # noqa: E402
from asd.timing import Progress, fmt_seconds, once, table  # noqa: E402

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
    # a size no row measures: the first measured row (n=1000) otherwise pays first-use costs of
    # detection and coloring at that scale (its preparation 11 ms instead of 6)
    x = torch.rand(3000, dtype=torch.float64)
    for col in ("star", "acyclic"):
        asd.sparse_hessian(fresh_rosenbrock(), x, coloring=col, cache=False)
    return time.perf_counter() - t0


def measure(s: Session, name: str, make_f, n: int, *, dense: bool, compile: bool, peer_results=()) -> dict:
    x = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    f = make_f()
    op = asd.prepare_hessian(f, x)
    star = asd.prepare_hessian(f, x, coloring="star", pattern=op.pattern)
    t = {"oneoff": s.measure(name, "asd one-off", lambda: asd.sparse_hessian(f, x, cache=False)),
         "prepared": None}
    # the same with asd's memos emptied first (colorings by pattern content, prepared plans): a problem
    # the process has not seen before
    t["oneoff_new"] = s.measure(name, "asd one-off, new problem",
                                lambda: (asd.clear_cache(), asd.sparse_hessian(f, x, cache=False)))
    first_calls = harness.settle(lambda: op(x))  # timed apart: the steady state is measured next
    t["prepared"] = s.measure(name, "asd prepared", lambda: op(x))
    # the coloring sparse_hessian(cache=False) takes: prepared for one evaluation (reuse=False)
    one_call = "star" if one_call_prefers_star(op.pattern.nnz, op.trace_info.elements) else op.coloring.problem
    r = dict(problem=name, n=n, nnz=int(op.pattern.nnz), coloring=op.coloring.problem, colors=op.ncolors,
             star_colors=star.ncolors, oneoff_coloring=one_call, detection=op.timings["detection"],
             coloring_time=op.timings["coloring"], prepared_first_calls=first_calls)
    if compile:
        compiled, first = {}, {}
        graphs = {}
        for col in dict.fromkeys(("star", op.coloring.problem)):
            opc = asd.prepare_hessian(f, x, coloring=col, compile=True)  # detected: a given pattern is probed every call
            first[col], _ = once(lambda: opc(x))
            compiled[col] = lambda opc=opc: opc(x)
            products = getattr(opc.state, "fused", None) or getattr(opc.state, "products", None)
            tracing = getattr(products, "tracing", None)
            if tracing is not None and tracing.compiled is not None:
                graphs[col] = tracing.compiled.notes
        v = s.variants(name, "asd compiled", compiled)
        t["compiled"] = v.timing
        r["compiled_coloring"], r["compile_first_call"] = v.best, first[v.best]
        r["compiled_variants"] = v.to_json()
        r["compiled_graphs"] = graphs
    calls = {"prepared": lambda: op(x)}
    if compile:
        calls["compiled"] = compiled[r["compiled_coloring"]]
    t, peer_results = s.interleave(name, calls, t, peer_results)
    d = {}
    if dense and n <= DENSE_LIMIT:
        d["dense_hessian"], Hd = s.measure_result(name, "torch.func.hessian", lambda: torch.func.hessian(f)(x))
        r["max_abs_err"] = float((op(x).to_dense() - Hd).abs().max())
    return s.row(name, r, t, d, peer_results)


def main(argv=None) -> dict:
    p = harness.arguments("hessian", __doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="B3 n (default 1e3 4e3 1e4 1e5 1e6)")
    p.add_argument("--peer-sizes", type=int, nargs="+", default=None, help="n at which the peers run (1e4 1e5)")
    p.add_argument("--tv-sizes", type=int, nargs="+", default=None, help="TV grid sides (default 64 316)")
    p.add_argument("--no-dense", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (always skipped by --quick)")
    a = harness.parse(p, argv)
    sizes = a.sizes or ([10, 100] if a.quick else [1000, 4000, 10**4, 10**5, 10**6])
    peer_sizes = a.peer_sizes or ([10] if a.quick else [10**4, 10**5])
    tv_sizes = a.tv_sizes or ([4] if a.quick else [64, 316])
    torch.set_num_threads(a.threads)
    s = Session.from_args(a)
    first = warm_up()
    bar = Progress(len(sizes) + len(tv_sizes), "hessian")
    rows = []
    for n in sizes:
        name = f"B3 n={n:g}"
        found = peers.run(s, name, "rosenbrock", n) if not a.no_peers and n in peer_sizes else []
        try:
            rows.append(measure(s, name, fresh_rosenbrock, n, dense=not a.no_dense,
                                compile=not (a.no_compile or a.quick) and n <= 10**5, peer_results=found))
        finally:
            peers.close(found)
        bar.step(name)
    for N in tv_sizes:
        rows.append(measure(s, f"TV {N}x{N}", lambda: total_variation(N), N * N, dense=not a.no_dense, compile=False))
        bar.step(f"TV {N}x{N}")
    return harness.report(s, "issue 4", rows, table([cells(r) for r in rows], COLUMNS), targets(rows), first_call=first, out=a.out)


COLUMNS = [("problem", "problem"), ("nnz", "nnz"), ("col", "colors"), ("star", "star colors"),
           ("det", "detect"), ("ct", "color"), ("one", "one-off"), ("prep", "prepared"),
           ("comp", "compiled"), ("dense", "dense hessian"), ("x", "dense/prepared"),
           *harness.PEER_COLUMNS]


def cells(r: dict) -> dict:
    """The table cells of one JSON row."""
    x = r["ratios"]
    return dict(problem=r["problem"], nnz=r["nnz"], col=f"{r['colors']} {r['coloring']}",
                star=r["star_colors"], det=fmt_seconds(r["detection"]), ct=fmt_seconds(r["coloring_time"]),
                one=fmt_seconds(r["oneoff"]) + (f" ({r['oneoff_coloring']})" if r.get("oneoff_coloring", r["coloring"])
                                                 != r["coloring"] else ""),
                prep=fmt_seconds(r["prepared"]),
                comp=(f"{fmt_seconds(r['compiled'])} ({r['compiled_coloring']})" if r.get("compiled") else "-"),
                dense=fmt_seconds(r.get("dense_hessian")),
                x=harness.fmt_ratio(x, "dense_hessian/prepared"),
                **harness.peer_cells(r))


def targets(rows) -> list[dict]:
    t = Targets()
    add = t.add

    b3 = [r for r in rows if r["problem"].startswith("B3")]
    if b3:
        add("B3: 3 star colors at every n", all(r["star_colors"] == 3 for r in b3), [r["star_colors"] for r in b3])
    for r in b3:
        x = r["ratios"]
        if r["n"] == 4000 and "dense_hessian/prepared" in x:
            add("n=4000 prepared >= 500x faster than dense torch.func.hessian", x["dense_hessian/prepared"] >= 500,
                f"{x['dense_hessian/prepared']:.0f}x")
        if r["n"] == 10**5:
            peer_oneoff = [x[k] for k in ("casadi.oneoff/oneoff", "asdex.oneoff/oneoff") if k in x]
            if peer_oneoff:
                add("n=1e5 one-off >= 5x faster than the faster peer's best variant", min(peer_oneoff) >= 5,
                    f"{min(peer_oneoff):.1f}x")
            for who in ("casadi", "asdex"):
                calls = [x[k] for k in (f"{who}.call/prepared", f"{who}.call/compiled") if k in x]
                if calls:
                    add(f"n=1e5 prepared call (eager or compiled) faster than {peer_value(r, who, 'label')}'s",
                        max(calls) > 1, f"{max(calls):.2f}x")
            if "asdex.call/compiled" in x:  # issue 15
                v = x["asdex.call/compiled"]
                add(f"n=1e5 compiled call >= 2x faster than {peer_value(r, 'asdex', 'label')}'s", v >= 2, f"{v:.2f}x")
        if r["n"] == 10**6:
            add("n=1e6 one-off < 3 s", r["oneoff"] < 3, fmt_seconds(r["oneoff"]))
            add("n=1e6 one-off < 0.5 s (issue 15)", r["oneoff"] < 0.5,
                f"{fmt_seconds(r['oneoff'])} (memos emptied before each call: {fmt_seconds(r['oneoff_new'])})")
    return t.items


if __name__ == "__main__":
    main()
