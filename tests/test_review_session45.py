"""Findings of session 45's adversarial hunts of the Hessian substitution at NaN points and of
asd.jax: each test fails without its fix."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import asd
from asd.problems import rosenbrock

N = 20


@pytest.mark.parametrize("k", [3, 10])
def test_a_nan_entry_is_not_spread_by_substitution(k):
    # sqrt of a negative x[k]: H[k, k] is NaN; substitution carried it into entries that dense AD
    # (and star) give finite, silently (12 of them at k = 3)
    def f(x):
        return rosenbrock(x) + torch.sqrt(x[k]) + (x[::3] * x[1::3]).sum()

    torch.manual_seed(k)
    x0 = torch.rand(N, dtype=torch.float64) + 0.5
    op = asd.prepare_hessian(f, x0)
    assert op.coloring.problem == "acyclic"
    x = x0.clone()
    x[k] = -1.0
    with pytest.warns(asd.PrecisionWarning, match="NaN or infinite"):
        H = op(x).to_dense()
    assert op.coloring.problem == "star"
    ref = torch.func.hessian(f)(x)
    off = torch.ones_like(ref, dtype=torch.bool)
    off[k, :] = off[:, k] = False
    torch.testing.assert_close(H[off], ref[off], rtol=1e-12, atol=1e-12)
    assert torch.isnan(H[k, k])


jax = pytest.importorskip("jax", reason="asd.jax needs jax (pip install asd[jax])")
import jax.numpy as jnp  # noqa: E402

import asd.jax as aj  # noqa: E402

jax.config.update("jax_enable_x64", True)

W = jnp.arange(6.0) / 10


def _reads_global(x):
    return jnp.tanh(W * x) * jnp.roll(x, 1)


def test_asd_jax_one_call_api_follows_a_rebound_global():
    # JAX keeps its trace of a function object: a new one-call Jacobian (and a new detection) read
    # the global as it was at the first trace
    global W
    x = jnp.linspace(0.1, 1.0, 6)
    old = W
    try:
        first = np.asarray(aj.sparse_jacobian(_reads_global, x).todense())
        np.testing.assert_allclose(first, np.asarray(jax.jacfwd(_reads_global)(x)), rtol=1e-12, atol=1e-12)
        W = jnp.full(6, 7.0)
        got = np.asarray(aj.sparse_jacobian(_reads_global, x).todense())
        np.testing.assert_allclose(got, np.asarray(jax.jacfwd(_reads_global)(x)), rtol=1e-12, atol=1e-12)
        assert not np.allclose(got, first)
    finally:
        W = old


def _nan_case():
    # (the adversarial test's case: its fifth draw)
    import scipy.sparse as sp

    rng = np.random.default_rng(1)
    n = 14
    for _ in range(5):
        A = sp.random(n, n, density=0.2, random_state=int(rng.integers(1 << 30))).toarray()
        k = int(rng.integers(n))
        x0 = rng.uniform(0.5, 1.5, n)
    A = jnp.asarray(A + A.T + np.eye(n))

    def f(x):
        return 0.5 * x @ (A @ x) + jnp.sum(x ** 3) / 6 + jnp.sqrt(x[k])

    x0 = jnp.asarray(x0)
    return f, x0, x0.at[k].set(-1.0), k


def test_asd_jax_check_refuses_values_that_are_nan_where_the_product_is_finite():
    f, x0, x, _ = _nan_case()
    op = aj.prepare_hessian(f, x0, coloring="acyclic", check=True)
    if not isinstance(op.coloring.plan, asd.decompression.plans.SubstitutionPlan):
        pytest.skip("no substitution for this pattern")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", asd.PrecisionWarning)
        try:
            H = np.asarray(op(x).todense())
        except asd.CheckError as exc:
            assert "non-finite" in str(exc)
            return
    # no raise: then no value may be NaN where jax.hessian is finite off row and column k
    ref = np.asarray(jax.hessian(f)(x))
    P = np.asarray(op.pattern.to_scipy().toarray() != 0)
    assert not (P & np.isnan(H) & np.isfinite(ref)).any()


def test_asd_jax_default_hessian_at_a_nan_point_goes_direct():
    f, x0, x, k = _nan_case()
    op = aj.prepare_hessian(f, x0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        H = np.asarray(op(x).todense())
    ref = np.asarray(jax.hessian(f)(x))
    P = np.asarray(op.pattern.to_scipy().toarray() != 0)
    off = np.ones_like(P)
    off[k, :] = off[:, k] = False
    assert not (P & off & np.isnan(H) & np.isfinite(ref)).any()
    np.testing.assert_allclose(H[P & off], ref[P & off], rtol=1e-12, atol=1e-12)


def test_asd_jax_hessian_of_an_f_computing_in_bfloat16_is_prepared():
    def f(x):
        z = x.astype(jnp.bfloat16)
        return jnp.sum(z[1:] * z[:-1]).astype(x.dtype) + jnp.sum(x ** 4)

    x = jnp.linspace(0.2, 1.0, 8)
    for coloring in (None, "star"):
        H = np.asarray(aj.prepare_hessian(f, x, coloring=coloring)(x).todense())
        np.testing.assert_allclose(H, np.asarray(jax.hessian(f)(x)), rtol=1e-2, atol=1e-2)


def test_asd_jax_reduce_precision_counts_as_coarser_arithmetic():
    # lax.reduce_precision to float32's bits on a float64 x: float32's rounding in the products, which
    # the dtype scan missed (the default took acyclic and wiped out rows of 1e-4 beside rows of 1e4)
    n = 10
    c = jnp.full((n - 1,), 1e-4, dtype=jnp.float64).at[0].set(1e4).at[-1].set(1e4)

    def rp(z):
        return jax.lax.reduce_precision(z, exponent_bits=8, mantissa_bits=23)

    def f(x):
        z = rp(x)
        return rp(rp(c * rp(z[:-1] * z[1:])).sum() + rp(0.5e-4 * (z * z)).sum())

    x = jnp.linspace(-1, 1, n, dtype=jnp.float64) + 0.3
    op = aj.prepare_hessian(f, x)
    assert op.coloring.problem == "star"
    with warnings.catch_warnings():
        warnings.simplefilter("error", asd.PrecisionWarning)
        H = np.asarray(op(x).todense())
    np.testing.assert_allclose(H, np.asarray(jax.hessian(f)(x)), rtol=0, atol=1e-12)


def test_asd_jax_reduce_precision_to_the_dtypes_own_bits_changes_nothing():
    def f(x):
        z = jax.lax.reduce_precision(x, exponent_bits=11, mantissa_bits=52)
        return jnp.sum(z[1:] * z[:-1]) + jnp.sum(z ** 4)

    x = jnp.linspace(0.2, 1.0, 12)
    assert aj.prepare_hessian(f, x).coloring.problem == aj.prepare_hessian(lambda v: f(v) * 1.0, x).coloring.problem
    assert aj.prepare_hessian(f, x).coloring.problem == "acyclic"
