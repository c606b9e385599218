"""The rewrites of a specialized products graph for Inductor's CPU code (asd.backends.cpu_kernels):
padded sums as segments and the final gather after the kernels. Each is checked against the graph
it rewrites, without compiling (the compiled path is covered in test_compile_cache.py)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch.fx.experimental.proxy_tensor import make_fx

from asd.backends import compile_cache
from asd.backends.cpu_kernels import MAX_SEGMENT_TERMS, split_final_gather, split_padded_sums, take
from asd.backends.specialize import Specialized

aten = torch.ops.aten


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@st.composite
def padded_sums(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    dim = draw(st.integers(-ndim, ndim - 1))
    length = shape[dim]
    terms = []
    for _ in range(draw(st.integers(1, 4))):
        start = draw(st.integers(-length - 2, length + 2))
        end = draw(st.integers(-length - 2, length + 2))
        terms.append(("slice", start, end))
    terms += [("full",)] * draw(st.integers(0, 2))
    terms = draw(st.permutations(terms))
    values = [1e16, -1e16, 1.0, -0.0, 0.5]  # sums that reassociation would change

    def tree(lo, hi):  # a random binary tree of additions over terms[lo:hi]
        if hi - lo == 1:
            return lo
        k = draw(st.integers(lo + 1, hi - 1))
        return (tree(lo, k), tree(k, hi))

    return shape, dim, terms, tree(0, len(terms)), draw(st.lists(st.sampled_from(values), min_size=len(terms),
                                                                    max_size=len(terms)))


def _build(shape, dim, terms, tree=None, fill=None):
    """A function of one tensor per term: the sum of the terms (slice_backward of a slice-sized
    operand, or an operand of the whole shape), left to right or nested as ``tree``; ``fill``: a
    value per term added to its random entries (large values that cancel, a negative zero)."""
    length = shape[dim % len(shape)]

    def size(start, end):
        s = [min(max(v + length if v < 0 else v, 0), length) for v in (start, end)]
        sz = list(shape)
        sz[dim % len(shape)] = max(s[1] - s[0], 0)
        return sz

    inputs = [torch.randn(size(*t[1:]) if t[0] == "slice" else shape, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(i)) for i, t in enumerate(terms)]

    if fill is not None:
        inputs = [a.mul(0.0).add(c) if i % 2 else a + c for i, (a, c) in enumerate(zip(inputs, fill))]

    def term(i, a):
        t = terms[i]
        return aten.slice_backward(a, list(shape), dim, t[1], t[2], 1) if t[0] == "slice" else a * 1.0

    def f(*args):
        if tree is None:
            acc = None
            for i, a in enumerate(args):
                acc = term(i, a) if acc is None else acc + term(i, a)
            return acc * 2.0

        def walk(node):
            return term(node, args[node]) if isinstance(node, int) else walk(node[0]) + walk(node[1])

        return walk(tree) * 2.0

    return f, inputs


@settings(max_examples=60, deadline=None)
@given(padded_sums())
def test_padded_sums_as_segments_compute_the_same_values(case):
    shape, dim, terms, tree, fill = case
    f, inputs = _build(shape, dim, terms, tree, fill)
    gm = make_fx(f)(*inputs)
    want = gm(*inputs)
    done = split_padded_sums(gm)
    got = gm(*inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same additions, in the same order
    if len(terms) >= 2 and any(t[0] == "slice" for t in terms):
        assert done == 1
        assert aten.slice_backward.default not in _targets(gm), gm.code
        assert aten.cat.default in _targets(gm)
    else:
        assert done == 0


def test_only_one_dimension_is_split_and_broadcast_or_strided_terms_are_left_alone():
    a = torch.randn(3, 4, dtype=torch.float64)
    b = torch.randn(4, 3, dtype=torch.float64)
    c = torch.randn(4, dtype=torch.float64)

    def two_dims(a, b):
        return aten.slice_backward(a, [4, 4], 0, 1, 4, 1) + aten.slice_backward(b, [4, 4], 1, 0, 3, 1)

    def broadcast(a, c):
        return aten.slice_backward(a, [4, 4], 0, 0, 3, 1) + c

    def strided(c):
        return aten.slice_backward(c[::2], [4], 0, 0, 4, 2) + c

    for fn, args, done in ((two_dims, (a, b), 1), (broadcast, (a, c), 0), (strided, (c,), 0)):
        gm = make_fx(fn)(*args)
        want = gm(*args)
        assert split_padded_sums(gm) == done
        torch.testing.assert_close(gm(*args), want, rtol=0, atol=0)
        # two dimensions: segments along the first, the other slice a term of the whole shape
        assert _targets(gm).count(aten.slice_backward.default) == 1


def test_an_inner_sum_used_elsewhere_stays_a_term():
    a, b, c = (torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))

    def f(a, b, c):
        inner = aten.slice_backward(a[1:], [5], 0, 1, 5, 1) + b
        return inner + aten.slice_backward(c[:-1], [5], 0, 0, -1, 1), inner * 3

    gm = make_fx(f)(a, b, c)
    want = gm(a, b, c)
    split_padded_sums(gm)
    for g, w in zip(gm(a, b, c), want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def _gather_graph(index):
    products = torch.randn(3, 7, dtype=torch.float64)

    def f(x, idx):
        return aten._unsafe_index(torch.sin(x).reshape(-1), [idx]).reshape(-1)

    return make_fx(f)(products, index), [products, index]


def test_the_final_gather_runs_after_the_kernels():
    index = torch.tensor([20, 0, 5, 5, 13], dtype=torch.int64)
    gm, args = _gather_graph(index)
    split = split_final_gather(gm, args, {1})
    assert split is not None
    products, idx = split
    assert idx is index  # read by reference, as the graph reads its input
    assert aten._unsafe_index.Tensor not in _targets(products)
    torch.testing.assert_close(take(products(*args), idx), gm(*args), rtol=0, atol=0)


@pytest.mark.parametrize("index", [torch.tensor([0, 21]), torch.tensor([-1, 2]), torch.tensor([[0, 1]])],
                         ids=["past-the-end", "negative", "2-d"])
def test_a_gather_that_take_cannot_serve_is_kept(index):
    gm, args = _gather_graph(torch.tensor([0, 1], dtype=torch.int64))
    assert split_final_gather(gm, args, {1}) is not None
    assert split_final_gather(gm, [args[0], index.to(torch.int64)], {1}) is None  # the index the kernels would read
    assert split_final_gather(gm, [args[0], args[1].to(torch.int32)], {1}) is None
    assert split_final_gather(gm, args, {0}) is None  # an index f could write: not read unchecked


def test_take_keeps_a_gradient():
    flat = torch.randn(6, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([5, 0, 0, 3])
    out = take(flat * 2, index)
    out.sum().backward()
    torch.testing.assert_close(flat.grad, torch.tensor([4.0, 0.0, 0.0, 2.0, 0.0, 2.0], dtype=torch.float64))


def _rosenbrock_like(x, idx):
    y = (100 * (x[1:] - x[:-1] ** 2) ** 2).sum()
    g = torch.autograd.grad(y, x, create_graph=True)[0]
    return g.reshape(-1).index_select(0, idx)  # as the fused gather of asd.backends.fused


def _spec():
    x = torch.randn(8, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([7, 1, 2, 2], dtype=torch.int64)
    gm = make_fx(_rosenbrock_like)(x, idx)
    # the index as a constant of the specialization's own (by_reference=[]), as the fused gather's
    spec = Specialized(gm, runtime=[0], extras=[idx], by_reference=[])
    args = spec.arguments([x.detach()])
    with torch.no_grad():
        expected = spec.gm(*args)
    return spec, args, expected


def test_the_cpu_rewrites_are_used_where_they_reproduce_the_graph():
    spec, args, expected = _spec()
    gm, gather, want = compile_cache._for_cpu(spec, args, expected)
    assert gm is not spec.gm and gather is not None
    assert any("CPU rewrites" in n and "segments" in n and "gather" in n for n in spec.notes), spec.notes
    torch.testing.assert_close(take(gm(*args), gather), expected, rtol=0, atol=0)
    assert aten.slice_backward.default in _targets(spec.gm)  # the specialized graph itself is untouched


def test_a_rewrite_that_disagrees_with_the_graph_is_not_used(monkeypatch):
    import asd.backends.cpu_kernels as kernels

    def wrong(gm):  # runs, but subtracts where the graph adds
        node = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.add.Tensor)
        node.target = aten.sub.Tensor
        gm.recompile()
        return 1

    monkeypatch.setattr(kernels, "split_padded_sums", wrong)
    spec, args, expected = _spec()
    gm, gather, want = compile_cache._for_cpu(spec, args, expected)
    assert gm is spec.gm and gather is None and want is expected
    assert any("CPU rewrites not used" in n for n in spec.notes), spec.notes


def test_take_makes_its_result_on_the_device_of_its_operand():
    flat = torch.randn(6, dtype=torch.float64)
    with torch.device("meta"):
        out = take(flat, torch.tensor([5, 0], device="cpu"))
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, flat[[5, 0]], rtol=0, atol=0)


def test_a_recorded_graph_with_a_gap_between_slices_is_rewritten():
    from asd.backends.record import record

    def fn(x):  # a gradient zero at x[2]: a segment no slice reaches
        return torch.func.grad(lambda z: (z[:2] ** 3).sum() + (z[3:] ** 3).sum())(x)

    x = torch.randn(7, dtype=torch.float64)
    gm = record(fn, x)  # values on the meta device, as compile=True records them
    want = gm(x)
    assert split_padded_sums(gm) == 1
    torch.testing.assert_close(gm(x), want, rtol=0, atol=0)
    assert aten.new_zeros.default in _targets(gm)


def test_empty_and_many_slice_sums_are_left_alone():
    def empty(a, b):
        return aten.slice_backward(a, [0, 3], 0, 0, 0, 1) + b

    a, b = torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, 3, dtype=torch.float64)
    gm = make_fx(empty)(a, b)
    assert split_padded_sums(gm) == 0

    def many(z):  # the gradient of 64 shifted slices: 129 segments of 64 terms
        return torch.func.grad(lambda w: sum((w[s:56 + s] ** 2).sum() for s in range(64)))(z)

    z = torch.randn(120, dtype=torch.float64)
    gm = make_fx(many)(z)
    want = gm(z)
    before = len(gm.graph.nodes)
    split_padded_sums(gm)  # at most an inner part of the sum, within MAX_SEGMENT_TERMS
    assert len(gm.graph.nodes) <= before + MAX_SEGMENT_TERMS * 3
    torch.testing.assert_close(gm(z), want, rtol=0, atol=0)


def test_a_gather_index_of_f_s_own_is_not_moved_out_of_the_graph():
    spec, args, expected = _spec()
    spec.by_reference = [0]  # the index read by reference: f's tensor, which f may change
    gm, gather, want = compile_cache._for_cpu(spec, args, expected)
    assert gather is None
    torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)


def test_a_doubling_chain_of_sums_is_bounded():
    def f(a, c):  # y = y + y, 40 times: 2^40 terms if every add were opened
        y = aten.slice_backward(a, [6], 0, 1, 6, 1) + c
        for _ in range(40):
            y = y + y
        return y

    a, c = torch.randn(5, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    gm = make_fx(f)(a, c)
    want = gm(a, c)
    split_padded_sums(gm)  # returns at once: the terms are counted up to MAX_SEGMENT_TERMS
    torch.testing.assert_close(gm(a, c), want, rtol=0, atol=0)


def test_the_rewrites_check_tells_infinities_from_the_largest_finite_values():
    big = torch.finfo(torch.float64).max
    a = torch.tensor([float("inf"), float("nan"), -0.0], dtype=torch.float64)
    assert compile_cache._same(a, torch.tensor([float("inf"), float("nan"), 0.0], dtype=torch.float64))
    assert not compile_cache._same(a, torch.tensor([big, float("nan"), 0.0], dtype=torch.float64))
    assert not compile_cache._same(-a, torch.tensor([-big, float("nan"), 0.0], dtype=torch.float64))
    assert not compile_cache._same(a, torch.tensor([float("inf"), 1.0, 0.0], dtype=torch.float64))
    z = torch.tensor([complex(float("inf"), 0.0)], dtype=torch.complex128)
    assert not compile_cache._same(z, torch.tensor([complex(big, 0.0)], dtype=torch.complex128))


def test_a_gather_of_the_rewritten_sum_itself_still_runs_after_the_kernels():
    def f(a, c, idx):  # the gathered tensor is the padded sum, which the first rewrite replaces
        return (aten.slice_backward(a, [6], 0, 1, 6, 1) + c).index_select(0, idx)

    a, c = torch.randn(5, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    idx = torch.tensor([5, 0, 3], dtype=torch.int64)
    spec = Specialized(make_fx(f)(a, c, idx), runtime=[0, 1], extras=[idx], by_reference=[])
    args = spec.arguments([a, c])
    expected = spec.gm(*args)
    gm, gather, want = compile_cache._for_cpu(spec, args, expected)
    assert gather is idx, spec.notes  # the new cat node's value is known to the gather's rewrite
    assert "segments" in spec.notes[-1] and "gather" in spec.notes[-1]
    torch.testing.assert_close(take(gm(*args), gather), expected, rtol=0, atol=0)


def _inner_gathers_graph(index):
    def f(x, idx):  # a gather inside the graph (an operand, as the pushed-down fused gather reads) and one at its end
        g = torch.sin(x).reshape(-1).index_select(0, idx)
        return (g * 2 + torch.cos(x).reshape(-1).index_select(0, idx)).index_select(0, idx.flip(0).remainder(idx.numel()))

    x = torch.randn(3, 7, dtype=torch.float64)
    return make_fx(f)(x, index), [x, index]


def test_every_gather_by_an_own_index_becomes_take():
    from asd.backends.cpu_kernels import gathers_as_take, with_meta

    index = torch.tensor([20, 0, 5, 5, 13, 2], dtype=torch.int64)
    gm, args = _inner_gathers_graph(index)
    want = gm(*args)
    with torch.no_grad():
        with_meta(gm, args)
    # the flipped index is computed in the graph, not an input: its gather stays index_select
    assert gathers_as_take(gm, args, {1}) == 2
    assert _targets(gm).count(take) == 2 and aten.index_select.default in _targets(gm)
    torch.testing.assert_close(gm(*args), want, rtol=0, atol=0)


@pytest.mark.parametrize("index", [torch.tensor([0, 21]), torch.tensor([-1, 2])], ids=["past-the-end", "negative"])
def test_gathers_that_take_cannot_serve_stay_index_select(index):
    from asd.backends.cpu_kernels import gathers_as_take, with_meta

    gm, args = _inner_gathers_graph(torch.tensor([0, 1], dtype=torch.int64))
    with torch.no_grad():
        with_meta(gm, args)
    assert gathers_as_take(gm, [args[0], index], {1}) == 0  # the index the kernels would read unchecked
    assert gathers_as_take(gm, [args[0], args[1].to(torch.int32)], {1}) == 0
    assert gathers_as_take(gm, args, {0}) == 0  # an index f could write
    assert take not in _targets(gm)


def test_eager_replay_gathers_with_take_and_keeps_the_bits():
    """The eager replay of a recorded B1 Jacobian gathers by its own constant index with ``take``
    in the variants it builds; the operator's values are the recorded graph's bits."""
    import asd
    from asd.problems import brusselator, brusselator_input
    from asd.backends.traced import CALLS_BEFORE_TRACING

    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x)
    for _ in range(CALLS_BEFORE_TRACING + 2):
        op(x)
    products = getattr(op.state, "fused", None) or op.state.products
    (replay,) = products.tracing.graphs.values()
    assert replay.chosen in ("folded", "pushed")
    assert take in _targets(replay.fast.gm)
    with torch.no_grad():
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x), rtol=1e-12, atol=1e-12)
