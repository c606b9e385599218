"""Substitution's rounding screen when ``f`` computes in a coarser dtype than ``x`` (float32 inside
``f`` on a float64 input): the products carry float32's rounding, which substitution feeds from a
large row into small ones, where a direct decompression keeps the small rows' digits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import asd

N = 10


def _path_hessian(scales: torch.Tensor, inner: torch.dtype):
    def f(x):
        z = x.to(inner)
        return ((scales.to(inner) * z[:-1] * z[1:]).sum() + 0.5e-4 * (z * z).sum()).to(x.dtype)
    return f


def _point():
    return torch.linspace(-1, 1, N, dtype=torch.float64) + 0.3


def test_explicit_acyclic_warns_where_float32_inside_f_reaches_small_rows():
    c = torch.full((N - 1,), 1e-4, dtype=torch.float64)
    c[0] = c[-1] = 1e4  # large end rows feed the small middle ones along the path
    f = _path_hessian(c, torch.float32)
    x = _point()
    dense = torch.func.hessian(f)(x)
    op = asd.prepare_hessian(f, x, coloring="acyclic")
    with pytest.warns(asd.PrecisionWarning, match="coloring='star'"):
        H = op(x).to_dense()
    assert (H - dense).abs().max() > 0.5e-4  # what the warning is about: rows of scale 1e-4 lost
    # the default chooses star for such an f: exact
    with warnings.catch_warnings():
        warnings.simplefilter("error", asd.PrecisionWarning)
        torch.testing.assert_close(asd.prepare_hessian(f, x)(x).to_dense(), dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("inner", [torch.float32, torch.float64])
def test_acyclic_of_alike_entries_is_not_flagged(inner):
    torch.manual_seed(0)
    c = 1 + torch.rand(N - 1, dtype=torch.float64)
    f = _path_hessian(c, inner)
    x = _point()
    dense = torch.func.hessian(f)(x)
    op = asd.prepare_hessian(f, x, coloring="acyclic")
    with warnings.catch_warnings():
        warnings.simplefilter("error", asd.PrecisionWarning)
        H = op(x).to_dense()
    eps = torch.finfo(inner).eps
    torch.testing.assert_close(H, dense, rtol=0, atol=20 * eps * dense.abs().max())


def test_asd_jax_explicit_acyclic_warns_where_float32_inside_f_reaches_small_rows():
    jax = pytest.importorskip("jax", reason="asd.jax needs jax (pip install asd[jax])")
    import jax.numpy as jnp

    import asd.jax as aj

    jax.config.update("jax_enable_x64", True)
    c = jnp.full((N - 1,), 1e-4, dtype=jnp.float64).at[0].set(1e4).at[-1].set(1e4)

    def f(x):
        z = x.astype(jnp.float32)
        return ((c.astype(jnp.float32) * z[:-1] * z[1:]).sum() + 0.5e-4 * (z * z).sum()).astype(jnp.float64)

    x = jnp.linspace(-1, 1, N, dtype=jnp.float64) + 0.3
    dense = np.asarray(jax.hessian(f)(x))
    op = aj.prepare_hessian(f, x, coloring="acyclic")
    with pytest.warns(asd.PrecisionWarning, match="coloring='star'"):
        H = np.asarray(op(x).todense())
    assert np.abs(H - dense).max() > 0.5e-4


def test_finite_values_whose_sum_overflows_are_not_called_non_finite():
    # float16 values whose total overflows: the non-finite screen summed them (a false warning)
    torch.manual_seed(0)
    x = torch.rand(500, dtype=torch.float16) + 0.5

    def g(z):
        return (10 * z ** 4).sum() + (50 * z[1:] * z[:-1]).sum() + (50 * z[2:] * z[:-2]).sum()

    op = asd.prepare_hessian(g, x, coloring="acyclic")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        H = op(x)
    assert torch.isfinite(H.values()).all() and float(H.values().float().sum()) > 65504
    assert not any("NaN or infinite" in str(w.message) for w in caught)
