"""Defects found in session 39, each with the example that showed it."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import asd
import asd.coloring as C


# -- substitution's rounding is judged at every call, against the smaller row -------------------------

def _chain_with_a_knob(k: int):
    """A chain Hessian (ones off the diagonal) whose entry (k, k+1) is 3 exp(3 x_k): 1e16 at x_k = 12."""
    def f(x):
        return (x[:-1] * x[1:]).sum() + 0.5 * (x * x).sum() + torch.exp(3 * x[k]) * x[k + 1]
    return f


def _points(k: int, n: int = 12):
    x0 = torch.zeros(n, dtype=torch.float64)
    x1 = x0.clone()
    x1[k], x1[k + 1] = 12.0, 0.3
    return x0, x1


@pytest.mark.parametrize("k", [0, 4, 7, 9])
def test_a_later_point_where_substitution_loses_digits_is_caught(k):
    """The rounding was bounded at the first call only: a prepared operator (the float64 default,
    acyclic) returned ones of the chain as 0 or 2 at a later point, without a word. With k = 4 and
    7 the wrong entry sits beside the large row, and the bound was judged against the larger of
    its two rows: the small row lost its digits all the same."""
    f = _chain_with_a_knob(k)
    x0, x1 = _points(k)
    op = asd.prepare_hessian(f, x0)
    assert op.coloring.problem == "acyclic"
    for _ in range(3):  # settled: later calls take the lean path
        torch.testing.assert_close(op(x0).to_dense(), torch.func.hessian(f)(x0))
    with pytest.warns(asd.PrecisionWarning, match="star"):
        H = op(x1).to_dense()
    assert op.coloring.problem == "star"
    torch.testing.assert_close(H, torch.func.hessian(f)(x1), rtol=1e-12, atol=0)


def test_every_path_of_a_call_is_judged():
    f = _chain_with_a_knob(4)
    x0, x1 = _points(4)
    ref = torch.func.hessian(f)(x1)
    explicit = asd.prepare_hessian(f, x0, coloring="acyclic")  # the user's coloring: kept, warned at every call
    for _ in range(3):
        explicit(x0)
    for _ in range(2):
        with pytest.warns(asd.PrecisionWarning, match="coloring='star'"):
            explicit.values(x1, out=torch.empty(explicit.pattern.nnz, dtype=torch.float64))
    assert explicit.coloring.problem == "acyclic"
    op = asd.prepare_hessian(f, x0)
    op.value_grad_hessian(x0)
    with pytest.warns(asd.PrecisionWarning, match="star"):
        _, _, H = op.value_grad_hessian(x1)
    torch.testing.assert_close(H.to_dense(), ref, rtol=1e-12, atol=0)
    asd.clear_cache()
    asd.sparse_hessian(f, x0)
    with pytest.warns(asd.PrecisionWarning):
        H = asd.sparse_hessian(f, x1)
    torch.testing.assert_close(H.to_dense(), ref, rtol=1e-12, atol=0)


def test_jax_later_point_is_caught():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import asd.jax as aj

    k = 4

    def f(x):
        return (x[:-1] * x[1:]).sum() + 0.5 * (x * x).sum() + jnp.exp(3 * x[k]) * x[k + 1]

    jax.config.update("jax_enable_x64", True)  # as the other JAX test modules do at import
    x0 = jnp.zeros(12, dtype=jnp.float64)
    x1 = x0.at[k].set(12.0).at[k + 1].set(0.3)
    op = aj.SparseHessian(f, x0)
    assert op.coloring.problem == "acyclic"
    for _ in range(3):
        op(x0)
    with pytest.warns(asd.PrecisionWarning, match="star"):
        H = op(x1).todense()
    assert op.coloring.problem == "star"
    np.testing.assert_allclose(np.asarray(H), np.asarray(jax.hessian(f)(x1)), rtol=1e-12, atol=0)


# -- the kernels against a plain reference ---------------------------------------------------------------

def _reference_excess(res, v: np.ndarray, eps: float) -> float:
    """The bound walked step by step in Python, each entry judged against the smaller of its rows."""
    from asd.checks import ROW_FLOOR_POWER, tolerance_of

    plan, P = res.plan, res.pattern
    bound = np.zeros(len(v))
    for k in range(len(plan.step_pos)):
        b = abs(v[plan.step_pos[k]]) + sum(bound[plan.dep_pos[d]] for d in range(plan.dep_ptr[k], plan.dep_ptr[k + 1]))
        bound[plan.step_pos[k]] = bound[plan.step_pos_t[k]] = b
    rowmax = np.array([np.abs(v[P.indptr[i]:P.indptr[i + 1]]).max(initial=0.0) for i in range(P.shape[0])])
    floor = np.abs(v).max(initial=0.0) * eps ** ROW_FLOOR_POWER
    worst = 0.0
    for p, (i, j) in enumerate(zip(P.rows, P.indices)):
        scale = max(min(rowmax[i], rowmax[j]), floor)
        if scale > 0:
            worst = max(worst, eps * bound[p] / (tolerance_of(eps) * scale))
    return worst


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 40), chain=st.floats(0, 1), seed=st.integers(0, 10**6), span=st.floats(0, 18))
def test_screened_substitution_agrees_with_a_plain_reference(n, chain, seed, span):
    """On trees (long chains where ``chain`` is near 1) with entries over up to 36 decades."""
    from asd.decompression._substitution_kernels import substitute_screened
    from asd.decompression.device import Decompressor
    from asd.decompression.precision import excess_arguments, substitution_excess

    rng = np.random.default_rng(seed)
    parent = [i - 1 if rng.random() < chain else int(rng.integers(0, i)) for i in range(1, n)]
    A = sp.coo_matrix((np.ones(n - 1), (np.arange(1, n), parent)), shape=(n, n))
    res = C.color((A + A.T + sp.identity(n)).tocsr(), "acyclic")
    v = rng.standard_normal(res.nnz) * 10.0 ** rng.uniform(-span, span, res.nnz)
    v = v + v[res.pattern.transpose_with_positions[1]]
    B = (res.to_scipy(v).toarray() @ res.seeds().T).T
    args = excess_arguments(res.pattern, torch.float64)
    out, excess = substitute_screened(B.reshape(-1), res.plan, *args)
    ref = _reference_excess(res, out, args[3])
    standalone = substitution_excess(res.plan, res.pattern, torch.from_numpy(out))
    assert (excess > 1) == (ref > 1) == (standalone > 1)
    if ref > 1:
        assert excess == pytest.approx(ref, rel=1e-12) and standalone == pytest.approx(ref, rel=1e-12)
    # where no entry exceeds: at most the largest ratio (of the entries loose against themselves only)
    assert excess <= ref * (1 + 1e-12) and standalone <= ref * (1 + 1e-12)
    dec = Decompressor(res, "cpu")
    vals = dec.values(torch.from_numpy(B))
    np.testing.assert_array_equal(vals.numpy(), out)
    assert dec.excess(vals) == excess  # the walk's own bound
    assert dec.excess(vals.clone()) == standalone  # other values: bounded anew


def test_values_written_since_their_walk_are_bounded_anew():
    from asd.decompression.device import Decompressor

    res = C.color(sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(12, 12)).tocsr(), "acyclic")
    r, c = res.pattern.rows, res.pattern.indices
    v = np.ones(res.nnz)
    v[((r == 4) & (c == 5)) | ((r == 5) & (c == 4))] = 1e16  # a large entry feeding a chain of ones
    B = (res.to_scipy(v).toarray() @ res.seeds().T).T
    dec = Decompressor(res, "cpu")
    vals = dec.values(torch.from_numpy(B))
    assert dec.excess(vals) > 1
    vals.fill_(1.0)  # the same tensor, other values: the walk's bound is not theirs
    assert dec.excess(vals) <= 1


def test_an_operator_that_bounds_nothing_skips_the_bound():
    from asd.decompression.device import Decompressor

    f = _chain_with_a_knob(4)
    x0, _ = _points(4)
    assert asd.prepare_hessian(f, x0).decompressor.bounds
    unchecked = asd.prepare_hessian(f, x0, check=False)
    assert unchecked.coloring.problem == "acyclic" and not unchecked.decompressor.bounds
    unchecked(x0)
    assert unchecked.decompressor._judged is None  # no walk of the bound
    assert Decompressor(unchecked.coloring, "cpu").bounds


def test_rounding_excess_leaves_non_finite_values_to_the_probe():
    from asd.decompression._substitution_kernels import rounding_excess
    from asd.decompression.precision import excess_arguments

    res = C.color(sp.diags([1, 1, 1], [-1, 0, 1], shape=(6, 6)).tocsr(), "acyclic")
    v = np.ones(res.nnz)
    v[3] = np.nan
    args = excess_arguments(res.pattern, torch.float64)
    rounding_excess(v, *args[:3], res.plan.step_pos, res.plan.step_pos_t, res.plan.dep_ptr, res.plan.dep_pos,
                    *args[3:])  # no error, whatever the bound


def test_an_infinite_entry_elsewhere_leaves_the_chain_screened():
    """One infinite entry (a decoupled exp(x^2) overflowing) lifted the floor of every row to inf,
    and the chain lost its digits without a word (review of this session's change)."""
    k = 4

    def f(x):
        return ((x[:-2] * x[1:-1]).sum() + 0.5 * (x * x).sum() + torch.exp(3 * x[k]) * x[k + 1]
                + torch.exp(x[13] * x[13]))

    x0 = torch.zeros(14, dtype=torch.float64)
    x1 = x0.clone()
    x1[k], x1[k + 1], x1[13] = 12.0, 0.3, 27.0
    op = asd.prepare_hessian(f, x0)
    for _ in range(3):
        op(x0)
    with pytest.warns(asd.PrecisionWarning, match="star"):
        H = op(x1).to_dense()
    ref = torch.func.hessian(f)(x1)
    finite = torch.isfinite(ref)
    assert H[13, 13].item() == float("inf") and op.coloring.problem == "star"
    torch.testing.assert_close(H[finite], ref[finite], rtol=1e-12, atol=0)


@pytest.mark.parametrize("call", ["sparse_hessian", "gradient_and_hessian"])
def test_a_cached_one_off_warns_once_per_call(call):
    """The one-off path screened the values again after the operator had: two warnings per call
    (and a second bound of the values at every call)."""
    f = _chain_with_a_knob(4)
    x0, x1 = _points(4)
    asd.clear_cache()
    getattr(asd, call)(f, x0, coloring="acyclic")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        getattr(asd, call)(f, x1, coloring="acyclic")
    assert sum(issubclass(w.category, asd.PrecisionWarning) for w in seen) == 1
