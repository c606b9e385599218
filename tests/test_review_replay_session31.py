"""Prepared operators after they settle on a recorded graph: what the graph's guard did not see.

Each case gave a wrong Jacobian or Hessian without a word once the products ran as a recorded graph
(call 51 on), while a fresh operator was right: a global module hook registered later, a graph
recorded under autocast replayed outside it, a count read from a captured tensor's values (the
shape of ``nonzero`` / a masked index / ``unique``), a tensor reached through ``p.grad``, and the
random draw of the call that records the graph.
"""

import warnings

import pytest
import torch

import asd
from asd.backends import traced


@pytest.fixture(autouse=True)
def _record_early(monkeypatch):
    """Record the graph after 3 calls instead of 50: the same replay, in a tenth of the time."""
    import asd.operators

    monkeypatch.setattr(traced, "CALLS_BEFORE_TRACING", 3)
    monkeypatch.setattr(asd.operators, "CALLS_BEFORE_TRACING", 3)


def _tracing(op):
    return (getattr(op.state, "fused", None) or op.state.products).tracing


def _settle(op, x, calls=None):
    for i in range(traced.CALLS_BEFORE_TRACING + 10 if calls is None else calls):
        op(x + 0.01 * i)


def test_a_global_module_hook_registered_after_settling_is_applied():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()).double()
    f = lambda x: net(x) * x  # noqa: E731
    x = torch.rand(6, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    _settle(op, x)
    assert _tracing(op).graphs  # the graph answers the calls from here on
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, inp, out: out * 2.0 if isinstance(m, torch.nn.Tanh) else None)
    try:
        with torch.no_grad():
            torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x), rtol=1e-12, atol=1e-12)
    finally:
        handle.remove()
    torch.testing.assert_close(op(x + 1).to_dense(), torch.func.jacrev(f)(x + 1), rtol=1e-12, atol=1e-12)


def test_an_operator_settled_under_autocast_is_exact_outside_it():
    torch.manual_seed(0)
    n = 32
    k = torch.randn(1, 1, 3)
    f = lambda x: torch.tanh(torch.nn.functional.conv1d(x.view(1, 1, n), k, padding=1)).view(n) * x  # noqa: E731
    x = torch.rand(n)
    op = asd.prepare_jacobian(f, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # asd warns inside autocast, as documented
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _settle(op, x)
    ref = torch.func.jacrev(lambda z: torch.tanh(torch.nn.functional.conv1d(
        z.view(1, 1, n), k.double(), padding=1)).view(n) * z)(x.double())
    got = op(x).to_dense().double()
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-6  # float32, not bfloat16


_W = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
_COUNTS = {
    "nonzero": lambda: _W.nonzero().shape[0],
    "masked index": lambda: _W[_W > 0].numel(),
    "unique": lambda: len(torch.unique(_W)),
    "masked_select": lambda: torch.masked_select(_W, _W > 0).numel(),
    "to_sparse": lambda: _W.to_sparse()._nnz(),
    "mask computed inside f": lambda: (_W > 0).nonzero().shape[0],
    "masked view": lambda: _W[1:][_W[1:] > 0].numel() + 1,
}


@pytest.mark.parametrize("count", sorted(_COUNTS))
@pytest.mark.parametrize("kind", ["forward", "reverse", "hessian"])
def test_a_count_read_from_a_captured_tensor_follows_its_values(count, kind):
    read = _COUNTS[count]
    _W.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    x = torch.rand(8, dtype=torch.float64)
    if kind == "hessian":
        def f(z):
            return (z * z * z).sum() * read()
        op = asd.prepare_hessian(f, x)
        dense = torch.func.hessian(f)
    else:
        def f(z):
            return z * z * read()
        op = asd.prepare_jacobian(f, x, mode=kind)
        dense = torch.func.jacrev(f)
    try:
        _settle(op, x)
        _W.fill_(2.0)  # the count changes: 1 -> 4 (unique: 2 -> 1)
        torch.testing.assert_close(op(x).to_dense(), dense(x), rtol=1e-12, atol=1e-12)
    finally:
        _W.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))


def test_a_masked_assignment_runs_as_a_recorded_graph_that_follows_the_mask():
    """``y[mask] = 0`` (the Dirichlet boundary idiom) stays recorded; a mask written in place drops
    the graph, which is recorded again."""
    mask = torch.zeros(12, dtype=torch.bool)
    mask[:3] = True

    def f(z):
        y = z * z
        y[mask] = 0.0
        return y

    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    _settle(op, x)
    tracing = _tracing(op)
    assert tracing.graphs and not tracing.disabled, tracing.error
    mask[3:6] = True
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x), rtol=1e-12, atol=1e-12)
    _settle(op, x)
    assert tracing.graphs and not tracing.disabled, tracing.error


def test_integer_indexing_still_runs_as_a_recorded_graph():
    idx = torch.tensor([3, 0, 1, 2])
    f = lambda z: z[idx] * z  # noqa: E731
    x = torch.rand(4, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    _settle(op, x)
    tracing = _tracing(op)
    assert tracing.graphs and not tracing.disabled, tracing.error
    torch.testing.assert_close(op(x + 2).to_dense(), torch.func.jacrev(f)(x + 2), rtol=1e-12, atol=1e-12)


def test_a_tensor_read_through_grad_is_not_kept_by_the_graph():
    n = 8
    p = torch.nn.Parameter(torch.ones(n, dtype=torch.float64))
    (p * 2.0).sum().backward()
    f = lambda z: z * z * p.grad  # noqa: E731
    x = torch.rand(n, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    _settle(op, x)
    p.grad = None
    (p * 3.0).sum().backward()  # a new grad tensor
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x), rtol=1e-12, atol=1e-12)


def test_a_refused_recording_leaves_the_draws_of_an_unrecorded_call():
    n = 10
    w = torch.ones(n, dtype=torch.float64)

    def f(x):
        return x * x * torch.rand(n, dtype=torch.float64) * float(w.sum()) + torch.roll(x, 1)

    x = torch.rand(n, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode="reverse")
    for i in range(traced.CALLS_BEFORE_TRACING + 5):
        torch.manual_seed(i)
        got = op(x).to_dense()
        torch.manual_seed(i)
        torch.testing.assert_close(got, torch.func.jacrev(f)(x), rtol=1e-12, atol=1e-12, msg=f"call {i}")
    assert _tracing(op).disabled  # float(w.sum()) refuses the recording


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_the_recording_call_draws_what_an_unrecorded_call_draws(mode, device):
    """Before, at and after the recording of the products, every call's Jacobian is that of one
    evaluation of ``f`` from the generator's state at the call, and leaves the generator where that
    evaluation leaves it (the CPU's, or the CUDA device's)."""
    n = 10
    state = torch.cuda.get_rng_state if device == "cuda" else torch.get_rng_state

    def f(x):
        return x * x * torch.rand(n, dtype=torch.float64, device=x.device) + torch.roll(x, 1)

    x = torch.rand(n, dtype=torch.float64, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # forward mode may fall back to reverse with a warning
        op = asd.prepare_jacobian(f, x, mode=mode)
        for i in range(traced.CALLS_BEFORE_TRACING + 10):
            torch.manual_seed(i)
            got = op(x).to_dense()
            after = state()
            torch.manual_seed(i)
            want = torch.func.jacrev(f)(x)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"call {i}")
            assert torch.equal(state(), after), f"call {i}"
