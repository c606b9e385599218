"""Overwriting scatters with repeated indices: PyTorch's reverse mode is wrong, forward mode right.

``index_put`` (``y[idx] = v``), ``scatter``, ``put`` and ``index_copy`` write one source element
where an index repeats, yet their backward formulas hand the written element's derivative to every
source element aimed at it. asd notes the gap (:mod:`asd.detection.ad_gaps`) and evaluates a
Jacobian in forward mode; a Hessian, whose products all differentiate a gradient, is refused.
References are central differences (``jacrev`` is the wrong formula itself).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import asd
from asd.detection import jacobian_pattern
from asd.errors import ADGapError, ADGapWarning
from test_strided_storage import _central as central_differences

torch.manual_seed(0)
X = torch.randn(6, dtype=torch.float64)
DUP = torch.tensor([0, 1, 1, 3, 3, 3])
UNIQUE = torch.tensor([4, 1, 0, 3, 2, 5])


def _setitem(idx):
    def f(x):
        y = torch.zeros(6, dtype=x.dtype)
        y[idx] = x * x
        return y
    return f


def _ops(idx):
    return {
        "index_put": lambda x: torch.zeros(6, dtype=x.dtype).index_put((idx,), x * x),
        "setitem": _setitem(idx),
        "scatter": lambda x: torch.zeros(6, dtype=x.dtype).scatter(0, idx, x * x),
        "put": lambda x: torch.zeros(6, dtype=x.dtype).put(idx, x * x),
        "index_copy": lambda x: torch.zeros(6, 2, dtype=x.dtype).index_copy(0, idx, torch.stack([x * x, x.sin()], 1)),
        "index_put_2d": lambda x: torch.zeros(3, 3, dtype=x.dtype).index_put((idx // 3, idx % 3), x.exp()),
    }


def _central(f, x):
    return torch.from_numpy(central_differences(f, x))


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(batching rule|Sparse CSR|invariant checks).*")
        yield


@pytest.mark.parametrize("name", sorted(_ops(DUP)))
def test_repeated_indices_give_the_derivative_of_what_was_written(name):
    f = _ops(DUP)[name]
    want = _central(f, X)
    assert (torch.func.jacrev(f)(X).reshape(want.shape) - want).abs().max() > 0.5  # PyTorch's reverse formula
    _, info = jacobian_pattern(f, X, return_info=True)
    assert info.gaps, name
    torch.testing.assert_close(asd.sparse_jacobian(f, X, cache=False).to_dense(), want, atol=1e-7, rtol=1e-6)
    op = asd.prepare_jacobian(f, X)
    assert op.mode == "forward"
    for k in range(60):  # past the warm-up and into the recorded graph
        z = X + 0.01 * k
        torch.testing.assert_close(op(z).to_dense(), _central(f, z), atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("name", ["index_put", "scatter"])
def test_an_explicit_reverse_mode_is_replaced_with_a_warning(name):
    f = _ops(DUP)[name]
    with pytest.warns(ADGapWarning, match="repeated .or unknown. indices"):
        op = asd.prepare_jacobian(f, X, mode="reverse")
    assert op.mode == "forward"
    torch.testing.assert_close(op(X).to_dense(), _central(f, X), atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(_ops(DUP)))
def test_a_hessian_through_repeated_indices_is_refused(name):
    f = _ops(DUP)[name]
    with pytest.raises(ADGapError, match="repeated .or unknown. indices.*indices without repeats"):
        asd.sparse_hessian(lambda z: f(z).pow(2).sum(), X, cache=False)


@pytest.mark.parametrize("name", sorted(_ops(UNIQUE)))
def test_indices_without_repeats_keep_every_mode(name):
    f = _ops(UNIQUE)[name]
    _, info = jacobian_pattern(f, X, return_info=True)
    assert not info.gaps
    op = asd.prepare_jacobian(f, X, mode="reverse")
    assert op.mode == "reverse"
    torch.testing.assert_close(op(X).to_dense(), torch.func.jacfwd(f)(X).reshape(-1, 6))
    H = asd.sparse_hessian(lambda z: f(z).pow(2).sum(), X, cache=False).to_dense()
    torch.testing.assert_close(H, torch.func.hessian(lambda z: f(z).pow(2).sum())(X))


def test_indices_computed_from_the_input_count_as_repeated_unless_traced_at_a_point():
    def f(x):
        return torch.zeros(6, dtype=x.dtype).index_put((x.argsort(),), x * x)

    _, info = jacobian_pattern(f, X, return_info=True)
    assert info.gaps  # unknown under global tracing
    _, info = jacobian_pattern(f, X, local=True, return_info=True)
    assert not info.gaps  # a permutation at this point
    torch.testing.assert_close(asd.sparse_jacobian(f, X, cache=False).to_dense(), torch.func.jacfwd(f)(X))


def test_accumulating_or_constant_sources_are_no_gap():
    acc = lambda x: torch.zeros(6, dtype=x.dtype).index_put((DUP,), x * x, accumulate=True)  # noqa: E731
    const = lambda x: x.index_put((DUP,), torch.arange(6.0, dtype=x.dtype))  # noqa: E731
    for f in (acc, const):
        _, info = jacobian_pattern(f, X, return_info=True)
        assert not info.gaps
        torch.testing.assert_close(asd.sparse_jacobian(f, X, cache=False, mode="reverse").to_dense(),
                                   _central(f, X), atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(_ops(DUP)))
def test_the_probe_checks_forward_mode_without_the_wrong_reverse_formula(name):
    """Checking a forward-mode result against PyTorch's wrong VJP raised CheckError on a right
    Jacobian (found by review): the probe avoids reverse mode too, with an uncompressed JVP."""
    f = _ops(DUP)[name]
    want = _central(f, X)
    torch.testing.assert_close(asd.sparse_jacobian(f, X, cache=False, check=True).to_dense(), want,
                               atol=1e-7, rtol=1e-6)
    op = asd.prepare_jacobian(f, X, local=True)  # checked at every call
    for k in range(3):
        torch.testing.assert_close(op(X + 0.1 * k).to_dense(), _central(f, X + 0.1 * k), atol=1e-7, rtol=1e-6)
    assert op.last_check.ok and "Jacobian-vector" in op.last_check.product


@pytest.mark.parametrize("f", [
    lambda x: (x * x).index_put((x.argmax().reshape(1),), x.sum().reshape(1)).pow(2).sum(),  # one position
    lambda x: (x * 2).index_put((x > 0.5,), x.sum()).pow(2).sum(),  # a mask
    lambda x: (lambda s: torch.zeros_like(s).scatter(1, s.argmax(1, keepdim=True), s.amax(1, keepdim=True)))(
        x.reshape(2, 3).softmax(1)).pow(2).sum(),  # one index along scatter's dim (a straight-through one-hot)
], ids=["single_index", "mask", "scatter_one_per_row"])
def test_unknown_indices_that_cannot_repeat_keep_hessians(f):
    """Index values computed from the input are unknown under global tracing, yet a single index, a
    boolean mask or one index along scatter's dim cannot repeat: such Hessians were refused (review)."""
    H = asd.sparse_hessian(f, X, cache=False).to_dense()
    torch.testing.assert_close(H, torch.func.hessian(f)(X))


def test_a_computed_permutation_is_refused_globally_and_read_locally():
    def h(x):
        y = torch.zeros_like(x)
        y[x.argsort()] = x.sin()
        return (y * y.roll(1)).sum()

    with pytest.raises(ADGapError, match="local=True"):
        asd.sparse_hessian(h, X, cache=False)
    torch.testing.assert_close(asd.sparse_hessian(h, X, cache=False, local=True).to_dense(),
                               torch.func.hessian(h)(X))
