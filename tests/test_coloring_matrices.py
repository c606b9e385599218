"""ColPack's sample matrices: every problem is valid, and asd's best ordering needs no more
colors than ColPack's best ordering (tests/data/colpack_reference.json, shared with
benchmarks/coloring.py; measured single-threaded, EXPECTED.md section 3)."""

import json
import pathlib

import numpy as np
import pytest

import asd.coloring as C
from asd.coloring.mtx import read_pattern

DATA = pathlib.Path(__file__).parent / "data" / "matrices"
PROBLEMS = ("column", "row", "star", "acyclic")
# smb_jac_pattern needs 4655 row colors: test_trivial_bounds covers it, benchmarks/coloring.py compares it
COLPACK_BEST = {name: refs for name, refs in
                json.loads((DATA.parent / "colpack_reference.json").read_text())["matrices"].items()
                if name != "smb_jac_pattern"}


@pytest.mark.parametrize("name", sorted(COLPACK_BEST))
def test_best_not_worse_than_colpack(name):
    A = read_pattern(DATA / f"{name}.mtx")
    for problem in PROBLEMS:
        ref = COLPACK_BEST[name].get(problem)
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
    assert r.ncolors == 4655  # the lower bound, reached: coloring it pays (1.84x fewer products)
    assert np.asarray(smb.sum(axis=0)).max() == 4655
