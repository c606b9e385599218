"""Basic coloring tests: column / row partial distance-2, orders, check, errors, import contract."""

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import torch

import asd.coloring as C
from asd.coloring.check import structurally_orthogonal_columns
from asd.errors import ColoringError
from asd.patterns import as_pattern as asd_pattern


def _rand(m, n, density, seed):
    return sp.random(m, n, density=density, random_state=seed, format="csr")


def test_exports():
    for name in ("color", "check", "Coloring", "ColumnColoring", "RowColoring", "StarColoring", "AcyclicColoring",
                 "BiColoring", "ORDERS", "PROBLEMS"):
        assert hasattr(C, name)
    assert set(C.PROBLEMS) == {"column", "row", "star", "acyclic", "bidirectional"}
    assert "dynamic_largest_first" in C.ORDERS and "random" in C.ORDERS


def test_import_contract_no_numba_no_torch():
    # load asd.coloring without running asd/__init__ (which imports torch for the API)
    import asd

    code = (
        "import sys, types; pkg = types.ModuleType('asd'); pkg.__path__ = [%r]; sys.modules['asd'] = pkg; "
        "import asd.coloring, asd.coloring.check, asd.coloring.graphs, asd.coloring.orders, "
        "asd.coloring.star, asd.coloring.acyclic, asd.coloring.bidirectional, asd.coloring.greedy, "
        "asd.coloring.build, asd.decompression, asd.decompression.plans; "
        "assert 'numba' not in sys.modules, 'numba imported'; assert 'torch' not in sys.modules, 'torch imported'"
    ) % (asd.__path__[0],)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_substitution_module_does_not_import_numba():
    import asd

    code = (
        "import sys, types; pkg = types.ModuleType('asd'); pkg.__path__ = [%r]; sys.modules['asd'] = pkg; "
        "import asd.decompression.device; assert 'numba' not in sys.modules"
    ) % (asd.__path__[0],)
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("problem", ["column", "row"])
@pytest.mark.parametrize("order", C.ORDERS)
def test_partial_d2_random(problem, order):
    for seed in range(3):
        A = _rand(30 + seed * 7, 25 + seed * 5, 0.12, seed)
        res = C.color(A, problem, order, seed=seed)
        assert C.check(A, res)
        assert res.problem == problem and res.order == order
        assert res.colors.dtype == np.int64
        pat = A if problem == "column" else A.T
        assert structurally_orthogonal_columns(pat, res.colors)
        # decompression from a numpy compressed product
        vals = np.random.default_rng(seed).standard_normal(res.nnz)
        J = res.to_scipy(vals).toarray()
        S = res.seeds()
        B = S @ J.T if problem == "column" else S @ J
        assert B.shape == res.plan.compressed_shape
        np.testing.assert_array_equal(res.decompress(B), vals)
        np.testing.assert_array_equal(B.reshape(-1)[res.plan.gather], vals)


def test_dense_bool_explicit_zeros_and_duplicates():
    D = np.eye(4, dtype=bool)
    D[0, :] = True
    r = C.color(D, "column")
    assert r.ncolors == 4
    # explicit stored zeros are structural
    A = sp.csr_array((np.array([0.0, 1.0]), np.array([0, 1]), np.array([0, 2, 2])), shape=(2, 2))
    r = C.color(A, "column")
    assert r.nnz == 2 and r.ncolors == 2
    # duplicates merged
    coo = sp.coo_array((np.ones(3), (np.array([0, 0, 1]), np.array([1, 1, 0]))), shape=(2, 2))
    r = C.color(coo, "column")
    assert r.nnz == 2 and r.ncolors == 1


def test_deterministic():
    A = _rand(60, 50, 0.08, 3)
    for order in C.ORDERS:
        a = C.color(A, "column", order, seed=5)
        b = C.color(A, "column", order, seed=5)
        np.testing.assert_array_equal(a.colors, b.colors)


def test_best_not_worse():
    A = _rand(80, 60, 0.06, 1)
    best = C.color(A, "column", "best")
    for order in C.ORDERS:
        assert best.ncolors <= C.color(A, "column", order).ncolors or order == "random"
    C.check(A, best)


def test_errors():
    with pytest.raises(ColoringError, match="unknown coloring problem"):
        C.color(np.eye(3), "bogus")
    with pytest.raises(ColoringError, match="unknown order"):
        C.color(np.eye(3), "column", "nope")
    with pytest.raises(ColoringError, match="2-D"):
        C.color(np.ones(3), "column")
    with pytest.raises(ColoringError, match="square"):
        C.color(np.ones((2, 3)), "star")


def test_check_rejects_bad_coloring():
    A = np.array([[1, 1], [0, 1]], dtype=bool)
    r = C.color(A, "column")
    import dataclasses

    bad = dataclasses.replace(r, colors=np.zeros(2, dtype=np.int64), ncolors=1)
    with pytest.raises(ColoringError):
        C.check(A, bad)


def test_empty_and_banded():
    r = C.color(sp.csr_array((5, 4)), "column")
    C.check(sp.csr_array((5, 4)), r)
    n = 200
    # k-fold diff Jacobian: k+1 bands -> k+1 colors
    k = 4
    J = sp.diags([np.ones(n - k)] * (k + 1), offsets=list(range(k + 1)), shape=(n - k, n))
    for order in ("natural", "largest_first"):
        assert C.color(J, "column", order).ncolors == k + 1


@pytest.mark.parametrize("problem", ["column", "row", "star", "acyclic", "bidirectional"])
def test_deterministic_all_problems(problem):
    A = sp.random(50, 50, density=0.08, random_state=7, format="csr")
    for order in list(C.ORDERS) + ["best"]:
        a = C.color(A, problem, order, seed=3, postprocess=True)
        b = C.color(A, problem, order, seed=3, postprocess=True)
        assert a.order == b.order and a.ncolors == b.ncolors
        if problem == "bidirectional":
            for x, y in zip(a.colors, b.colors):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(a.colors, b.colors)
        if hasattr(a.plan, "gather"):
            np.testing.assert_array_equal(a.plan.gather, b.plan.gather)


@pytest.mark.parametrize("shape", [(0, 0), (1, 1), (0, 3), (3, 0), (2, 2), (1, 5)])
def test_degenerate_shapes(shape):
    for problem in C.PROBLEMS:
        if problem in ("star", "acyclic") and shape[0] != shape[1]:
            continue
        for A in (np.zeros(shape, dtype=bool), np.ones(shape, dtype=bool)):
            for order in ("natural", "smallest_last", "best"):
                C.check(A, C.color(A, problem, order, postprocess=True))


@pytest.mark.parametrize("problem", ["column", "row"])
@pytest.mark.parametrize("density", [0.08, 0.3, 0.6, 0.9])
def test_python_greedy_equals_the_numba_kernel(problem, density):
    """The same first-fit colors; on dense-ish patterns the kernel stops scanning a vertex's nets
    once every color in use is forbidden, and must still give the plain scan's colors."""
    from asd.coloring._order_kernels import greedy_d2
    from asd.coloring.greedy import greedy_d2_python

    for seed in range(4):
        A = asd_pattern(_rand(60, 50, density, seed))
        T = A.T
        p1, i1, p2, i2, nv = ((T.indptr, T.indices, A.indptr, A.indices, 50) if problem == "column"
                              else (A.indptr, A.indices, T.indptr, T.indices, 60))
        order = np.random.default_rng(seed).permutation(nv).astype(np.int64)
        a, ka = greedy_d2(order, p1, i1, p2, i2, nv)
        b, kb = greedy_d2_python(order, p1, i1, p2, i2, nv)
        assert ka == kb and np.array_equal(a, b)


def test_a_million_entry_pattern_of_middling_density_gets_one_color_per_column():
    """Issue 16's half-dense 10^6-entry case (its time is measured in benchmarks/clients.py): not
    hopeless by the densest-row bound (800 of 1600 columns), yet every column pair shares a row, so
    the stopping scan must still give every column its own color, validly."""
    P = _rand(1600, 1600, 0.5, 2)
    for problem in ("column", "row"):
        r = C.color(P, problem)
        assert r.ncolors == 1600
        assert C.check(P, r)


def test_first_small_coloring_does_not_import_numba():
    code = ("import sys, scipy.sparse as sp, asd; A = sp.random(200, 200, density=0.02, random_state=0, format='csr'); "
            "r = asd.color(A, 'column'); asd.coloring.check(A, r); print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # check() needs no numba either; the coloring ran in Python
    assert out.stdout.strip().splitlines()[-1] == "False"


def _bratu(N: int, lam: float = 1.0):
    """The 2-D Bratu residual on an N x N grid with zero boundary values (5-point Laplacian)."""
    h = 1.0 / (N + 1)

    def F(u):
        U = u.reshape(N, N)
        P = torch.nn.functional.pad(U, (1, 1, 1, 1))
        lap = (P[2:, 1:-1] + P[:-2, 1:-1] + P[1:-1, 2:] + P[1:-1, :-2] - 4 * U) / h ** 2
        return (lap + lam * torch.exp(U)).reshape(-1)
    return F


@pytest.mark.parametrize("N, flat", [(7, True), (32, True), (32, False), (60, True)])
def test_bratu_jacobian_gets_the_optimal_five_colors_by_default(N, flat):
    """Issue 16, item 9: greedy orders give 7 colors on the 5-point stencil; the optimum is 5."""
    import asd

    F = _bratu(N)
    x = torch.rand(N * N, dtype=torch.float64)
    if not flat:
        F2 = F
        F = lambda U: F2(U.reshape(-1)).reshape(N, N)  # noqa: E731 - the grid shape given as x's shape
        x = x.reshape(N, N)
    op = asd.prepare_jacobian(F, x)
    assert op.ncolors == 5
    assert C.check(op.pattern.to_scipy(), op.coloring)
    ref = torch.func.jacrev(F)(x).reshape(N * N, N * N)
    torch.testing.assert_close(op(x).to_dense(), ref, rtol=1e-12, atol=1e-12)
