"""Traced evaluation (asd.backends.traced): the recorded graph gives the same bits as torch.func,
and every change of what f reads is seen before a stale graph could answer."""

import random

import pytest
import torch

import asd
from asd.backends.traced import CALLS_BEFORE_TRACING


def _tracings(op):
    state = op.state
    products = getattr(state, "fused", None) or getattr(state, "products", None)
    return products.tracing


def _call(op, x, n=CALLS_BEFORE_TRACING + 2):
    for _ in range(n):
        J = op(x)
    return J


def test_traced_products_are_bit_identical_and_used():
    scale = 3.0
    f = lambda x: torch.sin(x[1:] * x[:-1]) * scale + x[1:] ** 3  # noqa: E731
    x = torch.rand(50, dtype=torch.float64)
    traced, plain = asd.prepare_jacobian(f, x), asd.prepare_jacobian(f, x, trace=False)
    assert torch.equal(_call(traced, x).values(), _call(plain, x).values())
    assert _tracings(traced).graphs and _tracings(plain) is None
    h = lambda x: (x[1:] * x[:-1] ** 2).sum() + x.exp().sum()  # noqa: E731
    H1, H2 = asd.prepare_hessian(h, x), asd.prepare_hessian(h, x, trace=False)
    assert torch.equal(_call(H1, x).values(), _call(H2, x).values())
    torch.testing.assert_close(H1(x).to_dense(), torch.func.hessian(h)(x))


def test_a_changed_float_in_the_closure_is_seen():
    p = {"scale": 2.0}
    f = lambda x: x[1:] * x[:-1] * p["scale"]  # noqa: E731
    x = torch.rand(20, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    _call(op, x)
    for s in (5.0, -1.0, 7.0):
        p["scale"] = s
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))


def test_captured_tensors_updated_in_place_or_rebound():
    state = {"W": torch.rand(20, dtype=torch.float64)}
    f = lambda x: torch.tanh(x * state["W"]).cumsum(0)  # noqa: E731
    x = torch.rand(20, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    _call(op, x)
    state["W"].mul_(3.0)  # in place: the graph holds the tensor by reference
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    state["W"] = torch.rand(20, dtype=torch.float64)  # a new tensor: the fingerprint changes
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))


def test_hidden_state_disables_tracing():
    f = lambda x: x ** 2 * (1.0 + 0.0 * random.random())  # noqa: E731 - reads the random module
    x = torch.rand(5, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    _call(op, x)
    assert _tracings(op).disabled and not _tracings(op).graphs


def test_no_tracing_for_local_patterns_or_when_asked():
    x = torch.rand(6, dtype=torch.float64)
    assert _tracings(asd.prepare_jacobian(torch.relu, x, local=True)) is None
    assert _tracings(asd.prepare_jacobian(torch.sin, x, trace=False)) is None
    with pytest.raises(TypeError, match="trace"):
        asd.prepare_jacobian(torch.sin, x, trace="yes")


def test_changing_arguments_keep_traced_results_right():
    def f(x, t):
        return x[1:] * x[:-1] * t

    x = torch.rand(10, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, args=(1.0,))
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        torch.testing.assert_close(op(x, t).to_dense(), torch.func.jacrev(lambda z: f(z, t))(x))


def test_compile_compiles_the_recorded_graph():
    f = lambda x: torch.sin(x[1:]) * x[:-1]  # noqa: E731
    x = torch.rand(16, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, compile=True)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    tracing = _tracings(op)
    assert tracing.compile and tracing.graphs and not tracing.disabled


@pytest.mark.slow
def test_many_compiled_operators_in_one_process_stay_compiled():
    # each operator compiles its own recorded graph: no shared code object hits dynamo's recompile limit
    ops = []
    for n in range(5, 15):
        f = lambda x: torch.sin(x[1:]) * x[:-1]  # noqa: E731
        x = torch.rand(n, dtype=torch.float64)
        op = asd.prepare_jacobian(f, x, compile=True)
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
        ops.append(op)
    assert all(_tracings(op).graphs and not _tracings(op).disabled for op in ops)


def test_a_recorded_view_of_a_tensor_whose_strides_changed_is_recorded_again():
    """W.t_() keeps the tensor object and shape: a recorded ``view`` of it then raises. The call
    goes through the transforms and the products are recorded again, with no change of strategy."""
    import warnings

    W = torch.rand(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def f(x):
        return torch.tanh(W.reshape(-1) * x) + x.roll(1) * x

    x = torch.rand(16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    op = asd.prepare_jacobian(f, x, mode="forward")
    for _ in range(CALLS_BEFORE_TRACING + 5):
        op(x)
    assert _tracings(op).graphs
    strategy = op.strategy
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        W.t_()
        for _ in range(3):
            torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    assert op.strategy == strategy and _tracings(op).graphs
