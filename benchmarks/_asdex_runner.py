"""Runs inside the JAX environment: asdex on a PEERS.md problem; prints one JSON line.

Usage: python _asdex_runner.py brusselator N | rosenbrock n
"""

import json
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import asdex  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def brusselator(N):
    h2 = (1.0 / (N - 1)) ** 2

    def lap(w):
        return (jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1) + jnp.roll(w, -1, 1) - 4 * w) / h2

    def f(x):
        u, v = x.reshape(2, N, N)
        du = 1 + u * u * v - 4.4 * u + 10 * lap(u)
        dv = 3.4 * u - u * u * v + 10 * lap(v)
        return jnp.stack([du, dv]).reshape(-1)

    return f, 2 * N * N


def rosenbrock(n):
    def f(x):
        return jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)

    return f, n


def block(y):
    leaves = jax.tree_util.tree_leaves(y)
    for leaf in leaves:
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return y


def main():
    problem, size = sys.argv[1], int(sys.argv[2])
    # warm JAX itself up on a tiny instance so the one-off measures asdex, not JAX start-up
    f0, n0 = (brusselator(4) if problem == "brusselator" else rosenbrock(10))
    x0 = jnp.asarray(np.random.default_rng(1).random(n0))
    prep0 = asdex.jacobian if problem == "brusselator" else asdex.hessian
    block(jax.jit(prep0(f0, x0))(x0))

    f, n = brusselator(size) if problem == "brusselator" else rosenbrock(size)
    x = jnp.asarray(np.random.default_rng(0).random(n))
    prep = asdex.jacobian if problem == "brusselator" else asdex.hessian
    t0 = time.perf_counter()
    fn = jax.jit(prep(f, x))
    block(fn(x))
    oneoff = time.perf_counter() - t0
    ts = []
    for _ in range(30):
        t1 = time.perf_counter()
        block(fn(x))
        ts.append(time.perf_counter() - t1)
    print(json.dumps({"oneoff": oneoff, "call": float(np.median(ts)), "version": asdex.__version__
                      if hasattr(asdex, "__version__") else "?"}))


main()
