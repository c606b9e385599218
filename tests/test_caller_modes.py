"""A mode of the caller's (TorchFunctionMode, TorchDispatchMode) or a default device set around a
settled operator's call: the operator's recorded graph replays the ops f ran at the recording,
without the mode, so such calls are evaluated by the transforms, which run f under it."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import asd
from asd.backends.traced import CALLS_BEFORE_TRACING, _caller_modes, default_device

N = 10


class SinToCos(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.sin:
            func = torch.cos
        return func(*args, **(kwargs or {}))


class DoubleExp(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.exp.default:
            out = out * 2
        return out


def f(x):
    return torch.sin(x) * x.roll(1) + torch.exp(x) * x ** 3


def g(x):
    return (torch.sin(x) * x.roll(1)).sum() + (torch.exp(x) * x ** 4).sum()


def _settled(prepare, fn):
    op = prepare(fn, torch.rand(N, dtype=torch.float64))
    for _ in range(CALLS_BEFORE_TRACING + 5):
        op(torch.rand(N, dtype=torch.float64))
    products = getattr(op.state, "fused", None) or op.state.products
    assert products.tracing.graphs, "the products should be recorded by now"
    return op


@pytest.mark.parametrize("mode", [SinToCos, DoubleExp])
@pytest.mark.parametrize("kind", ["jacobian", "hessian"])
def test_a_mode_around_a_settled_call_is_applied(kind, mode):
    prepare, fn, dense = ((asd.prepare_jacobian, f, torch.func.jacrev) if kind == "jacobian"
                          else (asd.prepare_hessian, g, torch.func.hessian))
    op = _settled(prepare, fn)
    x = torch.rand(N, dtype=torch.float64)
    for _ in range(3):  # the full path, then the lean one
        with mode():
            got = op(x).to_dense()
            want = dense(fn)(x)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # and without it again: the recorded graph answers as before
    torch.testing.assert_close(op(x).to_dense(), dense(fn)(x), rtol=1e-12, atol=1e-12)


class SinToCosDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.sin.default:
            func = torch.ops.aten.cos.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", [SinToCos, SinToCosDispatch])
def test_a_graph_is_not_recorded_under_a_mode_of_the_callers(mode):
    op = asd.prepare_jacobian(f, torch.rand(N, dtype=torch.float64))
    x = torch.rand(N, dtype=torch.float64)
    with mode():
        for _ in range(CALLS_BEFORE_TRACING + 5):
            op(torch.rand(N, dtype=torch.float64))
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x), rtol=1e-12, atol=1e-12)


def test_the_default_device_is_watched():
    # f creates a tensor on the default device: under ``with torch.device("meta")`` f itself fails
    # (a CPU input and a meta constant), and so must the operator instead of replaying the CPU graph
    def h(x):
        return x * torch.ones(N, dtype=x.dtype) + x.roll(1) ** 2

    op = _settled(asd.prepare_jacobian, h)
    x = torch.rand(N, dtype=torch.float64)
    with torch.device("meta"):
        assert default_device() == torch.device("meta") and not _caller_modes()
        with pytest.raises(Exception):
            h(x)
        with pytest.raises(Exception):
            op(x)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(h)(x), rtol=1e-12, atol=1e-12)


def test_caller_modes_sees_function_and_dispatch_modes_but_not_the_default_device():
    assert not _caller_modes() and default_device() is None
    with SinToCos():
        assert _caller_modes()
    with DoubleExp():
        assert _caller_modes()
    with torch.device("cpu"):
        assert not _caller_modes() and default_device() == torch.device("cpu")
