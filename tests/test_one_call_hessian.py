"""A Hessian operator prepared for one evaluation (``reuse=False``, what ``sparse_hessian`` does
where it keeps no operator) takes star on a large pattern of a cheap function
(:func:`asd.coloring.choose.one_call_prefers_star`), and is otherwise the operator it always was;
its Hessians match dense ``torch.func.hessian`` in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import asd
from asd.coloring import choose
from asd.coloring.result import AcyclicColoring, StarColoring
from asd.errors import InputError
from asd.problems import rosenbrock


def _heavy(x):
    y = x
    for _ in range(6):
        y = torch.sin(y) * 1.1 + torch.cos(y)
    return (100 * (y[1:] - y[:-1] ** 2) ** 2).sum()


def _x(n, seed=0):
    return torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _dense(f, x):
    return torch.func.hessian(f)(x)


def test_the_rule_reads_entries_and_elements_per_entry():
    big = choose.ONE_CALL_STAR_NNZ
    assert choose.one_call_prefers_star(big, choose.ONE_CALL_STAR_ELEMENTS * big)
    assert not choose.one_call_prefers_star(big, choose.ONE_CALL_STAR_ELEMENTS * big + 1)  # a heavier function
    assert not choose.one_call_prefers_star(big - 1, 0)  # a smaller pattern
    assert not choose.one_call_prefers_star(big, None)  # an operator kept for more calls


@pytest.fixture
def small_threshold(monkeypatch):
    """The rule at the size of a test problem (its entries, not its measured crossover)."""
    monkeypatch.setattr(choose, "ONE_CALL_STAR_NNZ", 100)


@pytest.mark.parametrize("reuse", [True, False])
def test_reuse_false_takes_star_for_a_cheap_function_and_matches_dense(small_threshold, reuse):
    x = _x(200)
    op = asd.prepare_hessian(rosenbrock, x, reuse=reuse)
    assert isinstance(op.coloring, StarColoring if not reuse else AcyclicColoring)
    H = op(x).to_dense()
    torch.testing.assert_close(H, _dense(rosenbrock, x), rtol=1e-12, atol=1e-12)
    x2 = _x(200, seed=3)  # a later call of the one-call operator is still right
    torch.testing.assert_close(op(x2).to_dense(), _dense(rosenbrock, x2), rtol=1e-12, atol=1e-12)


def test_reuse_false_keeps_acyclic_for_a_heavy_function(small_threshold):
    x = _x(200)
    op = asd.prepare_hessian(_heavy, x, reuse=False)
    assert op.trace_info.elements > choose.ONE_CALL_STAR_ELEMENTS * op.pattern.nnz
    assert isinstance(op.coloring, AcyclicColoring)
    torch.testing.assert_close(op(x).to_dense(), _dense(_heavy, x), rtol=1e-10, atol=1e-10)


def test_reuse_false_keeps_acyclic_below_the_threshold():
    x = _x(200)
    op = asd.prepare_hessian(rosenbrock, x, reuse=False)
    assert op.pattern.nnz < choose.ONE_CALL_STAR_NNZ
    assert isinstance(op.coloring, AcyclicColoring)


def test_an_explicit_coloring_wins_over_reuse(small_threshold):
    x = _x(200)
    assert isinstance(asd.prepare_hessian(rosenbrock, x, reuse=False, coloring="acyclic").coloring, AcyclicColoring)


def test_the_elements_are_counted_by_the_trace():
    x = _x(50)
    info = asd.prepare_hessian(rosenbrock, x).trace_info
    # x[:-1] ** 2, the difference, its square, 100 * it, 1 - x[:-1], its square, the sum of the
    # two terms (49 elements each) and the total: slices are views, not counted
    assert 7 * 49 <= info.elements <= 12 * 50


def test_sparse_hessian_without_a_kept_operator_prepares_for_one_call(small_threshold, monkeypatch):
    seen = []
    real = choose.one_call_prefers_star

    def spy(nnz, elements):
        seen.append(elements)
        return real(nnz, elements)

    monkeypatch.setattr(choose, "one_call_prefers_star", spy)
    x = _x(200)
    asd.clear_cache()
    for options in ({"cache": False}, {"local": True}):
        seen.clear()
        H = asd.sparse_hessian(rosenbrock, x, **options)
        assert seen and seen[-1] is not None, options
        torch.testing.assert_close(H.to_dense(), _dense(rosenbrock, x), rtol=1e-12, atol=1e-12)
    seen.clear()
    asd.sparse_hessian(rosenbrock, x)  # kept in the cache for later calls: prepared for many
    assert seen == [None]
    asd.clear_cache()


def test_gradient_and_hessian_without_a_kept_operator_match_dense(small_threshold):
    x = _x(120)
    value, grad, H = asd.gradient_and_hessian(rosenbrock, x, cache=False)
    torch.testing.assert_close(value, rosenbrock(x))
    torch.testing.assert_close(grad, torch.func.grad(rosenbrock)(x))
    torch.testing.assert_close(H.to_dense(), _dense(rosenbrock, x), rtol=1e-12, atol=1e-12)


def test_reuse_must_be_a_bool():
    with pytest.raises(TypeError, match="reuse must be True or False"):
        asd.prepare_hessian(rosenbrock, _x(10), reuse="no")


def test_a_given_pattern_of_an_untraceable_function_keeps_the_default(small_threshold):
    # no trace: nothing counted, so no estimate, and the usual choice
    x = _x(200)
    P = asd.hessian_sparsity(rosenbrock, x)

    def f(z):
        return rosenbrock(torch.as_tensor(z.detach().numpy()) + (z - z.detach()))

    op = asd.prepare_hessian(f, x, pattern=P, reuse=False)
    assert op.trace_info is None
    assert isinstance(op.coloring, AcyclicColoring)
    np.testing.assert_allclose(op(x).to_dense().numpy(), _dense(rosenbrock, x).numpy(), rtol=1e-10, atol=1e-10)


def test_reuse_true_is_the_default_and_shares_its_cache_entry():
    from asd.cache import CACHE

    asd.clear_cache()
    x = _x(30)
    H1 = asd.sparse_hessian(rosenbrock, x)
    H2 = asd.sparse_hessian(rosenbrock, x, reuse=True)
    assert len(CACHE._data) == 1
    torch.testing.assert_close(H1.to_dense(), H2.to_dense())
    asd.clear_cache()


def test_in_place_writes_count_as_their_out_of_place_ops():
    x = _x(100)

    def out_of_place(z):
        y = z
        for _ in range(10):
            y = torch.sin(y * 1.01)
        return (y * y).sum()

    def in_place(z):
        y = z.clone()
        for _ in range(10):
            y.mul_(1.01).sin_()
        return (y * y).sum()

    a = asd.prepare_hessian(out_of_place, x).trace_info.elements
    b = asd.prepare_hessian(in_place, x).trace_info.elements
    assert a >= 20 * 100 and b >= a
