"""Review of the one-off speed work (memos of id runs and colorings) and of ``out=`` buffers.

Tests marked ``xfail(strict=True)`` demonstrate defects that exist today: they fail now and will
start to pass (and then must lose the marker) once the defect is fixed. The others pin behaviour the
review checked and found right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import asd
from asd import coloring as C
from asd.detection import jacobian_pattern
from asd.detection.rules import movement as M
from asd.errors import InputError
from asd.patterns import SparsityPattern

X = torch.linspace(0.3, 1.7, 12, dtype=torch.float64)


def _chain(x):
    return torch.cat([x[1:] * torch.sin(x[:-1]), x[:3] ** 2])


# -- the coloring memo -----------------------------------------------------------------------------

def _pair_functions():
    def f2(x):
        return torch.stack([x[0] * x[2], x[0] + x[2] ** 2, x[1] * x[3], x[1] + x[3] ** 2])
    return f2


def test_coloring_memo_is_not_fooled_by_a_kept_pattern_whose_memory_changed():
    x = torch.tensor([0.5, 1.5, 2.0, 3.0], dtype=torch.float64)
    indptr = np.array([0, 2, 4, 6, 8])
    buf = np.array([0, 1, 0, 1, 2, 3, 2, 3], dtype=np.int64)  # the caller's writable array
    ro = buf.view()
    ro.flags.writeable = False  # handed to asd read-only
    C.color(SparsityPattern((4, 4), indptr, ro), "column")  # colors [0 1 0 1], kept by the memo
    buf[:] = [0, 2, 0, 2, 1, 3, 1, 3]  # the caller reuses its array
    P2 = SparsityPattern((4, 4), indptr, np.array([0, 2, 0, 2, 1, 3, 1, 3]))  # fresh and independent
    C.check(P2, C.color(P2, "column"))  # today: ColoringError, columns 0 and 2 share a color and a row
    f2 = _pair_functions()
    op = asd.prepare_jacobian(f2, x, pattern=P2, mode="forward", check=False)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f2)(x))


def test_coloring_memo_tells_apart_equal_entries_with_other_shapes():
    n = 6
    idx = np.arange(n * n).reshape(n, n)
    rows, cols = [], []
    for i in range(n):
        for j in range(n):
            for di, dj in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
                if 0 <= i + di < n and 0 <= j + dj < n:
                    rows.append(idx[i, j])
                    cols.append(idx[i + di, j + dj])
    flat = SparsityPattern.from_coo(rows, cols, (n * n, n * n))
    grid = flat.with_shapes((n, n), (n, n))
    for P in (flat, grid, flat, grid):
        c = C.color(P, "column")
        assert c.pattern is P and c.pattern.input_shape == P.input_shape
        C.check(P, c)


def test_coloring_memo_results_are_read_only_and_rebased():
    A = np.eye(8, dtype=bool) | np.eye(8, k=1, dtype=bool)
    a, b = C.color(A, "row"), C.color(A, "row")
    assert a is not b and a.pattern is not b.pattern and a.pattern.equals(b.pattern)
    assert not a.colors.flags.writeable and a.colors is b.colors
    with pytest.raises(ValueError):
        b.colors[0] = 3


# -- the memo of id runs ---------------------------------------------------------------------------

def test_movement_memo_entry_count_is_bounded(monkeypatch):
    monkeypatch.setattr(M, "MEMO_TOTAL_ELEMENTS", 256)
    x = torch.rand(8, dtype=torch.float64)
    for k in range(600):
        jacobian_pattern(lambda z, k=k: z * torch.roll(z.detach(), k).sum(), x)
    assert len(M._MEMO) <= M.MEMO_TOTAL_ELEMENTS


def _views():
    return {
        "diagonal of a transpose": lambda z: z.reshape(4, 6).t().diagonal(1) * 1.0,
        "diagonal": lambda z: z.reshape(6, 4).diagonal(1) * 1.0,
        "select of a transpose": lambda z: z.reshape(6, 4).t().select(1, 2) * 1.0,
        "select": lambda z: z.reshape(4, 6).select(1, 2) * 1.0,
        "narrow at an offset": lambda z: z[5:].narrow(0, 2, 6) * 1.0,
        "narrow at another offset": lambda z: z[7:].narrow(0, 2, 6) * 1.0,
        "unfold of a transpose": lambda z: z.reshape(6, 4).t().unfold(1, 3, 2).reshape(-1) * 3,
        "unfold": lambda z: z.reshape(4, 6).unfold(1, 3, 2).reshape(-1) * 3,
        "in-place transpose of a slice": lambda z: (lambda y: (y.t_(), y * 1.0)[1])(z.reshape(4, 6).clone()[:, :4]),
        "in-place transpose": lambda z: (lambda y: (y.t_(), y * 1.0)[1])(z.reshape(4, 6).clone()),
        "copy_ into a strided view": lambda z: (lambda y: (y.t()[1].copy_(z[:4]), y * 1.0)[1])(
            torch.zeros(4, 4, dtype=z.dtype)),
        "copy_ into a row": lambda z: (lambda y: (y[1].copy_(z[2:6]), y * 1.0)[1])(torch.zeros(4, 4, dtype=z.dtype)),
        "tril_ of a transpose": lambda z: (lambda y: (y.tril_(-1), y * 1.0)[1])(z.reshape(6, 4).clone().t()),
        "tril_": lambda z: (lambda y: (y.tril_(-1), y * 1.0)[1])(z.reshape(4, 6).clone()),
    }


def test_memoized_views_follow_strides_and_offsets_of_the_base():
    """Pairs of calls with the same op, shapes and arguments on bases with other strides or storage
    offsets: each pattern equals the dense Jacobian's, with the memo filled by the other first."""
    x = torch.rand(24, dtype=torch.float64) + 0.5
    F = _views()
    for _ in range(2):
        for name, f in F.items():
            got = jacobian_pattern(f, x).toarray()
            want = (torch.func.jacrev(f)(x).reshape(-1, 24) != 0).numpy()
            assert np.array_equal(got, want), name


# -- out= ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["values", "csr"])
def test_inference_mode_buffer_is_refused_by_name_and_left_as_it_was(kind):
    op = asd.prepare_jacobian(_chain, X)
    J = op(X)
    with torch.inference_mode():
        vals = torch.full((op.pattern.nnz,), 7.0, dtype=torch.float64)
        out = vals if kind == "values" else torch.sparse_csr_tensor(J.crow_indices().clone(),
                                                                    J.col_indices().clone(), vals, J.shape)
    try:
        with pytest.raises(InputError, match="out"):
            op.values(X, out=out) if kind == "values" else op(X, out=out)
    finally:
        assert bool((vals == 7.0).all()), "the failed call wrote the buffer"


def test_self_overlapping_buffer_is_refused_by_name():
    op = asd.prepare_jacobian(_chain, X)
    buf = torch.full((1,), 7.0, dtype=torch.float64).expand(op.pattern.nnz)
    with pytest.raises(InputError, match="out"):
        op.values(X, out=buf)


def test_self_overlapping_buffer_is_left_as_it_was():
    op = asd.prepare_jacobian(_chain, X)
    base = torch.full((1,), 7.0, dtype=torch.float64)
    with pytest.raises((InputError, RuntimeError)):
        op.values(X, out=base.expand(op.pattern.nnz))
    assert float(base) == 7.0


def test_out_aliasing_x_gets_the_derivative_at_the_old_x():
    op = asd.prepare_jacobian(torch.sin, X[:5].clone(), check=True)
    for k in range(60):  # past the warm-up and the recorded graph
        z = X[:5] + 0.01 * k
        want = torch.cos(z)
        got = op.values(z, out=z)
        assert got is z
        torch.testing.assert_close(z, want)


# -- pre-existing (not introduced by the reviewed commits) -------------------------------------------

def test_editing_a_returned_csr_does_not_change_later_results():
    """A caller's in-place edit of a returned CSR's indices (through PyTorch or numpy) changed every
    later result: the results shared the operator's own index tensors. They are copy-on-write
    clones now; a result edited so is no longer accepted as ``out=``, one left alone still is."""
    op = asd.prepare_jacobian(_chain, X)
    J = op(X)
    J.col_indices()[0] = 5
    J2 = op(X + 0.5)
    J2.crow_indices().numpy()[1] += 1
    torch.testing.assert_close(op(X + 1).to_dense(), torch.func.jacrev(_chain)(X + 1))
    with pytest.raises(asd.InputError, match="structure"):
        op(X + 1, out=J)
    J3 = op(X)
    assert op(X + 1, out=J3) is J3
    torch.testing.assert_close(J3.to_dense(), torch.func.jacrev(_chain)(X + 1))


def test_results_and_plans_do_not_alias_a_read_only_view_of_a_writable_buffer():
    from asd.coloring.result import ColumnColoring
    from asd.decompression.plans import DirectPlan

    P = asd.patterns.as_pattern(np.eye(4, dtype=bool))
    buf = np.array([0, 1, 0, 1])
    view = buf.view()
    view.flags.writeable = False
    coloring = ColumnColoring(P, "given", view, 2)
    plan = DirectPlan((2, 4), 4, view)
    owned = np.array([0, 1, 0, 1])
    owned.flags.writeable = False
    kept = ColumnColoring(P, "given", owned, 2)
    buf[:] = 7
    assert coloring.colors.tolist() == [0, 1, 0, 1] and plan.gather.tolist() == [0, 1, 0, 1]
    assert np.shares_memory(kept.colors, owned)  # memory no one can write is kept as it is


def test_results_passed_to_asd_linalg_share_one_cached_pattern_without_copies():
    """Each result's indices are copy-on-write clones; asd.linalg finds its pattern by the indices'
    address without writing (``data_ptr()`` would copy each result's indices and miss the cache)."""
    from asd.linalg import _sparse

    f = lambda z: torch.sin(z) * 3.0 + z.roll(1) * z  # noqa: E731
    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    asd.linalg.clear_cache()
    b = torch.rand(12, dtype=torch.float64)
    for k in range(3):
        J = op(x + k)
        y = asd.linalg.matmul(J, b)
        torch.testing.assert_close(y, torch.func.jacrev(f)(x + k) @ b)
        if k:  # (the first builds the pattern, reading the indices through numpy)
            assert torch._C._is_cow_tensor(J.col_indices()) and torch._C._is_cow_tensor(J.crow_indices())
    assert len(_sparse._CACHE) == 1
