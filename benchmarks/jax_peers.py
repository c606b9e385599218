"""asd.jax against asdex (PEERS.md B1 and B3) and the detection time of a small CNN.

B1 Brusselator N = 64 (Jacobian) and B3 chained Rosenbrock n = 10^5 (Hessian): the one-off
(detection + coloring + first call, jit compilation included) and the jitted call of asd.jax
against asdex's (``missing`` when asdex is not installed). Also the Hessian pattern of
``sum(x[::2] * x[1::2])`` (asd.jax exact, asdex's nnz recorded) and the detection of a two-layer
CNN on a 28x28 input. Run in the environment that has jax (and asdex): ``.venv-bench-jax`` made
by ``make bench``. ``--quick`` uses tiny sizes and writes nothing into benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import asd.jax as aj  # noqa: E402

try:
    import asdex  # noqa: E402
except ImportError:
    asdex = None


def block(y):
    for leaf in jax.tree_util.tree_leaves(y):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return y


def timed(fn, repeats: int, warmup: int = 1) -> dict:
    """Median (and min) seconds of ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return {"median_s": float(np.median(samples)), "min_s": float(np.min(samples)), "samples": len(samples)}


def once(fn) -> dict:
    t0 = time.perf_counter()
    fn()
    return {"seconds": time.perf_counter() - t0}


def brusselator(N: int):
    h2 = (1.0 / (N - 1)) ** 2

    def lap(w):
        return (jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1) + jnp.roll(w, -1, 1) - 4 * w) / h2

    def f(x):
        u, v = x.reshape(2, N, N)
        du = 1 + u * u * v - 4.4 * u + 10 * lap(u)
        dv = 3.4 * u - u * u * v + 10 * lap(v)
        return jnp.stack([du, dv]).reshape(-1)

    return f, 2 * N * N


def rosenbrock(x):
    return jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def pair_products(x):
    return jnp.sum(x[::2] * x[1::2])


def compare(f, x, asd_prepare, asdex_prepare, repeats: int, oneoff_repeats: int) -> dict:
    """One-off (a fresh function object every time, so no compilation cache helps; one warm-up
    run first, as for every figure here) and jitted call, asd.jax and asdex (asdex's one-off both
    eager and jitted; its best counts)."""
    out = {}

    def asd_oneoff():
        g = lambda z: f(z)  # noqa: E731
        return block(asd_prepare(g, x)(x).data)

    out["asd_oneoff"] = timed(asd_oneoff, oneoff_repeats)
    op = asd_prepare(f, x)
    out["asd_ncolors"] = op.ncolors
    out["asd_call"] = timed(lambda: block(op.values(x)), repeats)
    if asdex is None:
        out["asdex"] = "missing"
        return out
    for label, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
        def asdex_oneoff(wrap=wrap):
            g = lambda z: f(z)  # noqa: E731
            return block(wrap(asdex_prepare(g, x))(x))

        out[f"asdex_oneoff_{label}"] = timed(asdex_oneoff, oneoff_repeats)
    fn = jax.jit(asdex_prepare(f, x))
    out["asdex_call"] = timed(lambda: block(fn(x)), repeats)
    best = min(out["asdex_oneoff_eager"]["median_s"], out["asdex_oneoff_jit"]["median_s"])
    out["oneoff_speedup"] = best / out["asd_oneoff"]["median_s"]
    out["call_speedup"] = out["asdex_call"]["median_s"] / out["asd_call"]["median_s"]
    return out


def asdex_hessian_nnz(f, x):
    """nnz of asdex's global Hessian pattern (its signature differs between versions: a sample
    input in newer ones, the input shape in older ones)."""
    errors = []
    for arg in (x, x.shape):
        try:
            P = asdex.hessian_sparsity(f, arg)
        except Exception as exc:  # try the other signature, record both failures
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        nnz = getattr(P, "nnz", None)
        return int(nnz) if nnz is not None else int(np.count_nonzero(np.asarray(P.todense())))
    return "error: " + " | ".join(errors)


def cnn_detection(repeats: int) -> dict:
    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.standard_normal((8, 1, 3, 3)))
    w2 = jnp.asarray(rng.standard_normal((16, 8, 3, 3)))

    def cnn(x):
        h = jnp.tanh(lax.conv_general_dilated(x, w1, (1, 1), "SAME"))
        return lax.conv_general_dilated(h, w2, (1, 1), "SAME")

    x = jnp.asarray(rng.standard_normal((1, 1, 28, 28)))
    P = aj.jacobian_sparsity(cnn, x)
    res = timed(lambda: aj.jacobian_sparsity(cnn, x), repeats)
    res["nnz"] = int(P.nnz)
    res["shape"] = list(P.shape)
    return res


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes; writes no JSON into benchmarks/results/")
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/jax.json without --quick)")
    a = p.parse_args(argv)
    N, n, repeats, oneoff_repeats = (8, 100, 3, 1) if a.quick else (64, 10 ** 5, 20, 3)
    f, size = brusselator(N)
    xb = jnp.asarray(np.random.default_rng(0).random(size))
    xr = jnp.asarray(np.random.default_rng(0).random(n))
    record = {
        "machine": {"python": platform.python_version(), "jax": jax.__version__,
                    "asdex": getattr(asdex, "__version__", "missing") if asdex else "missing",
                    "cpu_count": os.cpu_count()},
        "B1_brusselator": dict(N=N, **compare(f, xb, aj.prepare_jacobian,
                                              asdex.jacobian if asdex else None, repeats, oneoff_repeats)),
        "B3_rosenbrock": dict(n=n, **compare(rosenbrock, xr, aj.prepare_hessian,
                                             asdex.hessian if asdex else None, repeats, oneoff_repeats)),
    }
    xp = jnp.ones(10)
    H = aj.hessian_sparsity(pair_products, xp)
    exact = {(2 * i, 2 * i + 1) for i in range(5)} | {(2 * i + 1, 2 * i) for i in range(5)}
    pair = {"asd_nnz": int(H.nnz), "asd_exact": set(zip(*H.nonzero())) == exact}
    pair["asdex_nnz"] = asdex_hessian_nnz(pair_products, xp) if asdex is not None else "missing"
    record["pair_products_hessian"] = pair
    record["cnn_detection"] = cnn_detection(3 if a.quick else 10)
    print(json.dumps(record, indent=2, default=str))
    out = a.out or (None if a.quick else os.path.join(HERE, "results", "jax.json"))
    if out is not None:
        with open(out, "w") as fh:
            json.dump(record, fh, indent=2, default=str)
    return record


if __name__ == "__main__":
    main()
