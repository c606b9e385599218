"""Sparse Jacobians: B1 (Brusselator) and B2 (convolution) against dense AD and the peers.

Prints a table and writes benchmarks/results/jacobian.json. Every ratio is taken within this one
run. Run with ``make bench`` (installs the peers), or ``python benchmarks/jacobian.py --help``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import asd  # noqa: E402
import peers  # noqa: E402
from common import RESULTS, Targets, peer, report  # noqa: E402
from asd.problems import brusselator, brusselator_input, conv_layer  # noqa: E402
from asd.timing import Progress, fmt_seconds, once, table, timeit  # noqa: E402

DENSE_LIMIT = 8192


def warm_up() -> float:
    t0 = time.perf_counter()
    f, x = brusselator(4), brusselator_input(4)
    asd.sparse_jacobian(f, x, cache=False)
    asd.prepare_jacobian(f, x, mode="forward")(x)
    return time.perf_counter() - t0


def measure(name: str, f, x, *, dense: bool, compile: bool) -> dict:
    n = x.numel()
    t_oneoff, J = once(lambda: asd.sparse_jacobian(f, x, cache=False))
    op = asd.prepare_jacobian(f, x)
    r = dict(problem=name, n=n, m=op.pattern.shape[0], nnz=int(op.pattern.nnz), colors=op.ncolors, mode=op.mode,
             detection=op.timings["detection"], coloring=op.timings["coloring"], oneoff=t_oneoff,
             prepared=timeit(lambda: op(x)))
    if compile:
        opc = asd.prepare_jacobian(f, x, compile=True)
        r["compile_first_call"], _ = once(lambda: opc(x))
        r["compiled"] = timeit(lambda: opc(x))
        r["compile_failed"] = opc._products[next(iter(opc._products))].compile_failed
    if dense and n <= DENSE_LIMIT:
        r["jacfwd"], Jd = once(lambda: torch.func.jacfwd(f)(x))
        r["jacrev"], _ = once(lambda: torch.func.jacrev(f)(x))
        r["max_abs_err"] = float((J.to_dense().reshape(Jd.shape) - Jd).abs().max())
    return r


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--peer-sizes", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--no-dense", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (peers run single-threaded)")
    p.add_argument("--out", default=os.path.join(RESULTS, "jacobian.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)

    first = warm_up()
    rows = []
    jobs = [("B1", N) for N in a.sizes] + [("B2", "a"), ("B2", "b")]
    bar = Progress(len(jobs), "jacobian")
    for kind, size in jobs:
        if kind == "B1":
            f, x = brusselator(size), brusselator_input(size)
            r = measure(f"B1 N={size}", f, x, dense=not a.no_dense, compile=not a.no_compile)
            if not a.no_peers and size in a.peer_sizes:
                r["casadi"] = peers.casadi_brusselator(size, "MX")
                r["asdex"] = peers.asdex("brusselator", size)
        else:
            f, x = conv_layer(size)
            r = measure(f"B2{size}", f, x, dense=not a.no_dense, compile=False)
        rows.append(r)
        bar.step(r["problem"])

    return report("jacobian", "issue 2", rows, render(rows), targets(rows), first_call=first, threads=a.threads,
                  out=a.out)

def render(rows) -> str:
    out = []
    for r in rows:
        d = dict(problem=r["problem"], n=r["n"], colors=r["colors"], mode=r["mode"],
                 det=fmt_seconds(r["detection"]), col=fmt_seconds(r["coloring"]), oneoff=fmt_seconds(r["oneoff"]),
                 prep=fmt_seconds(r["prepared"]), comp=fmt_seconds(r.get("compiled")),
                 fwd=fmt_seconds(r.get("jacfwd")), rev=fmt_seconds(r.get("jacrev")),
                 xfwd=f"{r['jacfwd'] / r['prepared']:,.0f}x" if r.get("jacfwd") else "-",
                 xone=f"{r['jacfwd'] / r['oneoff']:,.0f}x" if r.get("jacfwd") else "-",
                 ca1=fmt_seconds(peer(r, "casadi", "oneoff")), ca2=fmt_seconds(peer(r, "casadi", "call")),
                 ax1=fmt_seconds(peer(r, "asdex", "oneoff")), ax2=fmt_seconds(peer(r, "asdex", "call")))
        out.append(d)
    return table(out, [("problem", "problem"), ("n", "n"), ("colors", "colors"), ("mode", "mode"),
                       ("det", "detect"), ("col", "color"), ("oneoff", "one-off"), ("prep", "prepared"),
                       ("comp", "compiled"), ("fwd", "jacfwd"), ("rev", "jacrev"), ("xfwd", "jacfwd/prepared"),
                       ("xone", "jacfwd/one-off"), ("ca1", "CasADi one-off"), ("ca2", "CasADi call"),
                       ("ax1", "asdex one-off"), ("ax2", "asdex call")])


def targets(rows) -> list[dict]:
    by = {r["problem"]: r for r in rows}
    t = Targets()
    add = t.add

    r = by.get("B1 N=64")
    if r:
        add("N=64 colors <= 12", r["colors"] <= 12, r["colors"])
        if r.get("jacfwd"):
            add("N=64 prepared >= 500x faster than jacfwd", r["jacfwd"] / r["prepared"] >= 500,
                f"{r['jacfwd'] / r['prepared']:.0f}x")
            add("N=64 one-off >= 50x faster than jacfwd", r["jacfwd"] / r["oneoff"] >= 50,
                f"{r['jacfwd'] / r['oneoff']:.0f}x")
        for who in ("casadi", "asdex"):
            po, pc = peer(r, who, "oneoff"), peer(r, who, "call")
            if po is not None:
                add(f"N=64 one-off faster than {who}'s", r["oneoff"] < po, f"{po / r['oneoff']:.2f}x")
            if pc is not None and r.get("compiled"):
                add(f"N=64 compiled call faster than {who}'s call", r["compiled"] < pc, f"{pc / r['compiled']:.2f}x")
    r = by.get("B1 N=256")
    if r:
        add("N=256 detection < 0.5 s", r["detection"] < 0.5, fmt_seconds(r["detection"]))
    return t.items


if __name__ == "__main__":
    main()
