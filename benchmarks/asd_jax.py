"""asd.jax against asdex on asdex's own problems (PEERS.md B1 and B3), the exactness of a Hessian
pattern asdex over-approximates, and the detection of a small CNN.

    python benchmarks/asd_jax.py           # writes benchmarks/results/asd_jax.json
    python benchmarks/asd_jax.py --quick   # tiny sizes, JSON into a temporary folder

asd.jax runs in this environment (jax is a test extra); asdex runs in .venv-bench-jax through
benchmarks/_asdex_runner.py under the same timing policy. One-off = detection + coloring + first
call, jit included, with a new function object every time (no compilation cache helps).
Targets (issue: asd.jax): B1 N=64 one-off faster than asdex's and jitted call at least as fast;
B3 n=10^5 one-off at least 2x faster and jitted call at least as fast; the pattern of
sum(x[::2] * x[1::2]) exact; CNN detection under 1 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import peers  # noqa: E402
from harness import Session, Targets  # noqa: E402

from asd.timing import fmt_seconds, table  # noqa: E402


def problems():
    import jax.numpy as jnp

    def brusselator(N):
        h2 = (1.0 / (N - 1)) ** 2

        def lap(w):
            return (jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1) + jnp.roll(w, -1, 1) - 4 * w) / h2

        def f(x):
            u, v = x.reshape(2, N, N)
            return jnp.stack([1 + u * u * v - 4.4 * u + 10 * lap(u), 3.4 * u - u * u * v + 10 * lap(v)]).reshape(-1)

        return f, 2 * N * N

    def rosenbrock(x):
        return jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)

    return brusselator, rosenbrock


def block(y):
    import jax

    for leaf in jax.tree_util.tree_leaves(y):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return y


def asdex_pair_nnz(size: int):
    python = peers.jax_python()
    if not os.path.exists(python):
        return "missing"
    out = subprocess.run([python, os.path.join(harness.HERE, "_asdex_runner.py"), "pair_products_nnz", str(size),
                          "{}"], capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])["nnz"] if out.returncode == 0 else "error"


def main(argv=None) -> dict:
    a = harness.parse(harness.arguments("asd_jax", __doc__), argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax import lax

    import asd.jax as aj

    s = Session.from_args(a)
    s.cpus = None  # both sides are XLA, each on its process's CPUs (asd.jax's pool exists before any pinning)
    brusselator, rosenbrock = problems()
    N, n = (8, 100) if a.quick else (64, 10 ** 5)
    f, size = brusselator(N)
    xb = jnp.asarray(np.random.default_rng(0).random(size))
    xr = jnp.asarray(np.random.default_rng(0).random(n))
    targets, rows = Targets(), []
    for name, problem, g, x, prepare, psize in ((f"B1 brusselator N={N}", "brusselator", f, xb, aj.prepare_jacobian, N),
                                                (f"B3 rosenbrock n={n}", "rosenbrock", rosenbrock, xr,
                                                 aj.prepare_hessian, n)):
        t_one = s.measure(name, "asd.jax one-off", lambda: block(prepare(lambda z: g(z), x)(x).data))
        op = prepare(g, x)
        t_call = s.measure(name, "asd.jax jitted call", lambda: block(op.values(x)))
        found = [peers.asdex(s, name, problem, psize, serve=True)] if not a.no_peers else []
        try:
            timings, found = s.interleave(name, {"call": lambda: block(op.values(x))},
                                          {"oneoff": t_one, "call": t_call}, found)
        finally:
            peers.close(found)
        result = found[0] if found else None
        row = s.row(name, dict(case=name, ncolors=op.ncolors), timings, {}, found)
        rows.append(row)
        if result is not None and result.error is None:
            one, call = row["ratios"].get("asdex.oneoff/oneoff"), row["ratios"].get("asdex.call/call")
            need = 2.0 if problem == "rosenbrock" else 1.0
            targets.add(f"{name}: one-off >= {need}x faster than asdex's best", one is not None and one >= need,
                        f"x{one:.2f}" if one else "-")
            targets.add(f"{name}: jitted call at least as fast as asdex's", call is not None and call >= 1.0,
                        f"x{call:.2f}" if call else "-")
    xp = jnp.ones(10)
    H = aj.hessian_sparsity(lambda x: jnp.sum(x[::2] * x[1::2]), xp)
    exact = {(2 * i, 2 * i + 1) for i in range(5)} | {(2 * i + 1, 2 * i) for i in range(5)}
    pair = dict(case="sum(x[::2] * x[1::2]) Hessian", asd_nnz=int(H.nnz), asd_exact=set(zip(*H.nonzero())) == exact,
                asdex_nnz=asdex_pair_nnz(10) if not a.no_peers else "skipped")
    rows.append(pair)
    targets.add("pair-products Hessian pattern exact", pair["asd_exact"], f"asd {pair['asd_nnz']} entries, "
                f"asdex {pair['asdex_nnz']}")
    rng = np.random.default_rng(0)
    w1, w2 = jnp.asarray(rng.standard_normal((8, 1, 3, 3))), jnp.asarray(rng.standard_normal((16, 8, 3, 3)))

    def cnn(x):
        return lax.conv_general_dilated(jnp.tanh(lax.conv_general_dilated(x, w1, (1, 1), "SAME")), w2, (1, 1), "SAME")

    xc = jnp.asarray(rng.standard_normal((1, 1, 28, 28)))
    t_cnn = s.measure("CNN 2 conv layers, 28x28", "asd.jax.jacobian_sparsity", lambda: aj.jacobian_sparsity(cnn, xc))
    rows.append(dict(case="CNN detection", seconds=t_cnn.median, timing=t_cnn.to_json()))
    targets.add("CNN detection under 1 s", t_cnn.median < 1.0, fmt_seconds(t_cnn))
    print(table([dict(case=r["case"], oneoff=fmt_seconds(r.get("oneoff")), call=fmt_seconds(r.get("call")),
                      ratios=", ".join(f"{k} x{v:.2f}" for k, v in r.get("ratios", {}).items()))
                 for r in rows if "oneoff" in r], [("case", "case"), ("oneoff", "one-off"), ("call", "call"),
                                                   ("ratios", "ratios")]))
    for t in targets.items:
        print(f"  [{harness.verdict(t['met'])}] {t['what']}: {t['value']}")
    return harness.write(s, dict(benchmark="asd_jax", rows=rows, targets=targets.items), a.out)


if __name__ == "__main__":
    main()
