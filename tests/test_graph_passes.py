"""The exact clean-ups of recorded graphs: fewer operations, the same bits."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import asd
from asd.backends.graph_passes import simplify
from asd.problems import brusselator, brusselator_input


def _calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def test_dead_and_repeated_operations_are_removed_bit_for_bit():
    def g(a, b):
        unused = torch.sin(a) * 3  # noqa: F841 - dead
        return (a * b).exp() + (a * b).exp() * torch.cos(b)

    a, b = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    gm = make_fx(g)(a, b)
    before = len(_calls(gm))
    ref = gm(a, b)
    simplify(gm)
    targets = [n.target for n in _calls(gm)]
    assert len(targets) < before
    assert targets.count(torch.ops.aten.exp.default) == 1
    assert torch.ops.aten.sin.default not in targets
    assert torch.equal(gm(a, b), ref)


def test_float_constants_are_compared_by_value_and_sign():
    def g(a):
        return a * 0.0 + a * -0.0 + a * 0.0

    a = torch.tensor([-1.0, 2.0, float("inf")], dtype=torch.float64)
    gm = make_fx(g)(a)
    ref = gm(a)
    simplify(gm)
    muls = [n for n in _calls(gm) if n.target == torch.ops.aten.mul.Tensor]
    assert sorted(repr(n.args[1]) for n in muls) == ["-0.0", "0.0"]
    assert torch.equal(gm(a).isnan(), ref.isnan())
    assert torch.equal(gm(a).nan_to_num(), ref.nan_to_num())


def test_graphs_with_mutation_keep_repeated_reads():
    def g(a):
        t = a.clone()
        r1 = t * 2
        t.add_(1)
        r2 = t * 2
        return r1 + r2

    a = torch.randn(4, dtype=torch.float64)
    gm = make_fx(g)(a)
    ref = gm(a)
    simplify(gm)
    assert sum(n.target == torch.ops.aten.mul.Tensor for n in _calls(gm)) == 2
    assert torch.equal(gm(a), ref)


def test_random_operations_are_never_merged():
    def g(a):
        return torch.rand_like(a) + torch.rand_like(a)

    gm = make_fx(g)(torch.zeros(3))
    simplify(gm)
    assert sum(n.target == torch.ops.aten.rand_like.default for n in _calls(gm)) == 2


def test_recorded_vjp_products_drop_the_primal_output_and_match_the_transforms():
    from asd.backends import traced

    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x, mode="reverse", check=False)
    first = op(x).to_dense()
    for _ in range(traced.CALLS_BEFORE_TRACING + 2):
        last = op(x).to_dense()
    assert torch.equal(first, last)
    J = torch.func.jacrev(f)(x)
    torch.testing.assert_close(last, J, rtol=1e-12, atol=1e-12)


def test_buffer_reuse_writes_only_into_dead_fresh_intermediates():
    from asd.backends.graph_passes import reuse_buffers

    def g(a, b):
        t = a * 2  # fresh, used once: its buffer may take t + b
        s = t + b
        v = a.view(-1)  # a view of an input: never written
        w = v + 1
        keep = b * 3  # used twice: never written
        r = keep + s.reshape(-1)[: keep.numel()].reshape(keep.shape)
        return r + keep, w, (b * 4) + (b * 5)

    a = torch.randn(4, 3, dtype=torch.float64)
    b = torch.randn(4, 3, dtype=torch.float64)
    gm = make_fx(g)(a, b)
    ref = gm(a, b)
    a0, b0 = a.clone(), b.clone()
    reuse_buffers(gm)
    in_place = [n for n in _calls(gm) if n.target._schema.is_mutable]
    assert in_place
    for n in in_place:
        first = n.args[0]
        assert first.op == "call_function" and len(first.users) == 1
    out = gm(a, b)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))
    assert torch.equal(a, a0) and torch.equal(b, b0)


def test_buffer_reuse_keeps_broadcasting_and_promoting_operations_out_of_place():
    from asd.backends.graph_passes import reuse_buffers

    def g(a, b, c):
        small = a.sum(0) * 2  # fresh but broadcast to the output's larger shape
        promoted = (c * 2) + a  # fresh float32 operand, float64 result
        return small + b, promoted

    a = torch.randn(3, 4, dtype=torch.float64)
    b = torch.randn(3, 4, dtype=torch.float64)
    c = torch.randn(3, 4, dtype=torch.float32)
    gm = make_fx(g)(a, b, c)
    ref = gm(a, b, c)
    reuse_buffers(gm)
    assert not [n for n in _calls(gm) if n.target in (torch.ops.aten.add_.Tensor,)]
    out = gm(a, b, c)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))


def _cartpole_constraints(K=6):
    from asd.problems import cartpole

    _, c, x0, _, _ = cartpole(K)
    return c, torch.tensor(x0, dtype=torch.float64) + 0.1 * torch.randn(5 * (K + 1), dtype=torch.float64)


def _mlp():
    g = torch.Generator().manual_seed(1)
    W1 = torch.randn(6, 5, dtype=torch.float64, generator=g)
    W2 = torch.randn(5, 6, dtype=torch.float64, generator=g)

    def f(x):
        h = torch.tanh(x.reshape(4, 5) @ W1.T)
        return (torch.relu(h) @ W2.T + x.reshape(4, 5)).reshape(-1)
    return f, torch.randn(20, dtype=torch.float64)


@pytest.mark.parametrize("case", ["brusselator", "conv", "cartpole", "mlp", "rosenbrock_hessian", "tv_hessian"])
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_replayed_graphs_give_the_transforms_bits(case, mode):
    """After CALLS_BEFORE_TRACING calls the products replay a recorded, simplified graph with reused
    buffers: bit for bit what torch.func gave, and the dense derivative."""
    from asd.backends import traced
    from asd.problems import conv_layer, rosenbrock, total_variation

    hessian = case.endswith("hessian")
    if hessian and mode == "forward":
        pytest.skip("one Hessian strategy per case")
    if case == "brusselator":
        f, x = brusselator(6), brusselator_input(6)
    elif case == "conv":
        f, x = conv_layer("a")
        x = x[..., :10, :10].clone()
    elif case == "cartpole":
        f, x = _cartpole_constraints()
    elif case == "mlp":
        f, x = _mlp()
    elif case == "rosenbrock_hessian":
        f, x = rosenbrock, torch.randn(30, dtype=torch.float64)
    else:
        f, x = total_variation(5), torch.randn(25, dtype=torch.float64)
    if hessian:
        # an explicit flavour: "auto" evaluates the calls before recording by double backward
        op = asd.prepare_hessian(f, x, check=False, hvp="forward_over_reverse")
        dense = torch.func.hessian(f)(x)
    else:
        op = asd.prepare_jacobian(f, x, mode=mode, check=False)
        dense = torch.func.jacrev(f)(x).reshape(-1, x.numel())
    x0 = x.clone()
    first = op.values(x).clone()
    for _ in range(traced.CALLS_BEFORE_TRACING + 3):
        last = op.values(x)
    state = op.state
    products = getattr(state, "fused", None) or getattr(state, "products", None)
    assert products.tracing.graphs and not products.tracing.disabled
    assert torch.equal(first, last)
    assert torch.equal(x, x0)
    torch.testing.assert_close(op(x).to_dense(), dense, rtol=1e-12, atol=1e-12)
