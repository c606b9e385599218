"""Lattice colorings (asd/coloring/lattice.py), the degree bounds, and the colorings kept by pattern
content (asd/coloring/__init__.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import asd
import asd.coloring as C
from asd.coloring import lattice as L
from asd.patterns import SparsityPattern
from asd.problems import brusselator, brusselator_input


def _stencil(shape, offsets, periodic=False) -> SparsityPattern:
    """Rows and columns on the grid ``shape``; row ``p`` holds ``p + o`` for each offset ``o``."""
    shape = tuple(shape)
    coords = np.stack(np.unravel_index(np.arange(int(np.prod(shape))), shape), axis=1)
    rows, cols = [], []
    for o in offsets:
        q = coords + np.asarray(o)
        if periodic:
            q %= np.asarray(shape)
            keep = np.ones(len(q), dtype=bool)
        else:
            keep = ((q >= 0) & (q < np.asarray(shape))).all(axis=1)
        rows.append(np.flatnonzero(keep))
        cols.append(np.ravel_multi_index(tuple(q[keep].T), shape))
    n = int(np.prod(shape))
    return SparsityPattern.from_coo(np.concatenate(rows), np.concatenate(cols), (n, n), input_shape=shape,
                                    output_shape=shape)


FIVE = [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)]
NINE = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]
SEVEN = [(0, 0, 0), (1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]


def _reference(P: SparsityPattern, shape, lower: int, upper: int, budget: int):
    """The search as specified, without its shortcuts: grids from the sample, then every ``k`` from
    the lower bound up and every coefficient vector in order, each checked on every row."""
    n = P.shape[1]
    if n == 0 or upper <= max(lower, 1):
        return None
    sample = L._sample_entries(P, 64)
    if sample.shape[1] > 64:
        return None
    rows = [P.indices[P.indptr[i]:P.indptr[i + 1]] for i in range(P.shape[0])]
    tried = 0
    for grid in L._grids(sample, n, shape):
        coords = np.stack(np.unravel_index(np.arange(n), grid))
        for k in range(max(lower, 2), upper):
            coefs = list(itertools.product(range(k), repeat=len(grid) - 1))
            tried += len(coefs)
            if tried > budget:
                return None
            for a in coefs:
                colors = (np.array(a + (1,)) @ coords) % k
                if all(len(set(colors[r].tolist())) == len(r) for r in rows):
                    used = sorted(set(colors.tolist()))
                    remap = {c: i for i, c in enumerate(used)}
                    return np.array([remap[c] for c in colors.tolist()]), len(used)
    return None


def _patterns():
    out = [("5pt", _stencil((12, 10), FIVE), None), ("5pt periodic", _stencil((10, 10), FIVE, True), None),
           ("9pt", _stencil((9, 11), NINE), None), ("7pt 3d", _stencil((5, 6, 4), SEVEN), None),
           ("5pt flat", _stencil((12, 10), FIVE), (120,))]
    for N in (8, 16):
        P = asd.detection.jacobian_pattern(brusselator(N), brusselator_input(N))
        out += [(f"brusselator {N}", P, None), (f"brusselator {N} rows", P.T, None)]
    rng = np.random.default_rng(3)
    out.append(("random", SparsityPattern.from_csr(*(lambda A: (A.indptr, A.indices))(
        sp.random(60, 60, density=0.05, random_state=rng, format="csr")), (60, 60)), None))
    return out


@pytest.mark.parametrize("name, P, flat", _patterns(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("budget", [400, 60, 10])
def test_lattice_search_finds_what_the_plain_search_finds(name, P, flat, budget, monkeypatch):
    """All moduli in one batch, the sample checks, the colors counted by bincount: the same first
    valid candidate (fewest colors, then coefficient order) as checking every candidate on every
    row, the same budget."""
    monkeypatch.setattr(L, "MAX_CANDIDATES", budget)
    shape = P.input_shape if flat is None else flat
    if flat is not None:
        P = P.with_shapes(flat, flat)
    for lower, upper in [(2, 12), (5, 8), (1, 30), (6, 12), (4, 5), (3, 3)]:
        got = L.lattice_colors(P, shape, lower, upper)
        want = _reference(P, shape, lower, upper, budget)
        assert (got is None) == (want is None), (name, lower, upper)
        if got is not None:
            assert got[1] == want[1] and np.array_equal(got[0], want[0]), (name, lower, upper)
            assert got[1] < upper


def test_lattice_gives_the_optimal_five_colors_of_a_five_point_stencil():
    P = _stencil((20, 20), FIVE)
    colors, k = L.lattice_colors(P, P.input_shape, C.lower_bound(P, "column"), 7)
    assert k == 5
    assert C.check(P.to_scipy(), C.ColumnColoring(P, "lattice", colors, k))


@pytest.mark.parametrize("problem", ["column", "row"])
def test_degrees_read_off_the_transpose_equal_the_counted_ones(problem):
    A = sp.random(40, 30, density=0.1, random_state=1, format="csr")
    P = SparsityPattern.from_csr(A.indptr, A.indices, A.shape)
    Q = SparsityPattern.from_csr(A.indptr, A.indices, A.shape)
    assert not P.has_transpose
    counted = C.lower_bound(P, problem), C.hopeless(P, problem)
    Q.T
    assert Q.has_transpose
    assert (C.lower_bound(Q, problem), C.hopeless(Q, problem)) == counted
    want = (np.diff(A.indptr) if problem == "column" else np.bincount(A.indices, minlength=30)).max()
    assert counted[0] == want


# -- colorings kept by pattern content --------------------------------------------------------------

def _fresh(P: SparsityPattern) -> SparsityPattern:
    """An equal pattern that shares nothing with ``P``."""
    return SparsityPattern(P.shape, P.indptr.copy(), P.indices.copy(), P.input_shape, P.output_shape)


@pytest.fixture
def colorings(monkeypatch):
    """The calls that color (memo misses)."""
    calls = []
    real = C._color
    monkeypatch.setattr(C, "_color", lambda P, problem, *a: calls.append(problem) or real(P, problem, *a))
    return calls


def test_an_equal_pattern_gets_the_same_coloring_without_coloring_again(colorings):
    P = asd.detection.jacobian_pattern(brusselator(16), brusselator_input(16))
    first = C.color(P, "row")
    plan = first.plan
    Q = _fresh(P)
    again = C.color(Q, "row")
    assert colorings == ["row"]
    assert again.pattern is Q and again.ncolors == first.ncolors and again.order == first.order
    assert np.array_equal(again.colors, first.colors)
    assert again.__dict__.get("plan") is plan  # the plan (a function of the content) comes with it
    assert C.check(Q.to_scipy(), again)


def test_the_memo_tells_patterns_apart_by_content_shapes_and_options(colorings):
    P = _stencil((10, 10), FIVE)
    C.color(P, "column")
    # the same shape and number of entries, one entry moved
    indices = P.indices.copy()
    row = 37
    lo, hi = P.indptr[row], P.indptr[row + 1]
    free = next(j for j in range(100) if j not in set(indices[lo:hi].tolist()))
    indices[lo] = free
    indices[lo:hi].sort()
    moved = SparsityPattern(P.shape, P.indptr.copy(), indices, P.input_shape, P.output_shape)
    r = C.color(moved, "column")
    assert C.check(moved.to_scipy(), r)
    flat = P.with_shapes((100,), (100,))  # the lattice reads the grid from the shapes
    C.color(flat, "column")
    C.color(_fresh(P), "column", order="largest_first")
    C.color(_fresh(P), "row")
    C.color(_fresh(P), "star")
    C.color(_fresh(P), "column", order="random", seed=1)
    C.color(_fresh(P), "column", order="random", seed=2)
    assert colorings == ["column", "column", "column", "column", "row", "star", "column", "column"]
    C.color(_fresh(P), "column", order="random", seed=2)
    C.color(_fresh(flat), "column")
    assert len(colorings) == 8


def test_symmetric_problems_keep_the_symmetrized_pattern(colorings):
    A = sp.random(30, 30, density=0.1, random_state=4, format="csr")
    P = SparsityPattern.from_csr(A.indptr, A.indices, A.shape)
    first = C.color(P, "star")
    again = C.color(SparsityPattern.from_csr(A.indptr, A.indices, A.shape), "star")
    assert colorings == ["star"]
    assert again.pattern.equals(C.symmetric_pattern(P)) and np.array_equal(again.colors, first.colors)
    assert C.check((A + A.T).tocsr(), again)


def test_an_equal_pattern_shares_the_transpose_and_symmetry():
    from asd.coloring.choose import choose_jacobian

    P = asd.detection.jacobian_pattern(brusselator(8), brusselator_input(8))
    choose_jacobian(P, None, "natural", prefer="row")  # reads P.is_symmetric
    Q = _fresh(P)
    C.recall_derived(Q)
    assert Q.has_transpose and Q.T is P.T and Q.__dict__["is_symmetric"] is True
    other = _stencil((8, 8), FIVE)
    C.recall_derived(other)
    assert not other.has_transpose


def test_the_memo_is_bounded_and_cleared(colorings, monkeypatch):
    monkeypatch.setattr(C, "MEMO_ENTRIES", 3)
    pats = [_stencil((6, 5 + i), FIVE) for i in range(5)]
    for P in pats:
        C.color(P, "column")
    assert len(C._MEMO) == 3
    C.color(_fresh(pats[0]), "column")  # evicted: colored again
    assert len(colorings) == 6
    monkeypatch.setattr(C, "MEMO_NNZ", C._weight(pats[1]))
    big = _stencil((6, 12), FIVE)
    C.color(big, "column")
    C.color(_fresh(big), "column")  # more entries than the whole budget: never kept
    assert len(colorings) == 8 and len(C._MEMO) == 3
    C.color(pats[1], "column")  # kept, the others evicted to stay within the budget
    assert len(colorings) == 9 and len(C._MEMO) == 1
    C.color(_fresh(pats[1]), "column")
    assert len(colorings) == 9
    asd.clear_cache()
    assert len(C._MEMO) == 0


def test_repeated_one_off_jacobians_color_once_and_stay_exact(colorings):
    f, x = brusselator(16), brusselator_input(16)
    ref = torch.func.jacrev(f)(x)
    for _ in range(3):
        J = asd.sparse_jacobian(f, x, cache=False)
        torch.testing.assert_close(J.to_dense(), ref, rtol=1e-13, atol=1e-13)
    assert colorings == ["row"]
    asd.clear_cache()
    asd.sparse_jacobian(f, x, cache=False)
    assert colorings == ["row", "row"]


def test_the_compiled_row_check_answers_as_the_counting_one():
    import numba  # noqa: F401  (loaded: the compiled check runs)

    rng = np.random.default_rng(5)
    for P in (_stencil((9, 7), FIVE), _stencil((6, 6), NINE, True), SparsityPattern.empty((4, 6)),
              SparsityPattern.from_csr(*(lambda A: (A.indptr, A.indices))(
                  sp.random(50, 40, density=0.08, random_state=2, format="csr")), (50, 40))):
        for k in (2, 5, 9, 40):
            for _ in range(5):
                colors = rng.integers(0, k, P.shape[1])
                assert L._valid_pattern(P, colors, k) == L._valid(P.rows, P.indices, colors, k)
        colors = np.arange(P.shape[1])
        assert L._valid_pattern(P, colors, max(P.shape[1], 1))
