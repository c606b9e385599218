"""Benchmark B4: sparse linear algebra of seed 004 (Table 2) at its sizes, forward and backward.

Compares asd.linalg with scipy (forward), PyTorch's own sparse ops (forward and autograd), dense
PyTorch where the dense matrix fits in memory, and torchsparsegradutils when it is importable
(the Makefile's benchmark environment installs it).  One thread everywhere, like seed 004.

    python benchmarks/linalg.py            # table + benchmarks/results/linalg.json
    python benchmarks/linalg.py --quick    # tiny sizes, no slow peers, no 10^6 case, JSON into a temp folder
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import scipy.sparse.linalg as spla  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (puts the checkout's root on sys.path)
from harness import Session  # noqa: E402

import asd.linalg as al  # noqa: E402
from asd.timing import ratio as median_ratio  # noqa: E402

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")
torch.set_num_threads(1)

try:
    import torchsparsegradutils as tsgu
except Exception:  # noqa: BLE001 - optional peer
    tsgu = None

DENSE_LIMIT_BYTES = 2 * 1024 ** 3          # dense peers run only when the dense matrix fits
RESULTS: list[dict] = []


def poisson_1d(n: int) -> sp.csr_array:
    return sp.diags_array([-1.0, 2.0, -1.0], offsets=[-1, 0, 1], shape=(n, n), format="csr")


def poisson_2d(k: int) -> sp.csr_array:
    T = poisson_1d(k)
    eye = sp.eye_array(k, format="csr")
    return (sp.kron(T, eye) + sp.kron(eye, T)).tocsr()


def to_torch(M, layout="csr", requires_grad=True) -> torch.Tensor:
    M = M.tocsr()
    M.sort_indices()
    t = torch.sparse_csr_tensor(torch.from_numpy(M.indptr.astype(np.int64)),
                                torch.from_numpy(M.indices.astype(np.int64)),
                                torch.from_numpy(M.data.astype(np.float64)), M.shape)
    if layout == "coo":
        t = t.to_sparse_coo().coalesce()
    return t.requires_grad_(requires_grad)


def timed(s: Session, op, impl, phase, n, f, note=""):
    """Time ``f`` warm (harness policy) and add its row, in ms, to RESULTS."""
    t = s.measure(f"{op} n={n}", f"{impl} {phase}", f)
    RESULTS.append(dict(op=op, impl=impl, phase=phase, n=n, ms=1e3 * t.median, min_ms=1e3 * t.min,
                        iqr_ms=1e3 * t.iqr, note=note))
    print(f"{op:9s} {impl:26s} {phase:8s} n={n:<7d} {1e3 * t.median:10.4f} ms  {note}", flush=True)


def skipped(op, impl, phase, n, note):
    """Add a row for a measurement that cannot be taken (``ms`` None), with the reason."""
    RESULTS.append(dict(op=op, impl=impl, phase=phase, n=n, ms=None, min_ms=None, iqr_ms=None, note=note))
    print(f"{op:9s} {impl:26s} {phase:8s} n={n:<7d}        n/a ms  {note}", flush=True)


def fwd_bwd(make_out, params, grad_out=None):
    """A closure running forward + backward with fresh gradients each call."""
    def run():
        for p in params:
            p.grad = None
        y = make_out()
        if y.layout != torch.strided:
            y = y.values()
        y.backward(grad_out if grad_out is not None and grad_out.shape == y.shape else torch.ones_like(y))
    return run


def guarded(s: Session, op, impl, phase, n, f, note=""):
    try:
        timed(s, op, impl, phase, n, f, note)
    except Exception as e:  # noqa: BLE001 - report peers that fail, keep going
        skipped(op, impl, phase, n, f"fails: {type(e).__name__}: {str(e).splitlines()[0][:70]}")


def asd_layouts(s: Session, op, n, operands, apply, other=None, grad_out=None):
    """Time asd's ``apply(*operands converted to CSR, then COO)`` forward (no grad) and forward + backward;
    ``other`` is a dense operand whose gradient is taken too."""
    for layout in ("csr", "coo"):
        mats = [to_torch(M, layout) for M in operands]
        params = mats + ([other] if other is not None else [])
        with torch.no_grad():
            timed(s, op, f"asd {layout}", "fwd", n, lambda: apply(*params))
        timed(s, op, f"asd {layout}", "fwd+bwd", n, fwd_bwd(lambda: apply(*params), params, grad_out))


def peer_phases(s: Session, op, impl, n, call, params, grad_out):
    """Time a peer's ``call`` forward (no grad) and forward + backward; failures are reported."""
    with torch.no_grad():
        guarded(s, op, impl, "fwd", n, call)
    guarded(s, op, impl, "fwd+bwd", n, fwd_bwd(call, params, grad_out))


def vector(n, seed):
    """A random vector (numpy, and a torch leaf that needs its gradient) and a random output gradient."""
    xn = np.random.default_rng(seed).standard_normal(n)
    return xn, torch.from_numpy(xn.copy()).requires_grad_(), torch.randn(n, dtype=torch.float64)


# ---- B4 cases ------------------------------------------------------------------------------
def warm_up():
    """Compile (or load from Numba's cache) every kernel on tiny inputs before timing."""
    A = to_torch(poisson_1d(8))
    L = to_torch(sp.tril(poisson_1d(8)).tocsr())
    for rhs in (torch.ones(8, dtype=torch.float64, requires_grad=True),
                torch.ones(8, 2, dtype=torch.float64, requires_grad=True)):
        al.matmul(A, rhs).sum().backward()
        al.triangular_solve(L, rhs).sum().backward()
        al.solve(A, rhs, "direct").sum().backward()
    al.matmul(A, A).values().sum().backward()
    al.add(A, A).values().sum().backward()


def bench_spmv(s: Session, n, slow):
    M = poisson_1d(n)
    xn, x, g = vector(n, 0)
    timed(s, "spmv", "scipy", "fwd", n, lambda: M @ xn)
    asd_layouts(s, "spmv", n, [M], al.matmul, x, g)
    A = to_torch(M, "csr")
    x2 = x.detach().reshape(n, 1).requires_grad_()
    with torch.no_grad():
        timed(s, "spmv", "torch csr", "fwd", n, lambda: A @ x.detach())
    guarded(s, "spmv", "torch csr (sparse.mm)", "fwd+bwd", n,
            fwd_bwd(lambda: torch.sparse.mm(A, x2), [A, x2], g.reshape(n, 1)))
    Ac = to_torch(M, "coo")
    with torch.no_grad():
        timed(s, "spmv", "torch coo", "fwd", n, lambda: torch.sparse.mm(Ac, x2))
    if slow:
        guarded(s, "spmv", "torch coo (sparse.mm)", "fwd+bwd", n,
                fwd_bwd(lambda: torch.sparse.mm(Ac, x2), [Ac, x2], g.reshape(n, 1)))
    if tsgu is not None:
        peer_phases(s, "spmv", "torchsparsegradutils", n, lambda: tsgu.sparse_mm(A, x2), [A, x2], g.reshape(n, 1))
    dense_note(n, "spmv", "dense mv")


def dense_note(n, op, what):
    if n * n * 8 > DENSE_LIMIT_BYTES:
        skipped(op, what, "fwd", n, f"dense {n}x{n} float64 ({n * n * 8 / 2**30:.1f} GiB) "
                                    f"does not fit the {DENSE_LIMIT_BYTES / 2**30:.0f} GiB limit")
        return False
    return True


def bench_add(s: Session, n):
    M = poisson_1d(n)
    M2 = sp.diags_array([1.0, 1.0], offsets=[-2, 2], shape=(n, n), format="csr")
    timed(s, "add", "scipy", "fwd", n, lambda: M + M2)
    asd_layouts(s, "add", n, [M, M2], al.add)
    A, B = to_torch(M, "csr"), to_torch(M2, "csr")
    with torch.no_grad():
        guarded(s, "add", "torch csr", "fwd", n, lambda: A + B)
    guarded(s, "add", "torch csr", "fwd+bwd", n, fwd_bwd(lambda: A + B, [A, B]))
    dense_note(n, "add", "dense add")


def bench_spspmm(s: Session, n):
    M = poisson_1d(n)
    timed(s, "spspmm", "scipy", "fwd", n, lambda: M @ M)
    asd_layouts(s, "spspmm", n, [M, M], al.matmul)
    A, B = to_torch(M, "csr"), to_torch(M, "csr")
    with torch.no_grad():
        guarded(s, "spspmm", "torch csr", "fwd", n, lambda: A @ B)
    guarded(s, "spspmm", "torch csr", "fwd+bwd", n, fwd_bwd(lambda: A @ B, [A, B]))


def bench_spdmm(s: Session, n, k):
    M = poisson_1d(n)
    Xn = np.random.default_rng(1).standard_normal((n, k))
    note = f"B dense {n}x{k}"
    timed(s, "spdmm", "scipy", "fwd", n, lambda: M @ Xn, note)
    X = torch.from_numpy(Xn).requires_grad_()
    G = torch.randn(n, k, dtype=torch.float64)
    A = to_torch(M, "csr")
    with torch.no_grad():
        timed(s, "spdmm", "asd csr", "fwd", n, lambda: al.matmul(A, X), note)
    timed(s, "spdmm", "asd csr", "fwd+bwd", n, fwd_bwd(lambda: al.matmul(A, X), [A, X], G), note)
    with torch.no_grad():
        guarded(s, "spdmm", "torch csr", "fwd", n, lambda: A @ X, note)
    guarded(s, "spdmm", "torch csr (sparse.mm)", "fwd+bwd", n, fwd_bwd(lambda: torch.sparse.mm(A, X), [A, X], G), note)
    if tsgu is not None:
        guarded(s, "spdmm", "torchsparsegradutils", "fwd+bwd", n, fwd_bwd(lambda: tsgu.sparse_mm(A, X), [A, X], G), note)
    if dense_note(n, "spdmm", "dense mm"):
        Ad = torch.from_numpy(M.toarray()).requires_grad_()
        timed(s, "spdmm", "dense mm", "fwd+bwd", n, fwd_bwd(lambda: Ad @ X, [Ad, X], G), note)
        del Ad


def bench_trsv(s: Session, n):
    Ln = sp.tril(poisson_1d(n)).tocsr()
    bn, b, g = vector(n, 2)
    timed(s, "trsv", "scipy spsolve_triangular", "fwd", n, lambda: spla.spsolve_triangular(Ln, bn, lower=True))
    asd_layouts(s, "trsv", n, [Ln], al.triangular_solve, b, g)
    L = to_torch(Ln, "csr")
    b2 = b.detach().reshape(n, 1).requires_grad_()
    with torch.no_grad():
        guarded(s, "trsv", "torch csr triangular_solve", "fwd", n, lambda: torch.triangular_solve(b2, L, upper=False))
    if tsgu is not None:
        peer_phases(s, "trsv", "torchsparsegradutils", n, lambda: tsgu.sparse_triangular_solve(L, b2, upper=False),
                    [L, b2], g.reshape(n, 1))
    dense_note(n, "trsv", "dense triangular solve")


# ---- 10^6 unknowns: memory proportional to the stored entries ---------------------------------
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def scale_case(kind: str, k: int, iters: int) -> dict:
    """Run in a fresh process: peak-memory growth of one forward + backward at 10^6 unknowns."""
    # warm up on a small system first, so that loading Numba's kernels is not counted
    Aw = to_torch(poisson_2d(8), "csr")
    xw = torch.ones(64, dtype=torch.float64, requires_grad=True)
    al.matmul(Aw, xw).sum().backward()
    al.solve(Aw, xw, "cg", maxiter=3, warn=False).sum().backward()
    M = poisson_2d(k)
    A = to_torch(M, "csr")
    nnz = M.nnz
    x = torch.randn(M.shape[0], dtype=torch.float64, requires_grad=True)
    base = _rss_mb()
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if kind == "spmv":
        y = al.matmul(A, x)
    else:
        y, info = al.solve(A, x, "cg", maxiter=iters, warn=False, return_info=True)
    (y * y).sum().backward()
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    extra = max(peak - max(base, peak0), 0.0) if peak > peak0 else max(_rss_mb() - base, 0.0)
    ok = A.grad.layout == torch.sparse_csr and A.grad.values().numel() == nnz
    return dict(kind=kind, n=M.shape[0], nnz=nnz, seconds=dt, extra_peak_mb=extra,
                bytes_per_stored_entry=extra * 2**20 / nnz, grad_pattern_ok=bool(ok),
                dense_gradient_would_need_gb=M.shape[0] ** 2 * 8 / 2**30,
                cg_iterations=iters if kind == "cg" else None)


def bench_scale(k, iters):
    out = {}
    for kind in ("spmv", "cg"):
        cmd = [sys.executable, __file__, "--scale-case", kind, "--grid", str(k), "--cg-iters", str(iters)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
        if not line:
            print(res.stderr[-2000:])
            continue
        r = json.loads(line[-1])
        out[kind] = r
        print(f"scale     {kind:26s} fwd+bwd  n={r['n']:<7d} {1e3 * r['seconds']:10.1f} ms  "
              f"peak +{r['extra_peak_mb']:.0f} MB = {r['bytes_per_stored_entry']:.0f} B per stored entry "
              f"(nnz {r['nnz']}), gradient pattern ok: {r['grad_pattern_ok']}", flush=True)
    return out


# ---- targets ------------------------------------------------------------------------------------
def _ms(op, impl, phase, key="ms"):
    for r in RESULTS:
        if r["op"] == op and r["impl"] == impl and r["phase"] == phase:
            return r[key]
    return None


def targets(scale) -> list[dict]:
    rows = []

    def ratio(name, num, den, goal, better):
        v = median_ratio(num, den)
        if v is None:
            rows.append(dict(target=name, value=None, goal=goal, met=None))
            return
        met = v <= goal if better == "le" else v >= goal
        rows.append(dict(target=name, value=v, goal=goal, met=bool(met)))

    f = _ms("spmv", "asd csr", "fwd")
    fb = _ms("spmv", "asd csr", "fwd+bwd")
    ratio("SpMV fwd: asd / scipy (<= 3)", f, _ms("spmv", "scipy", "fwd"), 3.0, "le")
    ratio("SpMV fwd+bwd: torchsparsegradutils / asd (>= 3)", _ms("spmv", "torchsparsegradutils", "fwd+bwd"), fb, 3.0, "ge")
    ratio("SpMV fwd+bwd: torch CSR autograd / asd (>= 3)", _ms("spmv", "torch csr (sparse.mm)", "fwd+bwd"), fb, 3.0, "ge")
    ratio("SpMV fwd+bwd: torch COO autograd / asd (>= 3)", _ms("spmv", "torch coo (sparse.mm)", "fwd+bwd"), fb, 3.0, "ge")
    # absolute levels of seed 004 (another machine): medians, and fastest batches (less noise)
    ratio("SpMV fwd: asd / seed-004 0.141 ms (<= 1)", f, 0.141, 1.0, "le")
    ratio("SpMV bwd: asd (fwd+bwd - fwd) / seed-004 0.595 ms (<= 1)",
          (fb - f) if fb and f else None, 0.595, 1.0, "le")
    fm, fbm = _ms("spmv", "asd csr", "fwd", "min_ms"), _ms("spmv", "asd csr", "fwd+bwd", "min_ms")
    ratio("SpMV fwd, fastest batch: asd / seed-004 0.141 ms (<= 1)", fm, 0.141, 1.0, "le")
    ratio("SpMV bwd, fastest batches: asd / seed-004 0.595 ms (<= 1)",
          (fbm - fm) if fbm and fm else None, 0.595, 1.0, "le")
    tf = _ms("trsv", "asd csr", "fwd")
    ratio("TRSV fwd: asd / scipy spsolve_triangular (< 1)", tf, _ms("trsv", "scipy spsolve_triangular", "fwd"), 1.0, "le")
    ratio("TRSV fwd+bwd: asd / torchsparsegradutils (< 1)", _ms("trsv", "asd csr", "fwd+bwd"),
          _ms("trsv", "torchsparsegradutils", "fwd+bwd"), 1.0, "le")
    for kind, r in (scale or {}).items():
        rows.append(dict(target=f"10^6-unknown {kind} backward: bytes of peak growth per stored entry",
                         value=r["bytes_per_stored_entry"], goal="O(1) (dense gradient: "
                         f"{r['dense_gradient_would_need_gb']:.0f} GiB)", met=bool(r["grad_pattern_ok"]
                         and r["bytes_per_stored_entry"] < 400)))
    print("\nTargets")
    for r in rows:
        v = "n/a" if r["value"] is None else f"{r['value']:.3g}"
        met = {None: "not measured", True: "met", False: "NOT met"}[r["met"]]
        print(f"  {r['target']:72s} {v:>8s}  {met}")
    return rows


def main(argv=None):
    ap = harness.arguments("linalg", __doc__)
    ap.add_argument("--grid", type=int, default=1000, help="2-D Poisson grid side for the scale case")
    ap.add_argument("--cg-iters", type=int, default=50, help="CG iterations (forward and adjoint) in the scale case")
    ap.add_argument("--spdmm-cols", type=int, default=256, help="columns of the dense operand of SpDMM")
    ap.add_argument("--scale-case", choices=["spmv", "cg"], help=argparse.SUPPRESS)
    args = harness.parse(ap, argv)
    if args.scale_case:
        print(json.dumps(scale_case(args.scale_case, args.grid, args.cg_iters)))
        return
    s = Session.from_args(args)
    n1, n2, k = (256, 128, 8) if args.quick else (32768, 16384, args.spdmm_cols)
    print(f"asd.linalg benchmark (B4), 1 thread, torch {torch.__version__}, scipy {scipy.__version__}, "
          f"torchsparsegradutils {'absent' if tsgu is None else getattr(tsgu, '__version__', 'present')}")
    warm_up()
    bench_spmv(s, n1, slow=not args.quick)
    bench_add(s, n1)
    bench_trsv(s, n1)
    bench_spspmm(s, n2)
    bench_spdmm(s, n2, k)
    scale = {} if args.quick else bench_scale(args.grid, args.cg_iters)
    rows = targets(scale)
    machine = dict(harness.machine(), scipy=scipy.__version__,
                   torchsparsegradutils=None if tsgu is None else getattr(tsgu, "__version__", "present"))
    return harness.write(s, dict(machine=machine, units="ms per call (median of warm samples; min_ms: fastest sample)",
                                 results=RESULTS, scale=scale, targets=rows), args.out)


if __name__ == "__main__":
    main()
