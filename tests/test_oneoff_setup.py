"""What an operator builds once (issue 15: the one-off Jacobian): the transpose, the row plan's
gather, the seed block types the backends read without building seeds, the decompressor's lazy row
indices. Each equals the plain construction it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import asd
from asd import patterns as PT
from asd.backends.base import seed_block_types
from asd.coloring import AcyclicColoring, BiColoring, ColumnColoring, RowColoring, StarColoring, color
from asd.decompression.device import Decompressor
from asd.patterns import SparsityPattern


def _random(m, n, density, seed) -> SparsityPattern:
    A = sp.random(m, n, density=density, random_state=seed, format="csr").tolil()
    if m > 3:
        A[1, :] = 0  # an empty row
    A = sp.csr_array(A)
    A.eliminate_zeros()
    return SparsityPattern.from_csr(A.indptr, A.indices, A.shape)


SHAPES = [(1, 1, 1.0), (5, 7, 0.3), (40, 30, 0.1), (200, 300, 0.02), (3, 0, 0.5), (0, 4, 0.5), (6, 6, 0.0)]


@pytest.mark.parametrize("m, n, density", SHAPES)
@pytest.mark.parametrize("kernel", [True, False])
def test_transpose_with_positions_is_scipys(m, n, density, kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(PT, "_TOCSC", [None])  # a scipy without the kernel: the matrix route
    P = _random(m, n, density, 7) if m and n else SparsityPattern.empty((m, n))
    T, pos = P.transpose_with_positions
    A = P.to_scipy()
    C = sp.csr_array((np.arange(P.nnz), P.indices, P.indptr), shape=P.shape).tocsc()
    assert T.shape == (P.shape[1], P.shape[0]) and (T.input_shape, T.output_shape) == (P.output_shape, P.input_shape)
    assert np.array_equal(T.indptr, C.indptr) and np.array_equal(T.indices, C.indices) and np.array_equal(pos, C.data)
    assert np.array_equal(T.toarray(), A.toarray().T)
    for a in (T.indptr, T.indices, pos):
        assert a.dtype == np.int64 and not a.flags.writeable
    assert P.has_transpose and P.T is T


def test_the_kernel_is_checked_against_tocsc():
    assert PT._csr_to_csc_kernel() is not None  # this scipy has it and it answers as tocsc does


@pytest.mark.parametrize("m, n, density", SHAPES)
def test_the_row_plan_gathers_colors_of_rows_times_n_plus_columns(m, n, density):
    P = _random(m, n, density, 3) if m and n else SparsityPattern.empty((m, n))
    colors = np.random.default_rng(0).integers(0, 4, m)
    plan = RowColoring(P, "given", colors, 4).plan
    want = colors[P.rows] * n + P.indices
    assert np.array_equal(plan.gather, want) and plan.gather.dtype == np.int64 and not plan.gather.flags.writeable
    assert plan.compressed_shape == (4, n)


def _colorings():
    A = _random(30, 30, 0.1, 1)
    S = asd.coloring.symmetric_pattern(A)
    return [color(A, "column"), color(A, "row"), color(S, "star"), color(S, "acyclic"), color(A, "bidirectional")]


@pytest.mark.parametrize("coloring", _colorings(), ids=lambda c: c.problem)
def test_seed_block_types_are_those_of_the_seed_blocks(coloring):
    assert seed_block_types(coloring) == tuple(type(b) for b in coloring.seed_blocks())


def test_seed_block_types_of_another_coloring_class_build_the_blocks():
    class Mine(ColumnColoring):
        def seed_blocks(self, dtype=None, device=None):
            return super().seed_blocks(dtype, device) * 2

    c = color(_random(10, 10, 0.2, 2), "column")
    mine = Mine(c.pattern, c.order, c.colors, c.ncolors)
    assert len(seed_block_types(mine)) == 2


def test_every_coloring_class_is_covered():
    assert {type(c) for c in _colorings()} == {StarColoring, AcyclicColoring, BiColoring, RowColoring, ColumnColoring}


def test_the_decompressors_row_indices_are_built_on_first_use():
    c = color(_random(20, 15, 0.2, 5), "row")
    d = Decompressor(c, "cpu")
    assert "rows" not in d.__dict__
    assert torch.equal(d.rows, torch.tensor(c.pattern.rows))
    assert d.rows is d.rows


def test_a_one_off_jacobian_is_the_dense_one_and_probes_clean():
    from asd.problems import brusselator, brusselator_input

    f, x = brusselator(16), brusselator_input(16)
    J = asd.sparse_jacobian(f, x, cache=False)
    torch.testing.assert_close(J.to_dense(), torch.func.jacrev(f)(x), rtol=1e-13, atol=1e-13)
    op = asd.prepare_jacobian(f, x)
    assert op.check(x).ok  # the probe reads the decompressor's row indices
