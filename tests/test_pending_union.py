"""Unions of several set matrices in one pass, and unions left pending along elementwise chains.

The first-order tracer lets an elementwise op's output keep its operands' set matrices unmerged
(:class:`asd.detection.sets.PendingUnion`) until something reads the output's sets. These tests
check the k-way merge kernel against dense unions, and every trace against the same trace with
every union merged at once (a tracer that observes its rules, as the Hessian tracer does) and
against the nonzeros of dense Jacobians.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asd.detection import sets as S
from asd.detection.jacobian import output_sets, trace_inputs
from asd.detection.torch_tracer import Tracer


class _EagerTracer(Tracer):
    """Merges every union at once: a tracer that observes its rules' results."""

    def observe(self, call, rule, out_sets):
        assert not any(isinstance(s, S.PendingUnion) for s in out_sets)


def _pattern(f, x, tracer_cls=Tracer) -> np.ndarray:
    y, tracer, _ = trace_inputs(f, (x,), (0,), local=False, strict=True, tracer_cls=tracer_cls)
    sets = output_sets(y, tracer)
    sets.check_format(full_check=True)
    assert sets.has_canonical_format
    return sets.toarray()


@st.composite
def _parts(draw):
    rows, n = draw(st.integers(0, 12)), draw(st.integers(1, 120))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mats, dense = [], np.zeros((rows, n), bool)
    for _ in range(draw(st.integers(3, 7))):
        D = rng.random((rows, n)) < draw(st.sampled_from([0.02, 0.2, 0.6, 1.0]))
        dense |= D
        M = sp.csr_matrix(D)
        dt = draw(st.sampled_from([np.int32, np.int64]))
        indptr, indices = M.indptr.astype(dt), M.indices.astype(dt)
        if rows and draw(st.booleans()):  # a column stored twice in a row (sorted): the set algebra allows it
            r = draw(st.integers(0, rows - 1))
            a, b = indptr[r], indptr[r + 1]
            if b > a:
                indices = np.insert(indices, a, indices[a])
                indptr = indptr.copy()
                indptr[r + 1:] += 1
        M = S._csr(indptr, indices, (rows, n))
        mats.append(M)
    return mats, dense, rows, n


@settings(max_examples=200, deadline=None)
@given(data=_parts())
def test_k_way_union_matches_dense(data):
    """Three or more parts merge in one kernel: rows of up to 120 entries (the sorting branch
    past 32), repeats within a row, int32 and int64 arrays."""
    mats, dense, rows, n = data
    out = S.union(mats, rows, n)
    out.check_format(full_check=True)
    assert out.has_sorted_indices and out.dtype == np.bool_ and out.shape == (rows, n)
    np.testing.assert_array_equal(out.toarray(), dense)
    lazy = S.lazy_union(mats, rows, n)
    if lazy is None:
        assert not dense.any()
    else:
        merged = lazy.merged() if isinstance(lazy, S.PendingUnion) else lazy
        np.testing.assert_array_equal(merged.toarray(), dense)


def test_k_way_union_refuses_malformed_parts():
    """Pointers past a part's indices are refused, not read from the next part's entries."""
    good = S.identity(3)
    past = sp.csr_matrix((3, 3), dtype=bool)
    past.indptr = np.array([0, 1, 2, 9], dtype=np.int32)
    past.indices = np.array([0, 1, 2], dtype=np.int32)
    past.data = np.ones(3, bool)
    past.has_sorted_indices = True
    decreasing = sp.csr_matrix((3, 3), dtype=bool)
    decreasing.indptr = np.array([0, 2, 1, 3], dtype=np.int32)
    decreasing.indices = np.array([0, 1, 2], dtype=np.int32)
    decreasing.data = np.ones(3, bool)
    decreasing.has_sorted_indices = True
    other = S._csr(np.arange(4), np.array([2, 2, 2]), (3, 3))
    for bad in (past, decreasing):
        for order in ((bad, good, other), (good, bad, other), (good, other, bad)):
            with pytest.raises(ValueError, match="malformed"):
                S.union(list(order), 3, 3)


def _shift(w, k):
    return torch.roll(w, k, 0)


def _chain(x):
    u = x.reshape(8, 8)
    acc = u * 0.5
    for k in range(1, 16):  # more distinct parts than a pending union keeps
        acc = acc + torch.roll(u, k, 0) * (1.0 / k)
    return acc.sin()


def _inplace_into_pending(x):
    u, v = x[:32], x[32:]
    y = u * v + u.roll(1)
    y.add_(v.roll(3))  # an in-place op on a pending output: merged, then written
    y[4:9] = u[:5] * 2  # a write through a view of it
    return y.reshape(4, 8).t().reshape(-1) - v


def _views_of_pending(x):
    u, v = x[:32].reshape(4, 8), x[32:].reshape(4, 8)
    y = u * v + u.flip(0) - 3 * v.roll(1, 1)
    return torch.cat([y[1:, ::2].reshape(-1), y.t()[0], y.sum(1)])


def _detached_and_no_grad(x):
    u, v = x[:32], x[32:]
    y = u + v * u.roll(2)
    with torch.no_grad():
        z = y * 2 + v  # cut: no dependence for reverse mode
    w = y.detach() + u.roll(5)  # the detached pending keeps no sets
    return torch.stack([y + z, w, y.exp() * u])


def _broadcast(x):
    u = x.reshape(8, 8)
    row = u[0]  # broadcast along the rows
    col = u[:, :1]
    return (u + row) * col - u.roll(1, 1) + row.sum()


def _brusselator(x):
    N = 8
    u, v = x[:64].reshape(N, N), x[64:].reshape(N, N)

    def lap(w):
        return torch.roll(w, 1, 0) + torch.roll(w, -1, 0) + torch.roll(w, 1, 1) + torch.roll(w, -1, 1) - 4 * w

    uuv = u * u * v
    return torch.stack([1 + uuv - 4.4 * u + 0.1 * lap(u), 3.4 * u - uuv + 0.1 * lap(v)]).reshape(-1)


CASES = {"chain": (_chain, 64), "inplace": (_inplace_into_pending, 64), "views": (_views_of_pending, 64),
         "detached": (_detached_and_no_grad, 64), "broadcast": (_broadcast, 64), "brusselator": (_brusselator, 128)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pending_unions_give_the_merged_pattern(name):
    """A trace with pending unions equals the trace that merges at every op, and holds the
    nonzeros of the dense Jacobian at random points (the cases read pending outputs through
    in-place ops, views, writes, detach, no_grad, broadcasting and long chains)."""
    f, n = CASES[name]
    x = torch.rand(n, dtype=torch.float64)
    lazy = _pattern(f, x)
    eager = _pattern(f, x, _EagerTracer)
    np.testing.assert_array_equal(lazy, eager)
    for seed in range(3):
        xr = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        J = torch.autograd.functional.jacobian(f, xr).reshape(-1, n).numpy()
        assert not (J != 0)[~lazy].any(), "a nonzero of the dense Jacobian is missing from the pattern"
    if name in ("chain", "brusselator", "views"):  # no cuts or cancellations: the pattern is exact here
        J = torch.autograd.functional.jacobian(f, torch.randn(n, dtype=torch.float64)).reshape(-1, n).numpy()
        np.testing.assert_array_equal(lazy, J != 0)


def test_chain_keeps_at_most_max_parts():
    """A long chain merges once it has more distinct parts than a pending union keeps."""
    tracer = Tracer(64, local=False)
    seen = []
    with tracer:
        x = tracer.input(torch.rand(64, dtype=torch.float64))
        u = x.reshape(8, 8)
        acc = u * 1.0
        for k in range(1, 20):
            acc = acc + torch.roll(u, k % 8, 0) + torch.roll(u, k % 8, 1)
            pending = acc._storage._pending
            seen.append(0 if pending is None else len(pending.parts))
    assert max(seen) <= S.PendingUnion.MAX_PARTS
    assert max(seen) > 2  # the chain did leave unions pending


def test_sorting_network_sorts_every_input():
    """The fixed 8-entry network sorts every 0-1 input, hence every input (the 0-1 principle)."""
    import itertools

    from asd.detection._set_kernels import _sort8

    for bits in itertools.product((0, 1), repeat=8):
        b = np.array(bits, dtype=np.int64)
        _sort8(b)
        assert (np.diff(b) >= 0).all(), bits


def test_a_second_consumer_reads_the_union_merged_once():
    """The first elementwise consumer of a pending output extends its union; a second one reads
    it merged, in the output's own storage, instead of merging the same parts again."""
    tracer = Tracer(64, local=False)
    with tracer:
        x = tracer.input(torch.rand(64, dtype=torch.float64))
        u = x.reshape(8, 8)
        y = u + u.roll(1, 0) + u.roll(1, 1) + u.roll(2, 0)
        assert y._storage._pending is not None
        z1 = y * 2.0
        assert y._storage._pending is not None and z1._storage._pending is not None  # parts taken unmerged
        z2 = y + 1.0
        assert y._storage._pending is None  # merged once, for the second consumer
        assert z2._storage._pending is None and z2._storage.sets is y._storage.sets
        want = y._storage.sets.toarray()
        np.testing.assert_array_equal(z1.sets.toarray(), want)


def test_an_observe_hook_on_the_instance_sees_merged_sets():
    """A tracer whose ``observe`` is replaced on the instance (not by a subclass) gets merged set
    matrices, never a pending union."""
    tracer = Tracer(16, local=False)
    seen = []
    tracer.observe = lambda call, rule, out_sets: seen.extend(type(s).__name__ for s in out_sets if s is not None)
    with tracer:
        x = tracer.input(torch.rand(16, dtype=torch.float64))
        y = (x + x.roll(1) + x.roll(2) + x.roll(3)).sin()
        y.sets
    assert seen and "PendingUnion" not in seen


def test_identity_memo_keeps_no_element_map_alive():
    """The memo of which read-only element maps are the identity holds weak references only."""
    import gc
    import weakref

    from asd.detection import torch_tracer

    idx = np.arange(100_000)
    idx.flags.writeable = False
    assert torch_tracer._is_identity(idx, 100_000)
    ref = weakref.ref(idx)
    del idx
    gc.collect()
    assert ref() is None



def test_an_operand_used_twice_takes_its_parts_once():
    """``a + a`` with ``a`` pending takes its parts once, leaving it pending (the second use was a
    second take, which merged ``a`` for nothing)."""
    tracer = Tracer(16, local=False)
    with tracer:
        x = tracer.input(torch.rand(16, dtype=torch.float64))
        a = x + x.roll(1) + x.roll(2)
        b = a + a
        assert a._storage._pending is not None and b._storage._pending is not None
        np.testing.assert_array_equal(b.sets.toarray(), a.sets.toarray())
