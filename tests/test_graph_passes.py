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


def test_buffer_reuse_follows_in_place_steps_on_a_fresh_buffer():
    """``(a * b).add_(1.0)`` returns the fresh product's buffer, written: a result used once may take
    it again (``+ c`` in place), unless the product is read elsewhere or the chain starts at an input."""
    from asd.backends.graph_passes import reuse_buffers

    def g(a, b, c):
        chained = (a * b).add_(1.0).mul_(c) + c  # the buffer of a * b, twice written, then once more
        t = a * c
        shared = t.add_(b) + t.sum()  # t is read again after the in-place step: keeps its own result
        base = a.clone()
        from_input = a.add_(0.0) + b  # an input written in place: never taken
        return chained, shared, base, from_input

    a, b, c = (torch.randn(3, 4, dtype=torch.float64) for _ in range(3))
    gm = make_fx(g)(a.clone(), b, c)
    ref = gm(a.clone(), b, c)
    reuse_buffers(gm)
    out = gm(a.clone(), b, c)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))
    # the chain on the fresh product ends in place; the shared and the input-based sums stay out of place
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert [n.target for n in (outputs[0], outputs[1], outputs[3])] == [
        torch.ops.aten.add_.Tensor, torch.ops.aten.add.Tensor, torch.ops.aten.add.Tensor]


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


def _joined(gm, args):
    from torch.fx.passes.shape_prop import ShapeProp

    from asd.backends.graph_passes import join_in_place

    ShapeProp(gm).propagate(*args)
    return join_in_place(gm)


_JOIN_CASES = {
    # parts computed by pointwise chains (in-place steps, identity views) straight into the join
    "stack": (lambda a, b: torch.stack([(a * b).add_(1.5), (a + b).mul_(b).permute(0, 1)], 1), 1),
    "stack_first": (lambda a, b: torch.stack([torch.sin(a), b * 2.0, (a - b).view(3, 4)]), 1),
    "stack_last": (lambda a, b: torch.stack([a * a, (b - 1.0).div_(a)], -1), 1),
    # strided slots take only one correctly rounded operation per element (see the test below)
    "stack_last_exp": (lambda a, b: torch.stack([a * a, b.exp()], -1), 0),
    "stack_last_alpha": (lambda a, b: torch.stack([a * a, torch.add(a, b, alpha=3.0)], -1), 0),
    "cat_first_exp": (lambda a, b: torch.cat([a.exp(), b.sin()], 0), 1),
    # an op whose out= overload takes other argument types (clamp_min.Tensor -> a Scalar min)
    "clamp_tensor_bound": (lambda a, b: torch.stack([torch.clamp_min(a, b), b * 2.0]), 0),
    "cat": (lambda a, b: torch.cat([a * b, (b - 1.0).div_(a)], 0), 1),
    # the inner cat's parts only: the outer cat's second part is the inner's buffer, not a pointwise result
    "cat_nested": (lambda a, b: torch.cat([a + 1.0, torch.cat([a * b, b.neg()], 1)], 1), 1),
    # left alone: a part read elsewhere, a reordering view, an input, one part twice, a promoted part
    "part_read_twice": (lambda a, b: (lambda c: torch.stack([c, b + 1.0]) + c.sum())(a * b), 0),
    "part_returned": (lambda a, b: (lambda c: (torch.stack([c, b * 3.0]), c))(a * 2.0), 0),
    "transposed_part": (lambda a, b: torch.stack([(a * b).reshape(4, 3), (a + b).t()]), 0),
    "input_part": (lambda a, b: torch.stack([a, b * 2.0]), 0),
    "same_part_twice": (lambda a, b: (lambda c: torch.stack([c, c]))(a * b), 0),
    "promoted": (lambda a, b: torch.cat([a.float() * 2.0, b * 2.0]), 0),
}


def _joins(gm):
    return sum(n.target in (torch.ops.aten.stack.default, torch.ops.aten.cat.default) for n in _calls(gm))


@pytest.mark.parametrize("name", sorted(_JOIN_CASES))
def test_join_in_place_computes_parts_into_the_joined_buffer_bit_for_bit(name):
    """A stack or cat whose parts are fresh pointwise results is removed: each part's op writes
    into its slot of the joined buffer (``out=``); every other join is left as it was."""
    fn, joins = _JOIN_CASES[name]
    g = torch.Generator().manual_seed(3)
    a, b = (torch.rand(3, 4, dtype=torch.float64, generator=g) + 0.5 for _ in range(2))
    gm = make_fx(fn)(a, b)
    expected, before = fn(a, b), _joins(gm)
    assert _joined(gm, [a, b]) == joins
    assert _joins(gm) == before - joins
    outs = lambda v: (v,) if isinstance(v, torch.Tensor) else tuple(v)  # noqa: E731
    for e, r in zip(outs(expected), outs(gm(a, b))):  # the same bits (-0.0 is not 0.0)
        ints = {8: torch.int64, 4: torch.int32}[e.element_size()]
        assert e.shape == r.shape and e.dtype == r.dtype
        assert torch.equal(e.contiguous().view(ints), r.contiguous().view(ints))
    a2, b2 = a * 1.7, b - 0.3
    for e, r in zip(outs(fn(a2, b2)), outs(gm(a2, b2))):
        torch.testing.assert_close(r, e, rtol=0, atol=0)


@pytest.mark.parametrize("op", [torch.sinh, torch.sigmoid, torch.exp, lambda t: torch.pow(t, 2.5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_join_in_place_keeps_transcendentals_out_of_strided_slots(op, dtype):
    """Written into a strided slot (a stack along the last dimension), such ops ran PyTorch's scalar
    loop where a fresh buffer gets the vectorized one, whose last bits differ (sinh: 2112 of 8192
    elements): they keep their own buffer there; along the first dimension they are joined."""
    g = torch.Generator().manual_seed(5)
    a, b = (torch.rand(64, 64, dtype=torch.float64, generator=g).to(dtype) * 3 for _ in range(2))
    for dim, joins in ((-1, 0), (0, 1)):
        fn = lambda a, b: torch.stack([op(a), op(b)], dim)  # noqa: E731
        gm = make_fx(fn)(a, b)
        assert _joined(gm, [a, b]) == joins
        ints = {8: torch.int64, 4: torch.int32}[a.element_size()]
        assert torch.equal(gm(a, b).view(ints), fn(a, b).view(ints))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_join_in_place_keeps_reduced_precision_out_of_strided_slots(dtype):
    """Into a strided slot PyTorch's scalar loop gave another NaN than the vectorized loop into a
    fresh buffer (bfloat16 inf * 0: 0x7fc0 against 0xffff, the sign bit; float16 NaN payloads)."""
    a = torch.full((64, 64), float("inf"), dtype=dtype)
    b = torch.zeros(64, 64, dtype=dtype)
    fn = lambda a, b: torch.stack([a * b, a - b], -1)  # noqa: E731
    gm = make_fx(fn)(a, b)
    assert _joined(gm, [a, b]) == 0
    assert torch.equal(gm(a, b).view(torch.int16), fn(a, b).view(torch.int16))


def test_join_in_place_runs_the_recorded_operations_where_derivatives_are_recorded():
    """A part whose chain ends with an in-place step after a later, gradient-recording part was
    written raised (the buffer then recorded a gradient); under forward-mode AD or a torch.func
    transform out= records nothing either. Such calls run the recorded operations and join."""
    import torch.autograd.forward_ad as fwAD

    w = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)

    def fn(a, b):
        p1 = a * b
        p2 = a + w
        p1.add_(1.0)
        return torch.stack([p1, p2, b * 3.0])

    a, b = torch.rand(3, 4, dtype=torch.float64), torch.rand(3, 4, dtype=torch.float64)
    gm = make_fx(fn)(a, b)
    assert _joined(gm, [a, b]) == 1
    got, want = gm(a, b), fn(a, b)
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got.sum(), w)[0], torch.autograd.grad(want.sum(), w)[0])
    with torch.no_grad():
        assert torch.equal(gm(a, b), fn(a, b))
    t = torch.rand(3, 4, dtype=torch.float64)
    with torch.no_grad(), fwAD.dual_level():
        got = fwAD.unpack_dual(gm(fwAD.make_dual(a, t), b))
        want = fwAD.unpack_dual(fn(fwAD.make_dual(a, t), b))
        assert torch.equal(got.primal, want.primal) and torch.equal(got.tangent, want.tangent)
    with torch.no_grad():
        batch = torch.rand(5, 3, 4, dtype=torch.float64)
        assert torch.equal(torch.func.vmap(gm, (0, None))(batch, b), torch.func.vmap(fn, (0, None))(batch, b))


def test_join_in_place_keeps_gradients_of_operands_that_record_them():
    """Where an operand records a gradient, the part is computed and copied into its slot (``out=``
    records none): the joined result has the same gradient."""
    w = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    fn = lambda a, b: torch.stack([a * w, (b + w).mul_(2.0)])  # noqa: E731
    a, b = torch.rand(3, 4, dtype=torch.float64), torch.rand(3, 4, dtype=torch.float64)
    gm = make_fx(fn)(a, b)
    assert _joined(gm, [a, b]) == 1
    got, want = gm(a, b), fn(a, b)
    assert torch.equal(got, want) and got.requires_grad
    (gw,) = torch.autograd.grad((got * got).sum(), w)
    (ww,) = torch.autograd.grad((want * want).sum(), w)
    assert torch.equal(gw, ww)
    with torch.no_grad():
        assert torch.equal(gm(a, b), fn(a, b))
    # the gradient-recording part first: the joined buffer then records one, and a later part's
    # out= call raised (eager replay then gave up its graphs for good)
    fn2 = lambda a, b: torch.stack([(a + w).mul_(2.0), a * b, b - 1.0])  # noqa: E731
    gm2 = make_fx(fn2)(a, b)
    assert _joined(gm2, [a, b]) == 1
    got, want = gm2(a, b), fn2(a, b)
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got.sum(), w)[0], torch.autograd.grad(want.sum(), w)[0])


def _brusselator_replay(mode=None):
    """``(f, op, products, replay)`` of a B1 operator (N = 16) whose products are replayed eagerly
    by a specialized variant."""
    from asd.backends import traced

    f, x = brusselator(16), brusselator_input(16)
    op = asd.prepare_jacobian(f, x, check=False, **({"mode": mode} if mode else {}))
    for _ in range(traced.CALLS_BEFORE_TRACING + 2):
        op.values(x)
    products = getattr(op.state, "fused", None) or op.state.products
    replay = products.tracing.replay
    assert replay.chosen in ("folded", "pushed"), replay.notes
    return f, op, products, replay


@pytest.mark.parametrize("mode, absent, jac", [
    # forward mode stacks du and dv: computed into one buffer (join_in_place)
    ("forward", (torch.ops.aten.stack.default, torch.ops.aten.cat.default), torch.func.jacfwd),
    # reverse mode through u, v = y[0], y[1] sums two select_backward tensors: one buffer (sum_slots)
    ("reverse", (torch.ops.aten.select_backward.default,), torch.func.jacrev),
])
def test_the_brusselator_replay_writes_both_species_into_one_buffer(mode, absent, jac):
    f, op, products, replay = _brusselator_replay(mode)
    targets = [n.target for n in _calls(replay.fast.gm)]
    assert not set(absent) & set(targets), replay.fast.gm.code
    x2 = brusselator_input(16, seed=5)
    torch.testing.assert_close(op(x2).to_dense(), jac(f)(x2), rtol=0, atol=1e-14)


def _slot_sums(gm, args):
    from torch.fx.passes.shape_prop import ShapeProp

    from asd.backends.graph_passes import sum_slots

    ShapeProp(gm).propagate(*args)
    return sum_slots(gm)


_aten = torch.ops.aten
_SB, _SLB = _aten.select_backward.default, _aten.slice_backward.default
_SLOT_CASES = {
    # reverse mode through y[0], y[1]: every slot written once, no zero tensor per part
    "two_selects": (lambda a, b: _SB(a, [2, 3, 4], 0, 0) + _SB(b, [2, 3, 4], 0, 1), [(3, 4), (3, 4)], 1),
    # a slot left out stays +0.0; a negative index; the sum nested either way
    "selects_partial": (lambda a, b, c: (_SB(a, [3, 4, 4], 2, -1) + _SB(b, [3, 4, 4], -1, 0)) + _SB(c, [3, 4, 4], 2, 1),
                        [(3, 4), (3, 4), (3, 4)], 1),
    "three_of_five": (lambda a, b, c: _SB(a, [5, 6], 0, 4) + (_SB(b, [5, 6], 0, 0) + _SB(c, [5, 6], 0, 2)),
                      [(6,), (6,), (6,)], 1),
    # y[:, :2] and y[:, 2:] (PyTorch's end for an open slice is INT64_MAX), and a select beside a slice
    "slices": (lambda a, b: _SLB(a, [4, 6], 1, 0, 2, 1) + _SLB(b, [4, 6], 1, 2, 9223372036854775807, 1),
               [(4, 2), (4, 4)], 1),
    "slice_and_select": (lambda a, b: _SLB(a, [5, 3], 0, 1, 5, 1) + _SB(b, [5, 3], 0, 0), [(4, 3), (3,)], 1),
    # left alone: overlapping slots, other dimensions, a stepped slice, a part read elsewhere, alpha
    "overlap": (lambda a, b: _SB(a, [2, 3], 0, 1) + _SB(b, [2, 3], 0, -1), [(3,), (3,)], 0),
    "overlapping_slices": (lambda a, b: _SLB(a, [4, 3], 0, 0, 3, 1) + _SLB(b, [4, 3], 0, 2, 4, 1), [(3, 3), (2, 3)], 0),
    "other_dims": (lambda a, b: _SB(a, [3, 3], 0, 0) + _SB(b, [3, 3], 1, 1), [(3,), (3,)], 0),
    "stepped": (lambda a, b: _SLB(a, [4, 3], 0, 0, 4, 2) + _SB(b, [4, 3], 0, 1), [(2, 3), (3,)], 0),
    "part_read_twice": (lambda a, b: (lambda s: (s + _SB(b, [2, 3], 0, 1), s))(_SB(a, [2, 3], 0, 0)),
                        [(3,), (3,)], 0),
    "alpha": (lambda a, b: torch.add(_SB(a, [2, 3], 0, 0), _SB(b, [2, 3], 0, 1), alpha=2.0), [(3,), (3,)], 0),
    "same_part_twice": (lambda a: (lambda s: s + s)(_SB(a, [2, 3], 0, 0)), [(3,)], 0),
    "broadcast_gradient": (lambda a, b: _SB(a, [2, 3, 4], 0, 0) + _SB(b, [2, 3, 4], 0, 1), [(1, 4), (3, 4)], 0),
}


def _bits(t):
    return t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(_SLOT_CASES))
def test_sum_slots_writes_each_slot_once_bit_for_bit(name, dtype):
    """A sum of gradients scattered into disjoint slots becomes one buffer written slot by slot; the
    result keeps every bit of the recorded sum, ``-0.0`` (0.0 + -0.0 is +0.0), NaN and inf included."""
    fn, shapes, replaced = _SLOT_CASES[name]
    g = torch.Generator().manual_seed(7)
    args = [torch.randn(s, dtype=torch.float64, generator=g).to(dtype) for s in shapes]
    gm = make_fx(fn)(*args)
    assert _slot_sums(gm, args) == replaced
    backwards = sum(n.target in (_SB, _SLB) for n in _calls(gm))
    assert (backwards == 0) == bool(replaced)
    outs = lambda v: (v,) if isinstance(v, torch.Tensor) else tuple(v)  # noqa: E731
    special = [a.clone() for a in args]
    for a in special:
        flat = a.view(-1)
        flat[0], flat[-1] = -0.0, float("nan")
        if flat.numel() > 2:
            flat[1] = float("-inf")
    for point in (args, special):
        for e, r in zip(outs(fn(*point)), outs(gm(*point))):
            assert e.shape == r.shape and e.dtype == r.dtype
            assert torch.equal(_bits(e), _bits(r))


def test_sum_slots_keeps_float16_and_the_recorded_operations_where_gradients_are_recorded():
    a, b = torch.randn(3, dtype=torch.float16), torch.randn(3, dtype=torch.float16)
    fn = lambda a, b: _SB(a, [2, 3], 0, 0) + _SB(b, [2, 3], 0, 1)  # noqa: E731
    assert _slot_sums(make_fx(fn)(a, b), [a, b]) == 0
    a, b = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    gm = make_fx(fn)(a, b)
    assert _slot_sums(gm, [a, b]) == 1
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    got, want = gm(a * w, b), fn(a * w, b)
    assert got.requires_grad and torch.equal(got, want)
    assert torch.equal(torch.autograd.grad((got * got).sum(), w)[0], torch.autograd.grad((want * want).sum(), w)[0])
    with torch.no_grad():
        batch = torch.randn(4, 3, dtype=torch.float64)
        assert torch.equal(torch.func.vmap(gm, (0, None))(batch, b), torch.func.vmap(fn, (0, None))(batch, b))


def _propagated(gm, args):
    from torch.fx.passes.shape_prop import ShapeProp

    ShapeProp(gm).propagate(*args)
    return gm


def _storage(t):
    return t.untyped_storage().data_ptr()


_VIEW_CASES = {
    # (function, views dropped, view-like nodes left)
    "same_shape_view": (lambda a: a.view(3, 4) * 2.0, 1, 0),
    "identity_permute": (lambda a: a.permute(0, 1) + 1.0, 1, 0),
    "same_shape_expand": (lambda a: a.expand(3, 4) - 1.0, 1, 0),
    "flat_reshape_of_flat": (lambda a: (a.reshape(-1) * 3.0).reshape(-1), 1, 1),
    # a chain of reshapes of a contiguous tensor: one view of it
    "view_chain": (lambda a: a.view(12).view(2, 6).view(6, 2) * 2.0, 2, 1),
    # left alone: the elements of an unbind (as selects, their gradient's zeros would change sign)
    "unbind": (lambda a: (lambda u: u[0] * -0.0 + u[2] * 2.0)(a.unbind(0)), 0, 1),
    # left alone: a view that reorders, a chain over a transposed tensor
    "transpose": (lambda a: a.permute(1, 0) * 2.0, 0, 1),
    "chain_of_transposed": (lambda a: (a.t() * 1.0).t().reshape(12) + 1.0, 0, 3),
}


@pytest.mark.parametrize("name", sorted(_VIEW_CASES))
def test_identity_views_are_dropped_bit_for_bit(name):
    """A view that changes neither shape nor strides is its operand and a chain of reshapes of a
    contiguous tensor is one: the same elements in the same memory, one dispatch less each, and
    the same gradient bits where the call records them (an unbind's elements stay: as selects,
    a zero gradient of theirs would change sign)."""
    from asd.backends.graph_passes import drop_identity_views

    fn, dropped, left = _VIEW_CASES[name]
    a = torch.randn(3, 4, dtype=torch.float64)
    gm = _propagated(make_fx(fn)(a), [a])
    want = gm(a)
    w = a.clone().requires_grad_()
    grad_want = torch.autograd.grad(gm(w).sum(), w)[0]
    assert drop_identity_views(gm) == dropped, gm.code
    views = {torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten.permute.default,
             torch.ops.aten.expand.default, torch.ops.aten.select.int, torch.ops.aten.t.default,
             torch.ops.aten.unbind.int}
    assert sum(n.target in views for n in _calls(gm)) == left, gm.code
    got = gm(a)
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    grad_got = torch.autograd.grad(gm(w).sum(), w)[0]
    assert torch.equal(grad_got.view(torch.int64), grad_want.view(torch.int64))


def test_dropped_views_keep_what_aliases_the_input():
    """A view returned (or written through) still shares the input's memory: the replay's copy of
    a result that aliases its input depends on it."""
    from asd.backends.graph_passes import drop_identity_views

    def g(a):
        return a.view(12).view(3, 4).permute(0, 1)

    a = torch.randn(3, 4, dtype=torch.float64)
    gm = _propagated(make_fx(g)(a), [a])
    drop_identity_views(gm)
    assert _storage(gm(a)) == _storage(a) and torch.equal(gm(a), a)


_MULADD_CASES = {
    # (function of (a, b, c, mask), mul folded into addcmul): mask holds 0, 1 and -1 only
    "add_of_mul": (lambda a, b, c, s: a + s * c, 1),
    "mul_first": (lambda a, b, c, s: c * s + a, 1),
    "broadcast": (lambda a, b, c, s: a + s * c[0], 1),
    "view_of_mask": (lambda a, b, c, s: a + s.t().t() * b, 1),
    "two": (lambda a, b, c, s: (a + b * s) + s * c, 2),
    # left alone: no factor known to hold 0, 1, -1 only (addcmul may round once where mul and add
    # round twice), a product read twice, alpha, a promoted product, a scalar factor
    "general_product": (lambda a, b, c, s: a + b * c, 0),
    "mul_read_twice": (lambda a, b, c, s: (lambda m: (a + m) * m)(b * s), 0),
    "mul_added_to_itself": (lambda a, b, c, s: (lambda m: m + m)(s * c), 0),
    "alpha": (lambda a, b, c, s: torch.add(a, s * c, alpha=2.0), 0),
    "promoted": (lambda a, b, c, s: a + s.float() * c.float(), 0),
    "scalar_factor": (lambda a, b, c, s: a + b * 3.0, 0),
}


def _operands(seed, shape=(4, 8)):
    """Floats over 32 decades with zeros of both signs, infinities and NaN among them, and a 0/1/-1 mask."""
    g = torch.Generator().manual_seed(seed)
    a, b, c = (torch.randn(shape, dtype=torch.float64, generator=g)
               * 10.0 ** torch.randint(-16, 16, shape, generator=g) for _ in range(3))
    a[0, :3] = torch.tensor([0.0, -0.0, float("inf")])
    a[2, :2] = float("nan")
    c[1, :4] = torch.tensor([-0.0, float("inf"), float("nan"), 1e308])
    c[2, :2] = float("inf")
    b[1, 3] = 1e308
    s = torch.randint(-1, 2, shape, generator=g).to(torch.float64)
    s[2, :2] = torch.tensor([0.0, 1.0])
    return a, b, c, s


def _same_or_both_nan(got, want):
    """The same bits where ``want`` is not NaN, NaN where it is (two NaNs meeting may give either's
    sign and payload)."""
    nan = want.isnan()
    return bool(torch.equal(got.isnan(), nan)
                and torch.equal(_bits(got.masked_fill(nan, 0.0)), _bits(want.masked_fill(nan, 0.0))))


def _bits(t):
    return t.contiguous().view(torch.int64 if t.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("name", sorted(_MULADD_CASES))
def test_multiply_add_folds_into_addcmul_with_the_recorded_bits(name):
    """``a + s * c`` with ``s`` a constant of 0, 1 and -1 (seed rows, masks folded from them) is one
    ``addcmul``: the product rounds nothing, so the sum's bits are the recorded ones whether
    ``addcmul`` fuses the multiply and add or not (it does on this build: a general product is
    left alone); a NaN stays a NaN."""
    from asd.backends.graph_passes import fuse_multiply_add

    fn, folded = _MULADD_CASES[name]
    args = _operands(11)
    gm = _propagated(make_fx(fn)(*args), list(args))
    mask = [n for n in gm.graph.nodes if n.op == "placeholder"][3]
    before = sum(n.target is torch.ops.aten.mul.Tensor for n in _calls(gm))
    assert fuse_multiply_add(gm, [mask]) == folded, gm.code
    assert sum(n.target is torch.ops.aten.mul.Tensor for n in _calls(gm)) == before - folded
    for seed in (11, 12, 13):
        args = _operands(seed)
        got, want = gm(*args), fn(*args)
        assert got.dtype == want.dtype and _same_or_both_nan(got, want)


def test_addcmul_is_not_mul_then_add_in_general():
    """Why the fold needs a factor of 0, 1 and -1: on PyTorch's CPU kernels ``addcmul`` rounds
    some sums of general products differently from ``mul`` then ``add`` (a fused multiply-add);
    if a later build rounds them alike, this test says so and the restriction may be revisited."""
    a, b, c, _ = _operands(5, (64, 64))
    assert not _same_or_both_nan(torch.addcmul(a, b, c), a + b * c)


def test_multiply_add_records_the_recorded_derivatives():
    """Where a call records derivatives (an input requires grad, a functorch transform) the
    folded node runs the recorded ``mul`` and ``add``, in a joined buffer's slot too."""
    from asd.backends.graph_passes import fuse_multiply_add, join_in_place

    def g(a, b, c):
        return torch.stack([a + b * c, b - c], 1)

    a, b, c = (torch.randn(3, 4, dtype=torch.float64) for _ in range(3))
    c = torch.randint(-1, 2, (3, 4)).to(torch.float64)
    gm = _propagated(make_fx(g)(a, b, c), [a, b, c])
    assert join_in_place(gm) == 1
    gm = _propagated(gm, [a, b, c])
    assert fuse_multiply_add(gm, [[n for n in gm.graph.nodes if n.op == "placeholder"][2]]) == 1
    assert torch.equal(gm(a, b, c), g(a, b, c))
    w = b.clone().requires_grad_()
    got, want = gm(a, w, c), g(a, w, c)
    assert torch.equal(got, want) and got.requires_grad
    assert torch.equal(torch.autograd.grad(got.pow(2).sum(), w)[0], torch.autograd.grad(want.pow(2).sum(), w)[0])
    jac = torch.func.jacfwd(lambda t: gm(a, t, c))(b)
    torch.testing.assert_close(jac, torch.func.jacfwd(lambda t: g(a, t, c))(b), rtol=0, atol=0)


def test_the_brusselator_replay_folds_its_products_and_views():
    """B1's eager replay: the Jacobian's seed-scaled product and its add are one addcmul written
    into the joined buffer, no identity view is dispatched, and the values are the recorded
    graph's bits."""
    from asd.backends.graph_passes import _multiply_add_into

    f, op, products, replay = _brusselator_replay()
    targets = [n.target for n in _calls(replay.fast.gm)]
    assert _multiply_add_into in targets, replay.fast.gm.code
    assert torch.ops.aten.permute.default not in targets
    for seed in (5, 6):
        x2 = brusselator_input(16, seed=seed)
        xf = x2.reshape(-1).clone()
        with torch.no_grad():
            fast, plain = replay.fast(xf, products.seeds), replay.plain(xf, products.seeds)
        assert torch.equal(fast.view(torch.int64), plain.view(torch.int64))
        torch.testing.assert_close(op(x2).to_dense(), torch.func.jacfwd(f)(x2), rtol=1e-13, atol=1e-13)


def test_public_bindings_call_the_same_kernels_bit_for_bit():
    """Elementwise operations of tensor operands and views are called through ``torch.*`` and
    ``Tensor`` methods (less Python per call); an operation with a Python number stays an ATen
    call (the two bindings wrap a number differently); the bits are the recorded ones, written
    into a joined buffer's slot too."""
    from asd.backends.graph_passes import join_in_place, public_bindings

    def g(a, b, c):
        u = a.view(4, 3).permute(1, 0).reshape(12).view(3, 4).select(0, 1)
        p = torch.addcmul(a, b, c) - torch.div(b, c) + (-a) * 2.0
        q = (a * b).mul_(c).add_(u)
        return torch.stack([p + q, a - c])

    args = _operands(3, (3, 4))[:3]
    gm = _propagated(make_fx(g)(*args), list(args))
    assert join_in_place(gm) == 1
    gm = _propagated(gm, list(args))
    want = gm(*args)
    changed = public_bindings(gm)
    aten = torch.ops.aten
    left = {n.target for n in _calls(gm) if isinstance(n.target, torch._ops.OpOverload)}
    # (x * 2.0, and the copy of a reshape that cannot view)
    assert left == {aten.mul.Tensor, aten.clone.default, aten._unsafe_view.default}, gm.code
    assert changed == 14, gm.code
    for seed in (3, 4):
        args = _operands(seed, (3, 4))[:3]
        got = gm(*args)
        assert torch.equal(_bits(got), _bits(g(*args)))
    w = args[1].clone().requires_grad_()
    got, ref = gm(args[0], w, args[2]), g(args[0], w, args[2])
    assert torch.equal(_bits(got.detach()), _bits(ref.detach()))


def test_the_fast_replay_is_not_run_under_a_torch_function_mode():
    """Under a user's ``TorchFunctionMode`` a prepared operator replays no recorded graph (whose
    fast variant calls ``torch.*`` functions the mode would see): the transforms run ``f`` under the
    mode (see ``tests/test_caller_modes.py``)."""
    from torch.overrides import TorchFunctionMode

    class Log(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    f, op, products, replay = _brusselator_replay()
    x = brusselator_input(16)
    want = op.values(x)
    log = Log()
    with log:
        got = op.values(x)
    assert torch.equal(got, want)
    assert not {"addcmul", "mul_"} & set(log.names), log.names
    assert "roll" in log.names, log.names  # f's own call
