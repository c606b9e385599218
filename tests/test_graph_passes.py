"""The exact clean-ups of recorded graphs: fewer operations, the same bits."""

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
