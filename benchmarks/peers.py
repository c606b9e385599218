"""The peers of PEERS.md, timed by the harness in the same run as asd: CasADi (in-process, SX and
MX graphs) and asdex (JAX, eager and jitted, in its own virtual environment, run as a subprocess).

Peers are never dependencies of asd: ``make bench`` installs casadi beside asd and jax + asdex in
``.venv-bench-jax``; set ``ASD_JAX_PYTHON`` to that interpreter. A missing peer is reported as a
:class:`harness.PeerResult` with the reason, never as a failure.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import scipy.sparse as sp

from harness import ROOT, PeerResult, Session, Variants
from asd.timing import Timing

HERE = os.path.dirname(os.path.abspath(__file__))
CASADI_VARIANTS = ("SX", "MX")


def periodic_laplacian(N: int) -> sp.csr_matrix:
    h2 = (1.0 / (N - 1)) ** 2
    e = np.ones(N)
    D = sp.diags([e[:-1], -2 * e, e[:-1]], [-1, 0, 1], shape=(N, N), format="lil")
    D[0, N - 1] = 1
    D[N - 1, 0] = 1
    D = D.tocsr()
    I = sp.identity(N, format="csr")
    return ((sp.kron(D, I) + sp.kron(I, D)) / h2).tocsr()


def _casadi(session: Session, case: str, n: int, build) -> PeerResult:
    """Time ``build(ca, Sym) -> casadi.Function`` for SX and MX: one-off = build + first call."""
    try:
        import casadi as ca
    except ImportError as exc:
        return PeerResult.failed("casadi", f"casadi not installed ({exc}); run make bench")
    x0 = np.random.default_rng(0).random(n)
    oneoff, call = {}, {}
    for kind in CASADI_VARIANTS:
        Sym = getattr(ca, kind)
        oneoff[kind] = session.measure(case, "casadi one-off", lambda: build(ca, Sym)(x0), variant=kind)
        fn = build(ca, Sym)
        call[kind] = session.measure(case, "casadi call", lambda: fn(x0), variant=kind)
    return PeerResult("casadi", Variants("casadi", call), Variants("casadi", oneoff), version=ca.__version__)


def casadi_brusselator(session: Session, case: str, N: int) -> PeerResult:
    """B1 with the Laplacian as a sparse constant, as an SX and as an MX graph."""
    L = periodic_laplacian(N).tocsc()

    def build(ca, Sym):
        Lca = ca.DM(ca.Sparsity(L.shape[0], L.shape[1], L.indptr.tolist(), L.indices.tolist()), L.data.tolist())
        x = Sym.sym("x", 2 * N * N)
        u, v = x[: N * N], x[N * N:]
        du = 1 + u * u * v - 4.4 * u + 10 * ca.mtimes(Lca, u)
        dv = 3.4 * u - u * u * v + 10 * ca.mtimes(Lca, v)
        return ca.Function("J", [x], [ca.jacobian(ca.vertcat(du, dv), x)])

    return _casadi(session, case, 2 * N * N, build)


def casadi_rosenbrock_hessian(session: Session, case: str, n: int) -> PeerResult:
    """B3's Hessian, as an SX and as an MX graph."""

    def build(ca, Sym):
        x = Sym.sym("x", n)
        f = ca.sum1(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
        H, _ = ca.hessian(f, x)
        return ca.Function("H", [x], [H])

    return _casadi(session, case, n, build)


def jax_python() -> str:
    return os.environ.get("ASD_JAX_PYTHON") or os.path.join(ROOT, ".venv-bench-jax", "bin", "python")


def asdex(session: Session, case: str, problem: str, size: int, timeout: float = 1200) -> PeerResult:
    """Run benchmarks/_asdex_runner.py in the JAX environment under the session's policy."""
    python = jax_python()
    if not os.path.exists(python):
        return PeerResult.failed("asdex", "no JAX environment (run make bench, or set ASD_JAX_PYTHON)")
    cmd = [python, os.path.join(HERE, "_asdex_runner.py"), problem, str(size), json.dumps(session.policy.to_json())]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return PeerResult.failed("asdex", f"asdex timed out after {timeout} s")
    if out.returncode != 0:
        return PeerResult.failed("asdex", out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "asdex failed")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    parts = {}
    for what in ("oneoff", "call"):
        timings = {k: session.record(case, f"asdex {what.replace('oneoff', 'one-off')}", Timing.from_json(t), k)
                   for k, t in res[what].items()}
        parts[what] = Variants("asdex", timings)
    return PeerResult("asdex", parts["call"], parts["oneoff"], version=res.get("version"))


CASADI = {"brusselator": casadi_brusselator, "rosenbrock": casadi_rosenbrock_hessian}


def run(session: Session, case: str, problem: str, size: int) -> list[PeerResult]:
    """Every peer on ``problem`` ("brusselator": B1 Jacobian, "rosenbrock": B3 Hessian) at ``size``."""
    return [CASADI[problem](session, case, size), asdex(session, case, problem, size)]
