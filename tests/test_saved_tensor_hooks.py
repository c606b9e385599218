"""Saved-tensor hooks active around asd's calls are set aside: every strategy (the cold autograd
loop, the transforms, the recorded graph) returns the derivative ``torch.func`` computes, and the
caller's hooks are back on its stack afterwards."""

from __future__ import annotations

import warnings

import pytest
import torch

import asd
from asd.backends.traced import CALLS_BEFORE_TRACING

N = 10
A = torch._C._autograd


def _pack(t):
    return t * 1.5 if t.is_floating_point() else t  # a hook that changes values


def _unpack(t):
    return t


def f(z):
    return torch.sin(z) * z.roll(1) + z ** 3


def g(z):
    return (torch.sin(z) * z.roll(1)).sum() + (z ** 4).sum()


CASES = {"jacobian": (asd.prepare_jacobian, f, torch.func.jacrev),
         "hessian": (asd.prepare_hessian, g, torch.func.hessian)}


@pytest.mark.parametrize("hooks", ["value-changing", "save_on_cpu"])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_calls_under_saved_tensor_hooks_give_the_derivative(kind, hooks):
    prepare, fn, dense = CASES[kind]
    context = ((lambda: torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)) if hooks == "value-changing"
               else torch.autograd.graph.save_on_cpu)
    torch.manual_seed(0)
    x = torch.randn(N, dtype=torch.float64)
    want = dense(fn)(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no strategy given up for the hooks
        with context():
            op = prepare(fn, torch.randn(N, dtype=torch.float64))
            top = A._top_saved_tensors_default_hooks(False)
            for i in range(CALLS_BEFORE_TRACING + 5):
                got = op(x + 0.0)
                if i in (0, 1, CALLS_BEFORE_TRACING + 4):
                    torch.testing.assert_close(got.to_dense(), want, rtol=1e-12, atol=1e-12)
            assert op.check(x).ok
            assert A._top_saved_tensors_default_hooks(False) == top  # the caller's hooks, back
        assert A._top_saved_tensors_default_hooks(False) is None
    one_off = asd.sparse_jacobian if kind == "jacobian" else asd.sparse_hessian
    with context():
        torch.testing.assert_close(one_off(fn, x, cache=False).to_dense(), want, rtol=1e-12, atol=1e-12)


def test_the_hooks_stack_is_restored_when_the_call_raises():
    op = asd.prepare_jacobian(f, torch.randn(N, dtype=torch.float64))
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        top = A._top_saved_tensors_default_hooks(False)
        with pytest.raises(asd.InputError):
            op(torch.randn(N + 1, dtype=torch.float64))
        assert A._top_saved_tensors_default_hooks(False) == top
