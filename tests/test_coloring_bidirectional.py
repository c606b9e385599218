"""Bidirectional (star bicoloring) colorings: neutral colors, decompression from JVPs + VJPs."""

import numpy as np
import pytest
import scipy.sparse as sp

import asd.coloring as C


def _roundtrip(res, seed=0):
    v = np.random.default_rng(seed).standard_normal(res.nnz)
    J = res.to_scipy(v).toarray()
    rs, cs = res.seeds()
    assert rs.shape == (res.shape[0], res.nrow_colors) and cs.shape == (res.shape[1], res.ncol_colors)
    Bc = (J @ cs).T  # (ncol, m): one JVP per column color
    Br = (J.T @ rs).T  # (nrow, n): one VJP per row color
    assert (Bc.shape, Br.shape) == res.plan.compressed_shape
    flat = np.concatenate([Bc.ravel(), Br.ravel()])
    np.testing.assert_array_equal(res.decompress(flat), v)


@pytest.mark.parametrize("order", C.ORDERS)
@pytest.mark.parametrize("postprocess", [False, True])
def test_random_bidirectional(order, postprocess):
    for seed in range(4):
        A = sp.random(20 + 5 * seed, 30 - 3 * seed, density=0.1, random_state=seed, format="csr")
        res = C.color(A, "bidirectional", order, seed=seed, postprocess=postprocess)
        rc, cc = res.colors
        assert rc.dtype == np.int64 and cc.dtype == np.int64
        assert res.ncolors == res.nrow_colors + res.ncol_colors
        C.check(A, res)
        _roundtrip(res, seed)


def test_antidiagonal_neutral():
    A = np.fliplr(np.eye(4, dtype=bool))
    assert C.color(A, "bidirectional").ncolors <= 2  # star bicoloring: 2; one-sided fallback: 1
    r = C.color(A, "bidirectional", postprocess=True)
    assert r.ncolors == 1
    rc, cc = r.colors
    assert (rc == -1).all() or (cc == -1).all()
    _roundtrip(r)


def test_dense_row_and_column():
    # arrow: a dense row and a dense column need n colors one-sided, 3 bidirectionally
    n = 30
    A = np.eye(n, dtype=bool)
    A[0, :] = A[:, 0] = True
    assert C.color(A, "column").ncolors == n
    r = C.color(A, "bidirectional", "best", postprocess=True)
    assert r.ncolors <= 3
    C.check(A, r)
    _roundtrip(r)


def test_smb_targets():
    from asd.coloring.mtx import read_pattern

    A = read_pattern("tests/data/matrices/smb_jac_pattern.mtx")
    assert C.color(A, "column").ncolors == 8
    r = C.color(A, "bidirectional")
    assert r.ncolors <= 10
    C.check(A, r, rounds=1)
