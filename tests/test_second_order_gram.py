"""The second-order pattern's squares ``G^T G``: the Numba product of a set matrix with itself, and
the rows of one dependency marked on the diagonal instead of multiplied out, against dense
boolean products (random matrices: short rows, long rows past the insertion sort, empty rows and
columns, rows of one entry mixed with longer ones); and a pattern's row of each entry."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asd.detection import sets as S
from asd.detection.hessian import hessian_pattern
from asd.detection.second_order import SecondOrder, gram


@st.composite
def _set_matrix(draw, n=None, rows=None):
    n = draw(st.integers(1, 40)) if n is None else n
    rows = draw(st.integers(0, 30)) if rows is None else rows
    dense = np.zeros((rows, n), dtype=bool)
    for r in range(rows):
        kind = draw(st.sampled_from(["empty", "one", "few", "many"]))
        if kind == "one":
            dense[r, draw(st.integers(0, n - 1))] = True
        elif kind == "few":
            dense[r, draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))] = True
        elif kind == "many":  # past the kernel's insertion sort
            dense[r, draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))] = True
    return dense


def _set(dense: np.ndarray) -> sp.csr_matrix:
    return S._canonical(sp.csr_matrix(dense))


def _canonical_rows(M: sp.csr_matrix) -> bool:
    return all((np.diff(M.indices[M.indptr[i]:M.indptr[i + 1]]) > 0).all() for i in range(M.shape[0]))


@settings(max_examples=150, deadline=None)
@given(_set_matrix())
def test_gram_matches_the_dense_boolean_product(dense):
    G = _set(dense)
    H = gram(G, G)
    want = (dense.T.astype(np.int64) @ dense.astype(np.int64)) > 0
    assert H.shape == want.shape
    assert np.array_equal(H.toarray(), want)
    assert H.nnz == int(want.sum())  # every column once
    assert _canonical_rows(H)


def test_gram_of_long_interleaved_rows_sorts_them():
    # row i of G^T G gathers many rows whose entries interleave: the sorted path of the kernel
    rng = np.random.default_rng(0)
    dense = rng.random((200, 300)) < 0.2
    G = _set(dense)
    H = gram(G, G)
    assert np.array_equal(H.toarray(), (dense.T.astype(np.int64) @ dense.astype(np.int64)) > 0)
    assert _canonical_rows(H)


def test_gram_refuses_a_column_outside_the_shape():
    G = S._csr(np.array([0, 2]), np.array([1, 7]), (1, 8))
    bad = S._csr(G.indptr, G.indices, (1, 5))  # built without validation: column 7 of 5
    with pytest.raises(ValueError, match="outside its shape"):
        S._kernels().gram(bad.indptr, bad.indices, 5)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_squares_flushed_with_their_single_rows_on_the_diagonal_match_the_sum_of_products(data):
    n = data.draw(st.integers(1, 30))
    parts = data.draw(st.lists(_set_matrix(n=n), min_size=1, max_size=4))
    acc = SecondOrder(n)
    want = np.zeros((n, n), dtype=bool)
    for dense in parts:
        acc.add_square(_set(dense) if dense.any() else None)
        want |= (dense.T.astype(np.int64) @ dense.astype(np.int64)) > 0
    H = acc.pattern()
    assert np.array_equal(H.toarray(), want)
    assert _canonical_rows(H)


@pytest.mark.parametrize("f", [
    lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(),  # singles covered by pairs
    lambda x: (x[:4] ** 2).sum() + torch.exp(x[5:]).sum() + (x[2] * x[3]),  # singles only on the diagonal
    lambda x: torch.sin(x).sum() + (x[:3].sum() ** 2),  # a long row and singles
])
def test_hessian_patterns_with_single_dependency_squares_match_dense(f):
    x = torch.rand(9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = hessian_pattern(f, x).to_scipy().toarray()
    want = torch.autograd.functional.hessian(f, x) != 0
    assert np.array_equal(got, want.numpy())


def test_gram_of_many_rows_over_one_block_is_the_block():
    # 400 rows over the same 60 columns: the output is 60 x 60, whatever a bound from the rows'
    # lengths would reserve (400 x 60 per column)
    n, K, B = 5000, 400, 60
    G = S._csr(np.arange(0, K * B + 1, B), np.tile(np.arange(B), K), (K, n))
    H = gram(G, G)
    assert H.nnz == B * B
    assert np.array_equal(H.indptr[:B + 1], np.arange(0, B * B + 1, B)) and H.indptr[-1] == B * B
    assert np.array_equal(H.indices, np.tile(np.arange(B), B))


def test_squares_whose_entries_start_past_the_first_keep_their_diagonal():
    # a matrix built by hand whose indptr starts at 2: its unused leading entries must not count
    if S._FIELDS is None:
        pytest.skip("this scipy's csr_matrix is one the set module does not build by hand")
    single = S._csr(np.array([0, 1]), np.array([5]), (1, 6))  # x5 ** 2 -> (5, 5)
    offset = sp.csr_matrix.__new__(sp.csr_matrix)
    offset.__dict__.update(S._FIELDS, _shape=(1, 6), indices=np.array([5, 0, 1, 2], np.int32),
                           indptr=np.array([2, 4], np.int32), data=np.ones(4, bool))  # the row {1, 2}
    acc = SecondOrder(6)
    acc.add_square(single)
    acc.add_square(offset)
    want = np.zeros((6, 6), dtype=bool)
    want[5, 5] = True
    want[np.ix_([1, 2], [1, 2])] = True
    assert np.array_equal(acc.pattern().toarray(), want)


@settings(max_examples=60, deadline=None)
@given(_set_matrix())
def test_pattern_rows_list_the_row_of_every_entry(dense):
    from asd.patterns import SparsityPattern

    M = sp.csr_matrix(dense)
    P = SparsityPattern.from_csr(M.indptr, M.indices, dense.shape, canonical=True)
    rows = P.rows
    assert np.array_equal(rows, np.repeat(np.arange(dense.shape[0]), np.diff(M.indptr)))
    assert rows.dtype == np.int64 and not rows.flags.writeable


def test_pattern_rows_kernel_refuses_pointers_past_the_entries():
    from asd._pattern_kernels import csr_rows

    for indptr in ([0, 5, 3], [0, 2, 1, 3], [1, 2, 3], [0, 1, 2]):  # past, decreasing, not from 0, short
        with pytest.raises(ValueError, match="row pointers"):
            csr_rows(np.array(indptr, dtype=np.int64), np.empty(3, dtype=np.int64))


@pytest.mark.parametrize("k", [3, 5000])
def test_take_rows_of_a_long_range_and_of_its_look_alikes(k):
    # a block of consecutive rows is taken as views; an index array with the same ends that is not
    # one (a swap inside) is gathered
    rng = np.random.default_rng(k)
    dense = rng.random((k + 20, 30)) < 0.2
    M = _set(dense)
    block = np.arange(7, 7 + k)
    swapped = block.copy()
    swapped[[1, k - 2]] = swapped[[k - 2, 1]]
    for idx in (block, swapped, block.astype(np.int32)):
        assert np.array_equal(S.take_rows(M, idx).toarray(), dense[idx])


def test_gram_grows_its_room_past_the_first_reservation():
    # disjoint blocks of 100 columns: 2e6 entries out of 2e4 in, past the 16x-the-input reservation
    n, B = 20000, 100
    G = S._csr(np.arange(0, n + 1, B), np.arange(n), (n // B, n))
    H = gram(G, G)
    assert H.nnz == n * B
    assert np.array_equal(np.diff(H.indptr), np.full(n, B))
    want = (np.arange(n) // B * B)[:, None] + np.arange(B)[None, :]
    assert np.array_equal(H.indices.reshape(n, B), want)
