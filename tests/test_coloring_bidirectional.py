"""Bidirectional (star bicoloring) colorings: neutral colors, decompression from JVPs + VJPs."""

import numpy as np
import pytest
import scipy.sparse as sp

import asd.coloring as C


def _roundtrip(res, seed=0):
    v = np.random.default_rng(seed).standard_normal(res.nnz)
    J = res.to_scipy(v).toarray()
    rs, cs = res.seeds()
    assert rs.shape == (res.nrow_colors, res.shape[0]) and cs.shape == (res.ncol_colors, res.shape[1])
    Bc = cs @ J.T  # (ncol, m): one JVP per column color
    Br = rs @ J  # (nrow, n): one VJP per row color
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


# -- dense rows and columns (the patterns bicoloring exists for) ---------------------------
DETERMINISTIC = [o for o in C.ORDERS if o != "random"]


def _arrow(n):
    A = np.eye(n, dtype=bool)
    A[0, :] = A[:, 0] = True
    return A


def _dense_edges(m, n, density=0.0, seed=0):
    A = sp.random(m, n, density=density, random_state=seed, format="lil").astype(bool)
    A[0, :] = A[-1, :] = True
    A[:, 0] = A[:, -1] = True
    return A.tocsr()


@pytest.mark.parametrize("order", DETERMINISTIC)
@pytest.mark.parametrize("n", [3, 5, 40, 200])
def test_arrowhead_every_order(order, n):
    A = _arrow(n)
    r = C.color(A, "bidirectional", order)
    assert r.ncolors <= 4
    C.check(A, r)
    _roundtrip(r)
    rp = C.color(A, "bidirectional", order, postprocess=True)
    assert rp.ncolors <= 3
    C.check(A, rp)
    _roundtrip(rp)


@pytest.mark.parametrize("order", C.ORDERS)
def test_smc_small_cases(order):
    A = np.fliplr(np.eye(4, dtype=bool))
    assert C.color(A, "bidirectional", order).ncolors <= 2
    assert C.color(A, "bidirectional", order, postprocess=True).ncolors == 1
    T = np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]], dtype=bool)
    for pp in (False, True):
        r = C.color(T, "bidirectional", order, postprocess=pp)
        assert r.ncolors == 3
        C.check(T, r)
    S = _dense_edges(10, 20)
    r = C.color(S, "bidirectional", order)
    rp = C.color(S, "bidirectional", order, postprocess=True)
    assert r.ncolors <= 6 and rp.ncolors <= 4
    for res in (r, rp):
        C.check(S, res)
        _roundtrip(res)


@pytest.mark.parametrize("order", DETERMINISTIC)
def test_dense_edges_with_sparse_interior(order):
    A = _dense_edges(200, 300, density=0.02, seed=1)
    inner = A[1:-1, 1:-1]
    opt_inner = min(C.color(inner, "column", order).ncolors, C.color(inner, "row", order).ncolors)
    for pp in (False, True):
        r = C.color(A, "bidirectional", order, postprocess=pp)
        # 2 dense rows + 2 dense columns + the interior (one-sided: >= 200 colors)
        assert r.ncolors <= opt_inner + 4 + 2
        C.check(A, r, rounds=1)
        _roundtrip(r)


def test_bidirectional_deterministic():
    A = _dense_edges(60, 80, density=0.05, seed=3)
    for order in C.ORDERS:
        r1 = C.color(A, "bidirectional", order, seed=2)
        r2 = C.color(A, "bidirectional", order, seed=2)
        assert r1.ncolors == r2.ncolors
        assert all(np.array_equal(a, b) for a, b in zip(r1.colors, r2.colors))
        assert np.array_equal(r1.plan.gather, r2.plan.gather)


@pytest.mark.timeout(120)  # a guard against a hang; its speed is measured in benchmarks/coloring.py
def test_smb_bidirectional_colors():
    from asd.coloring.mtx import read_pattern

    A = read_pattern("tests/data/matrices/smb_jac_pattern.mtx")
    r = C.color(A, "bidirectional", postprocess=True)
    assert r.ncolors <= 10


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:

    @st.composite
    def _dense_patterns(draw):
        m = draw(st.integers(2, 40))
        n = draw(st.integers(2, 40))
        seed = draw(st.integers(0, 2**31 - 1))
        density = draw(st.sampled_from([0.0, 0.02, 0.05, 0.1]))
        A = sp.random(m, n, density=density, random_state=seed, format="lil").astype(bool)
        rng = np.random.default_rng(seed)
        kr = draw(st.integers(0, min(3, m)))
        kc = draw(st.integers(0, min(3, n)))
        A[rng.choice(m, kr, replace=False), :] = True
        A[:, rng.choice(n, kc, replace=False)] = True
        return A.tocsr(), kr, kc

    @settings(max_examples=60, deadline=None)
    @given(_dense_patterns(), st.sampled_from(C.ORDERS), st.booleans())
    def test_bidirectional_dense_rows_columns(case, order, pp):
        A, kr, kc = case
        m, n = A.shape
        r = C.color(A, "bidirectional", order, seed=1, postprocess=pp)
        C.check(A, r, rounds=1)
        _roundtrip(r)
        onesided = min(C.color(A, "column", order, seed=1).ncolors, C.color(A, "row", order, seed=1).ncolors)
        assert r.ncolors <= onesided
        if kr and kc and min(m, n) >= 20:
            # dense rows + dense columns: one-sided needs >= min(m, n) colors; bidirectional
            # colors the kr dense rows, the kc dense columns and the sparse rest
            inner = A.copy().tolil()
            inner[[i for i in range(m) if A[[i], :].nnz == n], :] = False
            inner[:, [j for j in range(n) if A[:, [j]].nnz == m]] = False
            inner = inner.tocsr()
            rest = C.color(inner, "column", order, seed=1).ncolors if inner.nnz else 0
            assert r.ncolors <= kr + kc + rest + 2
            assert r.ncolors < onesided
