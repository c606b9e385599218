"""Property tests: every problem and order on random patterns of many shapes - the coloring
passes ``check`` and decompression reproduces a random matrix of the pattern exactly."""

import numpy as np
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asd.coloring as C


@st.composite
def patterns(draw, square=False):
    m = draw(st.integers(1, 24))
    n = m if square else draw(st.integers(1, 24))
    density = draw(st.sampled_from([0.0, 0.05, 0.15, 0.3, 0.6, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    D = rng.random((m, n)) < density
    kind = draw(st.sampled_from(["dense", "csr", "coo_dups"]))
    if kind == "dense":
        return D
    if kind == "csr":
        return sp.csr_array(D.astype(float))
    r, c = np.nonzero(D)
    r, c = np.concatenate([r, r[: len(r) // 2]]), np.concatenate([c, c[: len(c) // 2]])
    return sp.coo_array((np.ones(r.size), (r, c)), shape=(m, n))


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _values(res, rng):
    # integer values: the products are exact, so decompression must be exact
    return rng.integers(-50, 50, size=res.nnz).astype(np.float64) + 0.5


@SETTINGS
@given(patterns(), st.sampled_from(["column", "row"]), st.sampled_from(C.ORDERS), st.integers(0, 3))
def test_partial(pattern, problem, order, seed):
    res = C.color(pattern, problem, order, seed=seed)
    assert C.check(pattern, res, rounds=1)
    v = _values(res, np.random.default_rng(seed))
    J = res.to_scipy(v).toarray()
    S = res.seeds()
    B = S @ J.T if problem == "column" else S @ J
    np.testing.assert_array_equal(res.decompress(B), v)
    np.testing.assert_array_equal(C.color(pattern, problem, order, seed=seed).colors, res.colors)


@SETTINGS
@given(patterns(square=True), st.sampled_from(["star", "acyclic"]), st.sampled_from(C.ORDERS),
       st.booleans(), st.integers(0, 3))
def test_symmetric(pattern, problem, order, postprocess, seed):
    res = C.color(pattern, problem, order, seed=seed, postprocess=postprocess)
    assert C.check(pattern, res, rounds=1)
    v = _values(res, np.random.default_rng(seed))
    v = v + v[res.pattern.transpose_with_positions[1]]
    H = res.to_scipy(v).toarray()
    np.testing.assert_array_equal(H, H.T)
    B = res.seeds() @ H
    np.testing.assert_array_equal(res.decompress(B), v)


@SETTINGS
@given(patterns(), st.sampled_from(C.ORDERS), st.booleans(), st.integers(0, 3))
def test_bidirectional(pattern, order, postprocess, seed):
    res = C.color(pattern, "bidirectional", order, seed=seed, postprocess=postprocess)
    assert C.check(pattern, res, rounds=1)
    v = _values(res, np.random.default_rng(seed))
    J = res.to_scipy(v).toarray()
    rs, cs = res.seeds()
    flat = np.concatenate([(cs @ J.T).ravel(), (rs @ J).ravel()])
    np.testing.assert_array_equal(res.decompress(flat), v)


@settings(max_examples=15, deadline=None)
@given(patterns(square=True), st.sampled_from(C.PROBLEMS))
def test_best(pattern, problem):
    res = C.color(pattern, problem, "best", postprocess=True)
    C.check(pattern, res, rounds=1)
    nat = C.color(pattern, problem, "natural", postprocess=True)
    assert res.ncolors <= nat.ncolors


@SETTINGS
@given(patterns(square=True), st.sampled_from(C.ORDERS), st.integers(0, 3))
def test_row_and_column_problems_of_a_symmetric_pattern_agree(pattern, order, seed):
    """What lets the default Jacobian coloring color a symmetric pattern only once."""
    A = sp.csr_array(pattern).astype(bool)
    S = sp.csr_array(A + A.T)
    col = C.color(S, "column", order, seed=seed)
    row = C.color(S, "row", order, seed=seed)
    assert col.ncolors == row.ncolors
    np.testing.assert_array_equal(col.colors, row.colors)


def test_default_jacobian_coloring_of_a_symmetric_pattern_colors_once(monkeypatch):
    from asd.coloring import choose
    from asd.detection import jacobian_pattern
    from asd.problems import brusselator, brusselator_input

    P = jacobian_pattern(brusselator(8), brusselator_input(8))
    assert P.is_symmetric
    calls = []
    real = C.color
    monkeypatch.setattr(C, "color", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    res = choose.choose_jacobian(P, None, "natural", prefer="row")
    assert calls == ["row"] and res.problem == "row"
    assert choose.choose_jacobian(P, None, "natural", prefer="column").problem == "column"
    assert C.check(P.to_scipy(), res)


@settings(max_examples=150, deadline=None)
@given(m=st.integers(1, 25), n=st.integers(1, 25), density=st.sampled_from([0.05, 0.2, 0.5, 0.9]),
       seed=st.integers(0, 2**31 - 1), prefer=st.sampled_from(["row", "column"]),
       order=st.sampled_from(["natural", "largest_first", "smallest_last"]))
def test_default_jacobian_coloring_is_the_better_of_both_colorings(m, n, density, seed, prefer, order):
    """The default Jacobian coloring is the one with fewer colors of the column and row colorings
    (``prefer`` on a tie), also where it skips the second because the first already reaches that
    side's lower bound (the densest row or column)."""
    from asd.coloring import choose
    from asd.patterns import as_pattern

    D = np.random.default_rng(seed).random((m, n)) < density
    P = as_pattern(sp.csr_array(D))
    col, row = C.color(P, "column", order), C.color(P, "row", order)
    want = col if col.ncolors < row.ncolors or (col.ncolors == row.ncolors and prefer == "column") else row
    got = choose.choose_jacobian(P, None, order, prefer=prefer)
    if C.hopeless(P, "column") and C.hopeless(P, "row"):
        return
    if P.input_shape == P.output_shape and P.is_symmetric:
        assert got.problem == prefer
        return
    assert got.problem == want.problem and got.ncolors == want.ncolors
    np.testing.assert_array_equal(got.colors, want.colors)
    assert C.check(D, got)


def test_default_jacobian_coloring_skips_the_side_that_cannot_win(monkeypatch):
    """A convolution's pattern: 27 column colors reach the column lower bound, and rows need at
    least 72, so the row coloring (the costly one) is not computed."""
    from asd.coloring import choose
    from asd.detection import jacobian_pattern
    from asd.problems import conv_layer

    f, x = conv_layer("b")
    P = jacobian_pattern(f, x)
    calls = []
    real = C.color
    monkeypatch.setattr(C, "color", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    res = choose.choose_jacobian(P, None, "natural", prefer="row")
    assert calls == ["column"] and res.problem == "column" and res.ncolors == 27
    assert C.lower_bound(P, "row") >= 72


@st.composite
def square_structures(draw):
    """Square patterns: symmetric (A + A^T), symmetric but for one entry, or random."""
    n = draw(st.integers(1, 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    D = rng.random((n, n)) < draw(st.sampled_from([0.0, 0.1, 0.3, 1.0]))
    kind = draw(st.sampled_from(["symmetric", "almost", "random"]))
    if kind != "random":
        D = D | D.T
    if kind == "almost":
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if i != j:
            D[i, j] = not D[i, j]
    return D


@SETTINGS
@given(square_structures())
def test_the_transpose_and_its_positions_are_scipys(D):
    """A symmetric pattern's transpose comes from one pass that finds every entry's mirror (the
    pattern itself, sharing its arrays); any other from scipy's CSR -> CSC: both are the transpose,
    with the position of every entry, and the symmetry they report is the matrix's."""
    from unittest import mock

    import asd.patterns
    from asd.patterns import as_pattern

    P = as_pattern(D)
    with mock.patch.object(asd.patterns, "SYMMETRIC_KERNEL_NNZ", 0):  # the kernel's route at any size
        T, perm = P.transpose_with_positions
    want = sp.csr_array(D.T.astype(np.int8))
    want.sort_indices()
    np.testing.assert_array_equal(T.indptr, want.indptr)
    np.testing.assert_array_equal(T.indices, want.indices)
    rows = P.rows
    np.testing.assert_array_equal(rows[perm], T.indices)  # T's entry (j, i) is P's entry (i, j)
    np.testing.assert_array_equal(P.indices[perm], T.rows)
    assert P.is_symmetric == bool((D == D.T).all())
    assert not perm.flags.writeable and not T.indices.flags.writeable


def test_the_mirror_kernel_refuses_malformed_structures_without_reading_past_them():
    from numba import njit

    from asd import _pattern_kernels

    # compiled with bounds checks: a read past the arrays raises here instead of reading garbage
    symmetric_mirror = njit(boundscheck=True)(_pattern_kernels.symmetric_mirror.py_func)

    I = np.int64
    for indptr, indices in (([0, 3, 1, 2], [0, 0]),  # decreasing row pointers
                            ([0, 1, 2], [0, 5]),  # a column past n
                            ([0, 1, 2], [0, -1]),  # a negative column
                            ([0, 2, 2], [1, 0])):  # unsorted: not a canonical structure
        mirror, ok = symmetric_mirror(np.array(indptr, dtype=I), np.array(indices, dtype=I))
        assert not ok and mirror.size == 0
    mirror, ok = symmetric_mirror(np.array([0, 2, 3], dtype=I), np.array([0, 1, 0], dtype=I))
    assert ok and mirror.tolist() == [0, 2, 1]


def test_a_pattern_built_directly_is_checked_before_any_kernel_reads_it():
    """The constructor refuses row pointers that decrease, columns outside [0, n) and unsorted or
    repeated columns (scipy's CSR -> CSC and asd's kernels index with them unchecked: such a
    pattern crashed the process); from_csr and as_pattern accept any CSR arrays."""
    import pytest

    from asd.errors import InputError
    from asd.patterns import SparsityPattern

    I = np.int64
    bad = [((3, 3), [0, 1, 2, 3], [0, 1, 10**9]), ((3, 3), [0, 1000000, 1, 2], [0, 0]),
           ((2, 3), [0, 1, 2], [0, -1]), ((1, 3), [0, 2], [2, 1]), ((1, 3), [0, 2], [1, 1])]
    for shape, indptr, indices in bad:
        with pytest.raises(InputError):
            SparsityPattern(shape, np.array(indptr, dtype=I), np.array(indices, dtype=I))
    ok = SparsityPattern((2, 3), np.array([0, 2, 3], dtype=I), np.array([0, 2, 1], dtype=I))
    assert ok.T.shape == (3, 2) and ok.T.nnz == 3
    fixed = SparsityPattern.from_csr([0, 2], [2, 1], (1, 3))  # unsorted input, canonicalized
    assert fixed.indices.tolist() == [1, 2]
