"""Never fail where autograd works: the first evaluation that torch.func refuses falls back to the
other mode, then to plain autograd (asd.backends.autograd_loop), with a warning naming the reason
and ``op.strategy`` saying what runs. Every result is checked against dense float64 autograd."""

import copy

import warnings

import pytest
import torch

import asd
from asd.backends import ForwardJVP
from asd.backends.autograd_loop import AutogradLoop


def dense(f, x):
    return torch.autograd.functional.jacobian(f, x).reshape(-1, x.numel())


def test_randomness_in_forward_mode_falls_back_to_one_forward_pass():
    def f(x):
        torch.manual_seed(3)
        return torch.nn.functional.dropout(x.sin(), 0.5, training=True)

    x = torch.rand(8, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode="forward")
    with pytest.warns(RuntimeWarning, match="random"):
        J = op(x)
    assert op.mode == "reverse" and op.strategy.startswith("vmap(vjp)")
    torch.testing.assert_close(J.to_dense(), dense(f, x))
    torch.testing.assert_close(op(x).to_dense(), dense(f, x))  # settled: no second warning needed


class Cube(torch.autograd.Function):
    """A custom autograd.Function without a vmap rule or forward-mode formula."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * g


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_custom_function_without_vmap_rule(mode):
    f = lambda x: Cube.apply(x[1:]) + x[:-1]  # noqa: E731
    x = torch.rand(7, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode=mode)
    with pytest.warns(RuntimeWarning):
        J = op(x)
    assert op.strategy == "autograd loop"
    torch.testing.assert_close(J.to_dense(), dense(f, x))


def test_batchnorm_in_training_mode_runs_once_like_autograd():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(3).double()
    ref_bn = copy.deepcopy(bn)
    x = torch.rand(5, 3, dtype=torch.float64)
    op = asd.prepare_jacobian(bn, x)
    with pytest.warns(RuntimeWarning):
        J = op(x)
    ref = torch.autograd.functional.jacobian(ref_bn, x).reshape(15, 15)
    torch.testing.assert_close(J.to_dense(), ref)
    assert op.strategy == "autograd loop"
    assert bn.num_batches_tracked.item() == ref_bn.num_batches_tracked.item() == 1


def test_hessian_through_custom_function():
    f = lambda x: Cube.apply(x).sum() * x[0]  # noqa: E731
    x = torch.rand(5, dtype=torch.float64)
    ref = torch.autograd.functional.hessian(f, x)
    op = asd.prepare_hessian(f, x, hvp="forward_over_reverse")
    with pytest.warns(RuntimeWarning):
        H = op(x)
    torch.testing.assert_close(H.to_dense(), ref)
    assert op.strategy == "autograd loop"


def test_hessian_warmup_through_custom_function_falls_back_when_the_batched_products_start():
    from asd.backends.traced import CALLS_BEFORE_TRACING

    f = lambda x: Cube.apply(x).sum() * x[0]  # noqa: E731
    x = torch.rand(5, dtype=torch.float64)
    ref = torch.autograd.functional.hessian(f, x)
    op = asd.prepare_hessian(f, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # double backward evaluates the first calls: nothing to fall back from
        for _ in range(CALLS_BEFORE_TRACING):
            torch.testing.assert_close(op(x).to_dense(), ref)
    with pytest.warns(RuntimeWarning, match="cannot evaluate"):
        H = op(x)  # the batched products' first call (to record them) fails: the loop for good
    torch.testing.assert_close(H.to_dense(), ref)
    assert op.strategy == "autograd loop"
    torch.testing.assert_close(op(x).to_dense(), ref)


def test_explicit_backend_is_never_replaced():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    op = asd.prepare_jacobian(f, torch.rand(4, dtype=torch.float64), mode="forward", backend=ForwardJVP())
    with pytest.raises(RuntimeError, match="random"):
        op(torch.rand(4, dtype=torch.float64))


@pytest.mark.parametrize("coloring", ["column", "row", "bidirectional"])
def test_autograd_loop_backend_on_every_jacobian_coloring(coloring):
    f = lambda x: torch.cat([x[1:] * x[:-1], x.sum(0, keepdim=True) ** 2])  # noqa: E731
    x = torch.rand(7, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, coloring=coloring, backend=AutogradLoop())
    torch.testing.assert_close(op(x).to_dense(), dense(f, x))


@pytest.mark.parametrize("coloring", ["star", "acyclic"])
def test_autograd_loop_backend_on_hessians(coloring):
    f = lambda x: (x[1:] * x[:-1] ** 2).sum() + x.exp().sum()  # noqa: E731
    x = torch.rand(9, dtype=torch.float64)
    op = asd.prepare_hessian(f, x, coloring=coloring, backend=AutogradLoop())
    torch.testing.assert_close(op(x).to_dense(), torch.autograd.functional.hessian(f, x))


def test_a_later_error_of_f_itself_is_raised_not_retried():
    """After a strategy has run, an error that ``f`` raises at a new point is ``f``'s own: it is
    raised as it is, and the operator keeps its strategy."""
    calls = {"n": 0, "fail": False}

    def f(z):
        calls["n"] += 1
        if calls["fail"]:
            raise ValueError("outside the model's domain")
        return z[1:] * z[:-1]

    x = torch.rand(6, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, trace=False)
    op(x)
    strategy, before = op.strategy, calls["n"]
    calls["fail"] = True
    with pytest.raises(ValueError, match="domain"):
        op(x)
    assert op.strategy == strategy and calls["n"] - before <= 2  # the batched try and one plain call
