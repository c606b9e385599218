"""Session 40's review: a prepared operator's products recorded inside a torch.func transform."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import asd
from asd.backends import traced
from asd.problems import brusselator, brusselator_input


def _products(op):
    return getattr(op.state, "fused", None) or op.state.products


def _jacrev(op, x):
    return torch.func.jacrev(op.values)(x)


def _vmap(op, x):
    return torch.func.vmap(op.values)(torch.stack([x, x * 1.01]))


def _dual(op, x):
    with fwAD.dual_level():
        return op.values(fwAD.make_dual(x, torch.ones_like(x)))


@pytest.mark.parametrize("transform", [_jacrev, _vmap, _dual], ids=["jacrev", "vmap", "forward-ad"])
def test_products_are_not_recorded_inside_a_transform(transform):
    """An operator called inside ``jacrev``/``vmap`` or at a forward-mode AD level for the calls
    that reach the recording: a graph recorded there held the transform's wrapped tensors, the
    products of that point among them, as constants, passed its first-replay comparison at the
    same point and answered every later point with that point's Jacobian, without a word."""
    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x, check=False)
    xa = brusselator_input(8, seed=1)
    for _ in range(traced.CALLS_BEFORE_TRACING + 3):
        transform(op, xa)
    assert not _products(op).tracing.graphs  # recorded only outside a transform
    for seed in (2, 3):
        xb = brusselator_input(8, seed=seed)
        torch.testing.assert_close(op(xb).to_dense(), torch.func.jacfwd(f)(xb), rtol=1e-12, atol=1e-12)
    for _ in range(traced.CALLS_BEFORE_TRACING + 3):  # recorded at the plain calls, replayed inside one
        op.values(xa)
    assert _products(op).tracing.graphs
    xc = brusselator_input(8, seed=4)
    torch.testing.assert_close(torch.func.jacrev(op.values)(xc), torch.func.jacrev(lambda t: op.values(t))(xc))
    torch.testing.assert_close(op(xc).to_dense(), torch.func.jacfwd(f)(xc), rtol=1e-12, atol=1e-12)


def test_a_graph_dropped_and_recorded_again_inside_jacrev_is_not_kept():
    """The reviewer's sequence: ``jacfwd`` around a warm operator drops its graph, ``jacrev``
    around it then reached the recording; every later point got that point's values."""
    f, x0 = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x0)
    for _ in range(traced.CALLS_BEFORE_TRACING + 5):
        op.values(x0)
    xa, xb = brusselator_input(8, seed=1), brusselator_input(8, seed=2)
    torch.func.jacfwd(op.values)(xa)
    torch.func.jacrev(op.values)(xa)
    op.values(xa)
    got = op(xb)
    assert not torch._C._functorch.is_functorch_wrapped_tensor(got.values())
    torch.testing.assert_close(got.to_dense(), torch.func.jacfwd(f)(xb), rtol=1e-12, atol=1e-12)
