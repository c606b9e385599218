"""The peers of PEERS.md, measured in the same run as asd: CasADi (in-process, if installed) and
asdex (JAX, in its own virtual environment, run as a subprocess).

Peers are never dependencies of asd: ``make bench`` installs casadi beside asd and jax + asdex in
``.venv-bench-jax``; set ``ASD_JAX_PYTHON`` to that interpreter. A missing peer is reported as
``None`` with the reason, never as a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))


def periodic_laplacian(N: int) -> sp.csr_matrix:
    h2 = (1.0 / (N - 1)) ** 2
    e = np.ones(N)
    D = sp.diags([e[:-1], -2 * e, e[:-1]], [-1, 0, 1], shape=(N, N), format="lil")
    D[0, N - 1] = 1
    D[N - 1, 0] = 1
    D = D.tocsr()
    I = sp.identity(N, format="csr")
    return ((sp.kron(D, I) + sp.kron(I, D)) / h2).tocsr()


def _median_call(fn, repeat=30):
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def casadi_brusselator(N: int, kind: str = "MX") -> dict:
    """B1 with the Laplacian as a sparse constant: one-off (build + Jacobian function + first call), call."""
    try:
        import casadi as ca
    except ImportError as exc:
        return {"error": f"casadi not installed ({exc}); run make bench"}
    L = periodic_laplacian(N).tocsc()
    Lca = ca.DM(ca.Sparsity(L.shape[0], L.shape[1], L.indptr.tolist(), L.indices.tolist()), L.data.tolist())
    x0 = np.random.default_rng(0).random(2 * N * N)
    t0 = time.perf_counter()
    Sym = ca.MX if kind == "MX" else ca.SX
    x = Sym.sym("x", 2 * N * N)
    u, v = x[: N * N], x[N * N:]
    du = 1 + u * u * v - 4.4 * u + 10 * ca.mtimes(Lca, u)
    dv = 3.4 * u - u * u * v + 10 * ca.mtimes(Lca, v)
    F = ca.vertcat(du, dv)
    J = ca.Function("J", [x], [ca.jacobian(F, x)])
    J(x0)
    oneoff = time.perf_counter() - t0
    call = _median_call(lambda: J(x0), repeat=20)
    return {"oneoff": oneoff, "call": call, "kind": kind}


def casadi_rosenbrock_hessian(n: int) -> dict:
    """B3 with SX: one-off (build + Hessian function + first call), call."""
    try:
        import casadi as ca
    except ImportError as exc:
        return {"error": f"casadi not installed ({exc}); run make bench"}
    x0 = np.random.default_rng(0).random(n)
    t0 = time.perf_counter()
    x = ca.SX.sym("x", n)
    f = ca.sum1(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
    H, _ = ca.hessian(f, x)
    Hf = ca.Function("H", [x], [H])
    Hf(x0)
    oneoff = time.perf_counter() - t0
    call = _median_call(lambda: Hf(x0), repeat=20)
    return {"oneoff": oneoff, "call": call, "kind": "SX"}


def asdex(problem: str, size: int, timeout: float = 600) -> dict:
    """Run benchmarks/_asdex_runner.py in the JAX environment; returns its JSON or an error."""
    python = os.environ.get("ASD_JAX_PYTHON") or os.path.join(os.path.dirname(HERE), ".venv-bench-jax", "bin", "python")
    if not os.path.exists(python):
        return {"error": "no JAX environment (run make bench, or set ASD_JAX_PYTHON)"}
    try:
        out = subprocess.run([python, os.path.join(HERE, "_asdex_runner.py"), problem, str(size)],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"asdex timed out after {timeout} s"}
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "asdex failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(casadi_brusselator(int(sys.argv[1]) if len(sys.argv) > 1 else 32))
