"""ColPack's sample matrices: every problem is valid, and asd's best ordering needs no more
colors than ColPack's best ordering (EXPECTED.md section 3, measured single-threaded)."""

import pathlib

import numpy as np
import pytest

import asd.coloring as C
from asd.coloring.mtx import read_pattern

DATA = pathlib.Path(__file__).parent / "data" / "matrices"

# ColPack best over NATURAL, LARGEST_FIRST, SMALLEST_LAST, INCIDENCE_DEGREE, DYNAMIC_LARGEST_FIRST:
# (column, row, star, acyclic); None = not measured (rectangular)
COLPACK_BEST = {
    "bcsstk01": (14, 14, 12, 7),
    "bcsstk01_mod": (14, 14, 12, 7),
    "bcsstm01": (1, 1, 1, 1),
    "hess_pat": (12, 12, 10, 6),
    "hess_pat_small": (6, 6, 4, 3),
    "mymatrix1": (4, 4, 3, 2),
    "mtx-spear-head": (10, 10, 2, 2),
    "column-compress": (2, 10, 2, 2),
    "row-compress": (10, 2, 2, 2),
    "what_fig_41": (5, 5, 3, 3),
    "gmp_fig61_10x10": (5, 5, 4, 3),
    "jac_pat": (11, 6, None, None),
    "mymatrix": (4, 2, None, None),
}
PROBLEMS = ("column", "row", "star", "acyclic")


@pytest.mark.parametrize("name", sorted(COLPACK_BEST))
def test_best_not_worse_than_colpack(name):
    A = read_pattern(DATA / f"{name}.mtx")
    for problem, ref in zip(PROBLEMS, COLPACK_BEST[name]):
        if ref is None:
            continue
        best = C.color(A, problem, "best")
        C.check(A, best)
        assert best.ncolors <= ref, (name, problem, best.ncolors, ref)
        for order in C.ORDERS:
            C.check(A, C.color(A, problem, order), rounds=1)


@pytest.mark.parametrize("name", sorted(COLPACK_BEST))
def test_bidirectional_valid(name):
    A = read_pattern(DATA / f"{name}.mtx")
    for order in C.ORDERS:
        C.check(A, C.color(A, "bidirectional", order, postprocess=True), rounds=1)


def test_explicit_zeros_and_valueless_lines():
    # bcsstm01 stores 24 explicit zeros on the diagonal: still 48 structural entries, 1 color
    A = read_pattern(DATA / "bcsstm01.mtx")
    assert A.nnz == 48
    for problem in PROBLEMS:
        assert C.color(A, problem).ncolors == 1
    # bcsstk01_mod has value-less entry lines: same structure as bcsstk01
    B = read_pattern(DATA / "bcsstk01_mod.mtx")
    K = read_pattern(DATA / "bcsstk01.mtx")
    assert (B != K).nnz == 0


def test_trivial_bounds():
    S = read_pattern(DATA / "mtx-spear-head.mtx")
    assert C.color(S, "column").ncolors == 10 and C.color(S, "star").ncolors == 2
    assert C.color(read_pattern(DATA / "column-compress.mtx"), "column", "best").ncolors == 2
    assert C.color(read_pattern(DATA / "row-compress.mtx"), "row", "best").ncolors == 2
    smb = read_pattern(DATA / "smb_jac_pattern.mtx")
    r = C.color(smb, "row")
    assert r.ncolors >= 4655
    assert np.asarray(smb.sum(axis=0)).max() == 4655
