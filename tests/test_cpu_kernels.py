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
from asd.backends.cpu_kernels import split_final_gather, split_padded_sums, take
from asd.backends.specialize import lift

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
    return shape, dim, draw(st.permutations(terms))


def _build(shape, dim, terms):
    """A function of one tensor per term: the sum, left to right, of the terms (slice_backward of
    a slice-sized operand, or an operand of the whole shape)."""
    length = shape[dim % len(shape)]

    def size(start, end):
        s = [min(max(v + length if v < 0 else v, 0), length) for v in (start, end)]
        sz = list(shape)
        sz[dim % len(shape)] = max(s[1] - s[0], 0)
        return sz

    inputs = [torch.randn(size(*t[1:]) if t[0] == "slice" else shape, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(i)) for i, t in enumerate(terms)]

    def f(*args):
        acc = None
        for t, a in zip(terms, args):
            v = aten.slice_backward(a, list(shape), dim, t[1], t[2], 1) if t[0] == "slice" else torch.sin(a)
            acc = v if acc is None else acc + v
        return acc * 2.0

    return f, inputs


@settings(max_examples=60, deadline=None)
@given(padded_sums())
def test_padded_sums_as_segments_compute_the_same_values(case):
    shape, dim, terms = case
    f, inputs = _build(shape, dim, terms)
    gm = make_fx(f)(*inputs)
    want = gm(*inputs)
    done = split_padded_sums(gm)
    got = gm(*inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
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
    split = split_final_gather(gm, args)
    assert split is not None
    products, idx = split
    assert idx is index  # read by reference, as the graph reads its input
    assert aten._unsafe_index.Tensor not in _targets(products)
    torch.testing.assert_close(take(products(*args), idx), gm(*args), rtol=0, atol=0)


@pytest.mark.parametrize("index", [torch.tensor([0, 21]), torch.tensor([-1, 2]), torch.tensor([[0, 1]])],
                         ids=["past-the-end", "negative", "2-d"])
def test_a_gather_that_take_cannot_serve_is_kept(index):
    gm, args = _gather_graph(torch.tensor([0, 1], dtype=torch.int64))
    assert split_final_gather(gm, args) is not None
    assert split_final_gather(gm, [args[0], index.to(torch.int64)]) is None  # the index the kernels would read
    assert split_final_gather(gm, [args[0], args[1].to(torch.int32)]) is None


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
    spec = lift(gm, [x.detach(), idx])
    args = spec.arguments([x.detach(), idx])
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
