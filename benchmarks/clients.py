"""asd inside other tools: IPOPT (B5 cart-pole against CasADi SX + IPOPT), scipy's L-BFGS-B, a
dense-adjacency model, coloring of dense-ish patterns and the first call of a fresh process.

    python benchmarks/clients.py           # writes benchmarks/results/clients.json
    python benchmarks/clients.py --quick   # tiny sizes, JSON into a temporary folder

Targets (issue: real clients): B5 K=2000 total (setup + solve, warm) <= 0.6x CasADi SX's with the
same optimum 58.80789827; L-BFGS-B through asd.solvers.minimize <= 1.2x plain torch gradients;
the dense adjacency model prepares in under 2 s; coloring a 10^6-entry pattern under 1 s whatever
its density; the first prepare in a fresh process under 0.5 s beyond ``import torch`` (B1 N=32).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import numpy as np
import scipy.optimize as so
import scipy.sparse as sp
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import Session, Targets  # noqa: E402

import asd  # noqa: E402
import asd.solvers  # noqa: E402,F401
from asd.problems import cartpole, rosenbrock  # noqa: E402
from asd.timing import FULL, Policy, fmt_seconds, once, table  # noqa: E402

import asd.coloring  # noqa: E402

# time the coloring itself: asd keeps colorings of recent patterns by content, and a repeated call
# would measure that memo
asd.coloring.MEMO_ENTRIES = 0

OPTIMUM = 58.80789827


def ipopt_asd(K: int, compile: bool):
    from asd.solvers.ipopt import IpoptProblem

    f, c, x0, lb, ub = cartpole(K)

    def run():
        prob = IpoptProblem(f, c, x0, compile=compile)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x, info = prob.solve(x0, lb=lb, ub=ub, print_level=0, tol=1e-8, sb="yes")
        return info["obj_val"], info["status"]
    return run


def ipopt_casadi(K: int):
    import casadi as ca

    m1, m2, ell, g, T = 1.0, 0.3, 0.5, 9.81, 2.0
    h = T / K
    _, _, x0, lb, ub = cartpole(K)

    def run():
        x = ca.SX.sym("x", 5 * (K + 1))
        Z = ca.reshape(x, 5, K + 1)
        q2, dq1, dq2, u = Z[1, :], Z[2, :], Z[3, :], Z[4, :]
        s, c = ca.sin(q2), ca.cos(q2)
        den = m1 + m2 * (1 - c * c)
        ddq1 = (ell * m2 * s * dq2 * dq2 + u + m2 * g * c * s) / den
        ddq2 = -(ell * m2 * c * s * dq2 * dq2 + u * c + (m1 + m2) * g * s) / (ell * den)
        F = ca.vertcat(dq1, dq2, ddq1, ddq2)
        obj = (h / 2) * ca.sum2(u[:, :-1] ** 2 + u[:, 1:] ** 2)
        con = ca.vec(Z[:4, 1:] - Z[:4, :-1] - (h / 2) * (F[:, :-1] + F[:, 1:]))
        solver = ca.nlpsol("s", "ipopt", {"x": x, "f": obj, "g": con},
                           {"ipopt": {"print_level": 0, "tol": 1e-8, "sb": "yes"}, "print_time": False})
        sol = solver(x0=x0, lbx=lb, ubx=ub, lbg=0, ubg=0)
        return float(sol["f"]), solver.stats()["return_status"]
    return run


def lbfgs(n: int):
    x0 = np.full(n, 0.5)

    def plain():
        def fg(z):
            g, v = torch.func.grad_and_value(rosenbrock)(torch.as_tensor(z))
            return float(v), g.numpy()
        return so.minimize(fg, x0, jac=True, method="L-BFGS-B", options={"maxiter": 200}).fun

    def through_asd():
        return asd.solvers.minimize(rosenbrock, x0, method="L-BFGS-B", options={"maxiter": 200}).fun
    return plain, through_asd


def dense_adjacency(nodes: int, features: int = 8):
    torch.manual_seed(0)
    A = (torch.rand(nodes, nodes) < 0.01).double()
    lin = torch.nn.Linear(features, features).double()
    X = torch.rand(nodes, features, dtype=torch.float64)
    return (lambda X: torch.relu(A @ lin(X))), X


def fresh_process_first_prepare(N: int) -> dict:
    code = ("import time, sys; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import asd; "
            "t2 = time.perf_counter(); from asd.problems import brusselator, brusselator_input; "
            f"f, x = brusselator({N}), brusselator_input({N}); op = asd.prepare_jacobian(f, x); op(x); "
            "t3 = time.perf_counter(); print(t1 - t0, t2 - t1, t3 - t2)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    torch_s, asd_s, first_s = (float(v) for v in out.stdout.split()[-3:])
    return dict(import_torch=torch_s, import_asd=asd_s, first_prepare_and_call=first_s,
                beyond_torch=asd_s + first_s)


def main(argv=None) -> dict:
    a = harness.parse(harness.arguments("clients", __doc__), argv)
    torch.set_num_threads(a.threads)
    s = Session.from_args(a)
    targets = Targets()
    rows = []
    slow = Policy(warmup=1, repeat=3, min_time=0.0, budget=60.0) if not a.quick else a.policy

    K = 40 if a.quick else 2000
    case = f"B5 cart-pole K={K}"
    try:
        import cyipopt  # noqa: F401
    except ImportError:
        rows.append(dict(case=case, skipped="cyipopt is not installed (`pip install asd[ipopt]`; make bench installs it)"))
        print(f"{case}: skipped, cyipopt is not installed")
    else:
        objective, status = ipopt_asd(K, False)()
        t_asd = s.measure(case, "asd + cyipopt (eager)", ipopt_asd(K, False), policy=slow)
        peers = {"asd eager": t_asd}
        row = dict(case=case, asd_objective=objective, asd_status=status, asd_total=t_asd.median)
        if not a.no_peers:
            try:
                cas_obj, cas_status = ipopt_casadi(K)()
                t_cas = s.measure(case, "casadi SX + ipopt", ipopt_casadi(K), policy=slow)
                row.update(casadi_objective=cas_obj, casadi_status=cas_status, casadi_total=t_cas.median,
                           ratio=t_asd.median / t_cas.median)
                peers["casadi SX"] = t_cas
                if not a.quick:
                    targets.add("B5 total <= 0.6x CasADi SX, same optimum",
                                t_asd.median <= 0.6 * t_cas.median and abs(objective - OPTIMUM) < 1e-6,
                                f"{fmt_seconds(t_asd)} vs {fmt_seconds(t_cas)} (x{t_asd.median / t_cas.median:.2f}), "
                                f"objective {objective:.8f}")
            except ImportError as exc:
                row.update(casadi_error=str(exc))
        row["timings"] = harness.timings_json(peers)
        rows.append(row)

    n = 200 if a.quick else 10_000
    plain, through = lbfgs(n)
    t_plain = s.measure(f"L-BFGS-B rosenbrock n={n}", "scipy + torch.func gradients", plain, policy=slow)
    t_asd_l = s.measure(f"L-BFGS-B rosenbrock n={n}", "asd.solvers.minimize", through, policy=slow)
    rows.append(dict(case=f"L-BFGS-B n={n}", plain=t_plain.median, asd=t_asd_l.median,
                     ratio=t_asd_l.median / t_plain.median))
    targets.add("L-BFGS-B through asd <= 1.2x plain gradients", t_asd_l.median <= 1.2 * t_plain.median,
                f"x{t_asd_l.median / t_plain.median:.2f}")

    nodes = 60 if a.quick else 400
    f, X = dense_adjacency(nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_prep, op = once(lambda: asd.prepare_jacobian(f, X))
        J = op(X)
    ok = torch.allclose(J.to_dense(), torch.func.jacrev(f)(X).reshape(J.shape))
    rows.append(dict(case=f"dense adjacency {nodes} nodes", prepare=t_prep, colors=op.ncolors, exact=ok))
    targets.add("dense adjacency prepares in < 2 s, exact", t_prep < 2 and ok, fmt_seconds(t_prep))

    m = 200 if a.quick else 1000
    half = int(1.6 * m)  # half-dense random rows: not hopeless by the densest-row bound, every column pair shares a row
    for label, P in ((f"{m}x{m} dense (10^6 entries)", sp.csr_array(np.ones((m, m), dtype=bool))),
                     (f"arrowhead + random, ~10^6 entries", _arrow_random(m * m)),
                     (f"{half}x{half} half-dense random, ~10^6 entries",
                      sp.csr_array(np.random.default_rng(2).random((half, half)) < 0.5))):
        for problem in ("column", "row", "star"):
            Q = P if problem != "star" else (P + P.T).astype(bool)
            t = s.measure(label, f"color {problem}", lambda Q=Q, p=problem: asd.color(Q, p), policy=slow)
            rows.append(dict(case=label, problem=problem, nnz=int(Q.nnz), seconds=t.median))
            targets.add(f"coloring {label} ({problem}) < 1 s", t.median < 1.0, fmt_seconds(t))

    fresh = fresh_process_first_prepare(8 if a.quick else 32)
    rows.append(dict(case="fresh process, B1 N=32", **fresh))
    targets.add("first prepare + call in a fresh process < 0.5 s beyond import torch", fresh["beyond_torch"] < 0.5,
                fmt_seconds(fresh["beyond_torch"]))

    for r in rows:
        print({k: (fmt_seconds(v) if isinstance(v, float) and k not in ("ratio", "asd_objective",
                                                                        "casadi_objective") else v)
               for k, v in r.items() if k != "timings"})
    for t in targets.items:
        print(f"  [{harness.verdict(t['met'])}] {t['what']}: {t['value']}")
    return harness.write(s, dict(benchmark="clients", rows=rows, targets=targets.items), a.out)


def _arrow_random(nnz: int) -> sp.csr_array:
    n = int(nnz ** 0.5) * 4
    rng = np.random.default_rng(0)
    r = np.concatenate([np.zeros(n, int), np.arange(n), rng.integers(0, n, nnz - 2 * n)])
    c = np.concatenate([np.arange(n), np.zeros(n, int), rng.integers(0, n, nnz - 2 * n)])
    return sp.csr_array((np.ones(r.size, dtype=bool), (r, c)), shape=(n, n))


if __name__ == "__main__":
    main()
