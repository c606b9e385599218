"""Coloring benchmark: color counts vs ColPack, targets, and speed vs igraph.

Run:  python benchmarks/coloring.py [--quick]
Prints tables and writes benchmarks/results/coloring.json (``--quick``: tiny sizes, no cold-compile
subprocesses, JSON into a temporary folder).

* ColPack's sample matrices (tests/data/matrices): asd's colors per ordering and for
  order="best" against ColPack's best ordering (tests/data/colpack_reference.json, shared with
  the tests; measured single-threaded, EXPECTED.md section 3).
* Targets: SMB Jacobian (8 column, <= 10 bidirectional), Brusselator N = 128 (<= 11 column),
  2-D Laplacian (5 star, <= 4 acyclic), banded identities.
* Speed: 10^6-vertex 2-D 5-point Laplacian, asd star / acyclic (end to end: pattern in,
  Coloring with its decompression plan out) vs igraph's Graph.vertex_coloring_greedy on the
  same graph in the same run (graph construction excluded); 3,200-vertex arrowhead Hessian.
  Numba first-call compile time is measured separately, in a subprocess with an empty
  NUMBA_CACHE_DIR; every steady-state time is a warm median taken by the harness.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (puts the checkout's root on sys.path)
from harness import Session  # noqa: E402

import asd.coloring as C  # noqa: E402
from asd.coloring.mtx import read_pattern  # noqa: E402
from asd.problems import arrowhead_pattern as arrowhead, banded_pattern as banded  # noqa: E402
from asd.timing import fmt_seconds as fmt  # noqa: E402

import asd.coloring  # noqa: E402

# time the coloring itself: asd keeps colorings of recent patterns by content, and a repeated call
# would measure that memo
asd.coloring.MEMO_ENTRIES = 0

ROOT = pathlib.Path(harness.ROOT)
DATA = ROOT / "tests" / "data" / "matrices"
COLPACK_BEST = json.loads((ROOT / "tests" / "data" / "colpack_reference.json").read_text())["matrices"]
PROBLEMS = ("column", "row", "star", "acyclic", "bidirectional")
QUICK_MATRICES = ("mymatrix1", "jac_pat")  # one square, one rectangular


# ---------------------------------------------------------------------------------- patterns
def lap2d(N):
    I = sp.identity(N, format="csr", dtype=np.int8)
    T = sp.diags([1, 1, 1], [-1, 0, 1], shape=(N, N), format="csr", dtype=np.int8)
    A = sp.csr_array((sp.kron(I, T) + sp.kron(T, I)).astype(bool))
    A.sort_indices()
    return A


def brusselator(N):
    """Jacobian pattern of the 2-D Brusselator (PEERS.md B1): periodic 5-point stencil on u and v,
    u and v coupled pointwise; x = [u; v] row-major, 6 nonzeros per row."""
    i, j = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    i, j = i.ravel(), j.ravel()
    k = i * N + j
    nb = [k, ((i + 1) % N) * N + j, ((i - 1) % N) * N + j, i * N + (j + 1) % N, i * N + (j - 1) % N]
    M = N * N
    rows, cols = [], []
    for off_r, off_c in ((0, 0), (M, M)):  # du depends on u-stencil, dv on v-stencil
        for c in nb:
            rows.append(k + off_r), cols.append(c + off_c)
    rows += [k, k + M]  # du depends on v(i,j), dv on u(i,j)
    cols += [k + M, k]
    r, c = np.concatenate(rows), np.concatenate(cols)
    return sp.csr_array((np.ones(r.size, dtype=bool), (r, c)), shape=(2 * M, 2 * M))


COMPILE_SNIPPET = r"""
import time, json, numpy as np, scipy.sparse as sp, sys
sys.path.insert(0, %r)
t0 = time.perf_counter(); import asd.coloring as C; t_import = time.perf_counter() - t0
C.MEMO_ENTRIES = 0  # the second call colors again
A = sp.random(30, 30, density=0.1, random_state=0, format="csr"); A = (A + A.T).tocsr()
res = {"import_s": t_import}
for problem in ["column", "row", "star", "acyclic", "bidirectional"]:
    t = time.perf_counter(); C.color(A, problem, "natural"); first = time.perf_counter() - t
    t = time.perf_counter(); C.color(A, problem, "natural"); second = time.perf_counter() - t
    res[problem] = {"first_call_s": first, "steady_s": second}
t = time.perf_counter()
for o in ["largest_first", "smallest_last", "incidence_degree", "dynamic_largest_first"]:
    C.color(A, "column", o)
res["orders_first_call_s"] = time.perf_counter() - t
r = C.color(A, "acyclic"); B = np.zeros(r.plan.compressed_shape)
t = time.perf_counter(); r.decompress(B); res["substitution_first_call_s"] = time.perf_counter() - t
print(json.dumps(res))
"""


def compile_times():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NUMBA_CACHE_DIR=d)
        cold = subprocess.run([sys.executable, "-c", COMPILE_SNIPPET % str(ROOT)], env=env,
                              capture_output=True, text=True, check=True)
        warm = subprocess.run([sys.executable, "-c", COMPILE_SNIPPET % str(ROOT)], env=env,
                              capture_output=True, text=True, check=True)
    return {"cold_cache": json.loads(cold.stdout), "warm_disk_cache": json.loads(warm.stdout)}


# -------------------------------------------------------------------------------------- main
def colpack_table(quick: bool) -> list[dict]:
    print("\n== colors: asd (per order / best) vs ColPack best ordering ==")
    print(f"{'matrix':18s} {'problem':14s} " + " ".join(f"{o[:6]:>6s}" for o in C.ORDERS) + "   best  ColPack")
    table = []
    for name, refs in COLPACK_BEST.items():
        if quick and name not in QUICK_MATRICES:
            continue
        A = read_pattern(DATA / f"{name}.mtx")
        for problem, ref in refs.items():
            if name == "smb_jac_pattern" and problem == "row":
                per = {o: C.color(A, problem, o).ncolors for o in ("natural",)}
                best = min(per.values())
            else:
                pp = problem == "bidirectional"
                per = {o: C.color(A, problem, o, postprocess=pp).ncolors for o in C.ORDERS}
                b = C.color(A, problem, "best", postprocess=pp)
                C.check(A, b, rounds=1)
                best = b.ncolors
            ok = best <= ref
            table.append({"matrix": name, "problem": problem, "per_order": per, "best": best,
                          "colpack_best": ref, "ok": ok})
            cells = " ".join(f"{per.get(o, '-'):>6}" for o in C.ORDERS)
            print(f"{name:18s} {problem:14s} {cells}   {best:4d}  {ref:6d} {'' if ok else '  <-- worse'}")
    return table


def smb_targets(target) -> dict:
    """Color counts of ColPack's SMB Jacobian against its targets (8 column, <= 10 bidirectional)."""
    smb = read_pattern(DATA / "smb_jac_pattern.mtx")
    smb_col = C.color(smb, "column").ncolors
    smb_bi = C.color(smb, "bidirectional")
    smb_bi_pp = C.color(smb, "bidirectional", postprocess=True)
    print(f"  SMB column (natural) {smb_col}   bidirectional (natural) {smb_bi.ncolors} "
          f"[{smb_bi.ncol_colors} JVP + {smb_bi.nrow_colors} VJP], postprocessed {smb_bi_pp.ncolors}")
    target("SMB column == 8", smb_col == 8, smb_col)
    target("SMB bidirectional <= 10", smb_bi.ncolors <= 10, smb_bi.ncolors)
    return {"smb_column": smb_col, "smb_bidirectional": smb_bi.ncolors,
            "smb_bidirectional_postprocess": smb_bi_pp.ncolors}


def igraph_graph(L):
    """igraph's graph of the symmetric pattern ``L`` and the seconds its construction took, or
    ``None`` when igraph is not installed (the peer is then skipped)."""
    try:
        import igraph
    except ImportError:
        return None, None
    rows = np.repeat(np.arange(L.shape[0]), np.diff(L.indptr))
    up = rows < L.indices
    t = time.perf_counter()
    g = igraph.Graph(n=L.shape[0], edges=np.stack([rows[up], L.indices[up]], axis=1))
    return g, time.perf_counter() - t


def main(argv=None):
    args = harness.parse(harness.arguments("coloring", __doc__), argv)
    s = Session.from_args(args)
    quick = args.quick
    results = {"machine": harness.machine()}
    checks = []

    def target(name, ok, detail):
        checks.append({"target": name, "met": bool(ok), "detail": detail})

    # 1. compile time (cold by definition: a subprocess with an empty Numba cache)
    if quick:
        results["compile"] = None
    else:
        print("== numba compile time (fresh cache dir, subprocess) ==")
        ct = compile_times()
        results["compile"] = ct
        for p in PROBLEMS:
            c, w = ct["cold_cache"][p], ct["warm_disk_cache"][p]
            print(f"  {p:14s} first call {c['first_call_s']:7.3f} s (cold) / {w['first_call_s']:6.3f} s "
                  f"(disk cache)   steady {c['steady_s'] * 1e3:7.2f} ms")
        print(f"  import asd.coloring {ct['cold_cache']['import_s'] * 1e3:.1f} ms")

    # 2. ColPack matrices
    table = colpack_table(quick)
    results["colpack_matrices"] = table
    for problem in PROBLEMS:
        rows = [t for t in table if t["problem"] == problem]
        note = ", informational" if problem == "bidirectional" else ""
        target(f"best <= ColPack best ({problem}, {len(rows)} matrices{note})", all(t["ok"] for t in rows),
               {t["matrix"]: (t["best"], t["colpack_best"]) for t in rows})

    # 3. targets on synthetic / SMB patterns
    print("\n== targets ==")
    counts = {} if quick else smb_targets(target)
    NB = 16 if quick else 128
    B = brusselator(NB)
    bru = {o: C.color(B, "column", o).ncolors for o in C.ORDERS}
    bru_best = C.color(B, "column", "best")
    C.check(B, bru_best, rounds=1)
    print(f"  Brusselator N={NB} column: {bru}  best {bru_best.ncolors} ({bru_best.order})")
    target(f"Brusselator N={NB} column <= 11 (best)", bru_best.ncolors <= 11, bru_best.ncolors)
    band = {}
    for rho in (10, 20):
        A = banded(200 if quick else 10000, rho)
        band[rho] = (C.color(A, "star").ncolors, C.color(A, "acyclic").ncolors)
        target(f"banded rho={rho}: star {2 * (rho // 2) + 1}, acyclic {rho // 2 + 1}",
               band[rho] == (2 * (rho // 2) + 1, rho // 2 + 1), band[rho])
    print(f"  banded (star, acyclic): {band}")
    results["targets_counts"] = dict(counts, **{f"brusselator{NB}_column": bru, f"brusselator{NB}_best": bru_best.ncolors,
                                                "banded": {str(k): v for k, v in band.items()}})

    # 4. speed: 2-D Laplacian, asd vs igraph (the peer is skipped when absent)
    N = 20 if quick else 1000
    case = f"laplacian {N}x{N}"
    print(f"\n== speed: 2-D 5-point Laplacian {N}x{N} ({N * N} vertices) ==")
    L = lap2d(N)
    g, t_build = igraph_graph(L)
    t = {p: s.measure(case, f"asd {p}", lambda p=p: C.color(L, p)) for p in ("star", "acyclic")}
    res = {p: C.color(L, p) for p in t}
    for p in res:
        C.check(L, res[p], rounds=1)
    lap = {"N": N, "vertices": N * N, "star_colors": res["star"].ncolors, "acyclic_colors": res["acyclic"].ncolors,
           "acyclic_levels": res["acyclic"].plan.nlevels}
    if g is not None:
        t["igraph"] = s.measure(case, "igraph vertex_coloring_greedy", g.vertex_coloring_greedy)
        lap.update(igraph_build_s=t_build, igraph_colors=max(g.vertex_coloring_greedy()) + 1,
                   ratios=s.compare(case, {"star": t["star"], "acyclic": t["acyclic"]}, {"igraph": t["igraph"]}))
        print(f"  igraph greedy d1: {lap['igraph_colors']} colors, {t['igraph'].median:.3f} s "
              f"(graph build {t_build:.2f} s excluded)")
    for p in ("star", "acyclic"):
        x = lap.get("ratios", {}).get(f"igraph/{p}")
        print(f"  asd {p:8s}: {res[p].ncolors} colors, {t[p].median:.3f} s"
              + (f"  ({1 / x:.2f}x igraph)" if x else ""))
    target(f"Laplacian {N}x{N}: star 5 colors", res["star"].ncolors == 5, res["star"].ncolors)
    target(f"Laplacian {N}x{N}: acyclic <= 4 colors", res["acyclic"].ncolors <= 4, res["acyclic"].ncolors)
    if g is not None:
        target(f"Laplacian {N}x{N}: star faster than igraph greedy", lap["ratios"]["igraph/star"] > 1,
               (t["star"].median, t["igraph"].median))
        target(f"Laplacian {N}x{N}: acyclic <= 2x igraph greedy", lap["ratios"]["igraph/acyclic"] >= 0.5,
               (t["acyclic"].median, t["igraph"].median))
    # substitution decompression time on the same problem
    r = res["acyclic"]
    Bz = np.random.default_rng(0).standard_normal(r.plan.compressed_shape)
    Bs = np.zeros(res["star"].plan.compressed_shape)
    dec = {"star_gather": s.measure(case, "asd star decompress", lambda: res["star"].decompress(Bs)),
           "acyclic_substitution_numba": s.measure(case, "asd acyclic decompress", lambda: r.decompress(Bz))}
    print(f"  decompression: star gather {fmt(dec['star_gather'])}, "
          f"acyclic numba substitution {fmt(dec['acyclic_substitution_numba'])}")
    lap.update(median_s=harness.medians(t), all_s={k: list(v.samples) for k, v in t.items()},
               timings=harness.timings_json(t), decompress_s=harness.medians(dec))
    results["laplacian"] = lap

    # 5. arrowhead
    NA = 200 if quick else 3200
    print(f"\n== speed: arrowhead Hessian N={NA}, K=2 ==")
    AH = arrowhead(NA, 2)
    arrow = {}
    for p in ("star", "acyclic"):
        tp = s.measure(f"arrowhead {NA}", f"asd {p}", lambda: C.color(AH, p))
        rr = C.color(AH, p)
        C.check(AH, rr, rounds=1)
        arrow[p] = {"colors": rr.ncolors, "median_s": tp.median, "min_s": tp.min, "timing": tp.to_json()}
        print(f"  {p:8s}: {rr.ncolors} colors, {fmt(tp)} (min {fmt(tp.min)})")
        target(f"arrowhead {NA} {p} < 50 ms", tp.median < 0.05, tp.median)
    results[f"arrowhead_{NA}_2"] = arrow
    # column coloring speed of the Brusselator and SMB
    other = {f"brusselator{NB}_column": s.measure(f"brusselator {NB}", "asd column", lambda: C.color(B, "column"))}
    if not quick:
        smb = read_pattern(DATA / "smb_jac_pattern.mtx")
        other["smb_column"] = s.measure("smb", "asd column", lambda: C.color(smb, "column"))
        other["smb_bidirectional"] = s.measure("smb", "asd bidirectional", lambda: C.color(smb, "bidirectional"))
    print("\n  " + ", ".join(f"{k} {fmt(v)}" for k, v in other.items()))
    results["other_times_s"] = harness.medians(other)

    print("\n== targets summary ==")
    for c in checks:
        print(f"  [{'x' if c['met'] else ' '}] {c['target']}")
    results["targets"] = checks
    return harness.write(s, results, args.out)


if __name__ == "__main__":
    main()
