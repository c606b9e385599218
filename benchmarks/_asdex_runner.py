"""Runs inside the JAX environment: asdex on a PEERS.md problem, eager and jitted, timed by the
harness's policy (asd/timing.py, loaded by path: this environment has no torch); prints one JSON line.

Usage: python _asdex_runner.py brusselator|rosenbrock SIZE POLICY_JSON [call] [serve]
(``call``: the prepared call only, no one-off; the JAX default device, a GPU where JAX has one.
``serve``: after the JSON line, stay set up and answer each line read from stdin, a JSON object
``{"label": variant, "policy": policy}``, with one more block of that variant's call timed under
that policy, as one JSON line (the harness's interleaved rounds); end of input ends the process.
``ASD_PEER_CPUS=0,1`` in the environment: run on those CPUs)
"""

import importlib.util
import json
import os
import sys

# the harness's CPUs: with ASD_PEER_CPUS set (a comma-separated list), the process runs on those,
# set before JAX starts (XLA sizes its thread pools from them)
if os.environ.get("ASD_PEER_CPUS"):
    os.sched_setaffinity(0, {int(c) for c in os.environ["ASD_PEER_CPUS"].split(",")})

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import asdex  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def load_timing():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "asd", "timing.py")
    spec = importlib.util.spec_from_file_location("asd_timing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def brusselator(N):
    h2 = (1.0 / (N - 1)) ** 2

    def lap(w):
        return (jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1) + jnp.roll(w, -1, 1) - 4 * w) / h2

    def f(x):
        u, v = x.reshape(2, N, N)
        du = 1 + u * u * v - 4.4 * u + 10 * lap(u)
        dv = 3.4 * u - u * u * v + 10 * lap(v)
        return jnp.stack([du, dv]).reshape(-1)

    return f, 2 * N * N, asdex.jacobian


def rosenbrock(n):
    def f(x):
        return jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)

    return f, n, asdex.hessian


PROBLEMS = {"brusselator": brusselator, "rosenbrock": rosenbrock}


def block(y):
    for leaf in jax.tree_util.tree_leaves(y):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return y


def pair_products_nnz(size):
    """nnz of asdex's global Hessian pattern of sum(x[::2] * x[1::2]) (exact: 2 * size // 2)."""
    f = lambda x: jnp.sum(x[::2] * x[1::2])  # noqa: E731
    x = jnp.ones(size)
    errors = []
    for arg in (x, x.shape):  # the signature differs between versions
        try:
            P = asdex.hessian_sparsity(f, arg)
        except Exception as exc:  # noqa: BLE001 - try the other signature
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        nnz = getattr(P, "nnz", None)
        return int(nnz) if nnz is not None else int(np.count_nonzero(np.asarray(P.todense())))
    return "error: " + " | ".join(errors)


def main():
    problem, size, policy_json = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if problem == "pair_products_nnz":
        print(json.dumps({"nnz": pair_products_nnz(size), "version": getattr(asdex, "__version__", None)}))
        return
    timing = load_timing()
    policy = timing.Policy.from_json(json.loads(policy_json))
    f, n, prepare = PROBLEMS[problem](size)
    x = jnp.asarray(np.random.default_rng(0).random(n))
    variants = {"eager": lambda g: g, "jit": jax.jit}
    call_only = "call" in sys.argv[4:]
    oneoff, call, fns = {}, {}, {}
    for label, wrap in variants.items():
        if not call_only:
            oneoff[label] = timing.measure(lambda: block(wrap(prepare(f, x))(x)), policy).to_json()
        fn = fns[label] = wrap(prepare(f, x))
        call[label] = timing.measure(lambda fn=fn: block(fn(x)), policy).to_json()
    print(json.dumps({"oneoff": oneoff, "call": call, "version": getattr(asdex, "__version__", None),
                      "cpus": len(os.sched_getaffinity(0)),
                      "device": str(x.devices().pop()) if hasattr(x, "devices") else None}), flush=True)
    if "serve" in sys.argv[4:]:
        for line in sys.stdin:
            ask = json.loads(line)
            fn = fns[ask["label"]]
            print(json.dumps(timing.measure(lambda: block(fn(x)), timing.Policy.from_json(ask["policy"])).to_json()),
                  flush=True)


main()
