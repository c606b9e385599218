"""Star and acyclic colorings: definitions, banded identities, decompression."""

import numpy as np
import pytest
import scipy.sparse as sp

import asd.coloring as C
from asd.coloring.build import from_colors
from asd.decompression.plans import DirectPlan, SubstitutionPlan
from asd.errors import ColoringError
from asd.problems import arrowhead_pattern as arrowhead, banded_pattern as banded


def _sym(n, density, seed, diag=True):
    A = sp.random(n, n, density=density, random_state=seed, format="csr")
    A = (A + A.T).tocsr()
    if diag:
        A = (A + sp.identity(n, format="csr")).tocsr()
    return A



def _roundtrip(res, seed=0):
    tpos = res.pattern.transpose_with_positions[1]
    v = np.random.default_rng(seed).standard_normal(res.nnz)
    v = v + v[tpos]
    H = res.to_scipy(v).toarray()
    S = res.seeds()
    B = S @ H
    assert B.shape == res.plan.compressed_shape
    got = res.decompress(B)
    np.testing.assert_allclose(got, v, rtol=1e-12, atol=1e-12)
    return got


@pytest.mark.parametrize("problem", ["star", "acyclic"])
@pytest.mark.parametrize("order", C.ORDERS)
def test_random_symmetric(problem, order):
    for seed in range(4):
        A = _sym(25 + 9 * seed, 0.08, seed, diag=seed % 2 == 0)
        res = C.color(A, problem, order, seed=seed)
        assert C.check(A, res)
        _roundtrip(res, seed)
        assert isinstance(res, C.StarColoring if problem == "star" else C.AcyclicColoring)
        assert isinstance(res.plan, DirectPlan if problem == "star" else SubstitutionPlan)


def test_unsymmetric_input_is_symmetrized():
    A = sp.random(30, 30, density=0.1, random_state=3, format="csr")
    res = C.color(A, "star")
    S = (abs(A) + abs(A.T)).tocsr()
    S.sort_indices()
    assert res.nnz == S.nnz
    C.check(A, res)


@pytest.mark.parametrize("rho", [2, 4, 10, 20])
def test_banded_identities(rho):
    A = banded(600, rho)
    star = C.color(A, "star")
    acyc = C.color(A, "acyclic")
    assert star.ncolors == 2 * (rho // 2) + 1
    assert acyc.ncolors == rho // 2 + 1
    C.check(A, star)
    C.check(A, acyc)


def test_laplacian_counts():
    N = 40
    I = sp.identity(N, format="csr")
    T = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(N, N))
    L = (sp.kron(I, T) + sp.kron(T, I)).tocsr()
    assert C.color(L, "star").ncolors == 5
    assert C.color(L, "acyclic").ncolors <= 4
    C.check(L, C.color(L, "acyclic"))


def test_arrowhead():
    A = arrowhead(3200, 2)
    s = C.color(A, "star")
    a = C.color(A, "acyclic")
    assert s.ncolors == 5 and a.ncolors == 4
    C.check(A, s)
    C.check(A, a)


def test_star_postprocess_neutral():
    # star graph without diagonal: hub + leaves -> 2 colors, 1 needed after postprocessing
    n = 8
    A = np.zeros((n, n), dtype=bool)
    A[0, 1:] = A[1:, 0] = True
    r = C.color(A, "star")
    assert r.ncolors == 2
    p = C.color(A, "star", postprocess=True)
    assert p.ncolors == 1 and (p.colors == -1).sum() == n - 1
    C.check(A, p)
    _roundtrip(p)


def test_published_colorings():
    from asd.coloring.mtx import read_pattern

    A = read_pattern("tests/data/matrices/gmp_fig61_10x10.mtx")
    for problem, c, k in [
        ("star", [1, 2, 1, 3, 1, 4, 3, 5, 1, 2], 5),
        ("acyclic", [1, 2, 1, 2, 1, 3, 2, 3, 2, 1], 3),
        ("acyclic", [1, 2, 1, 2, 1, 3, 2, 3, 2, 3], 3),
    ]:
        r = from_colors(A, problem, np.array(c))
        assert r.ncolors == k
        C.check(A, r)
        _roundtrip(r)
    B = read_pattern("tests/data/matrices/what_fig_41.mtx")
    r = from_colors(B, "star", np.array([1, 2, 1, 3, 1, 1]))
    assert r.ncolors == 3
    C.check(B, r)
    # a distance-1 coloring that is not star: check must reject it
    with pytest.raises(ColoringError):
        C.check(A, from_colors(A, "star", np.array([1, 2, 1, 2, 1, 3, 2, 3, 2, 1])))


def test_check_rejects_two_colored_cycle():
    # 4-cycle colored 0,1,0,1 is distance-1 but not acyclic
    A = np.zeros((4, 4), dtype=bool)
    for i in range(4):
        A[i, (i + 1) % 4] = A[(i + 1) % 4, i] = True
    with pytest.raises(ColoringError):
        from_colors(A, "acyclic", np.array([0, 1, 0, 1]))
    r = C.color(A, "acyclic")
    assert r.ncolors == 3
    C.check(A, r)


def test_substitution_plan_order_is_sequential():
    """The plan's own steps (in the order the CPU kernel follows) read only entries that earlier
    steps wrote, and every entry is written."""
    A = _sym(80, 0.05, 11)
    r = C.color(A, "acyclic", "smallest_last")
    plan = r.plan
    assert not plan.is_leveled
    written_at = np.full(r.nnz, -1)
    for k in range(len(plan.step_pos)):
        deps = plan.dep_pos[plan.dep_ptr[k]:plan.dep_ptr[k + 1]]
        assert (written_at[deps] >= 0).all()
        written_at[plan.step_pos[k]] = written_at[plan.step_pos_t[k]] = k
    assert (written_at >= 0).all()


def test_substitution_plan_levels_are_topological():
    A = _sym(80, 0.05, 11)
    r = C.color(A, "acyclic", "smallest_last")
    plan = r.plan.leveled
    assert plan.is_leveled and plan.leveled is plan and r.plan.leveled is plan
    assert plan.nnz == r.plan.nnz and sorted(plan.step_pos) == sorted(r.plan.step_pos)
    step_level = np.repeat(np.arange(plan.nlevels), np.diff(plan.level_ptr))
    level_of_pos = np.full(r.nnz, -1)
    level_of_pos[plan.step_pos] = step_level
    level_of_pos[plan.step_pos_t] = step_level
    assert (level_of_pos >= 0).all()
    dep_level = level_of_pos[plan.dep_pos]
    assert (dep_level < step_level[plan.dep_step]).all()
    for name in ("step_pos", "step_pos_t", "step_src", "dep_ptr", "dep_pos", "dep_step", "level_ptr"):
        assert getattr(plan, name).dtype == np.int64


@pytest.mark.parametrize("problem", ["star", "acyclic", "bidirectional"])
def test_heavy_vertex_tables_do_not_change_colorings(problem, monkeypatch):
    import asd.coloring.graphs as G

    for seed in range(6):
        A = _sym(45, 0.15, seed)
        res = {}
        for thr in (0, 10**9):
            monkeypatch.setattr(G, "HEAVY_THRESHOLD", thr)
            res[thr] = [C.color(A, problem, o, postprocess=True) for o in C.ORDERS]
        for a, b in zip(res[0], res[10**9]):
            np.testing.assert_array_equal(np.asarray(a.colors), np.asarray(b.colors))
            C.check(A, a, rounds=1)


def _random_forest(n, seed, extra_edges=0):
    """A random forest (plus ``extra_edges`` random edges, which may close cycles) as a pattern."""
    rng = np.random.default_rng(seed)
    parent = [int(rng.integers(-1, i)) if i else -1 for i in range(n)]
    edges = [(i, p) for i, p in enumerate(parent) if p >= 0]
    edges += [tuple(rng.integers(0, n, 2)) for _ in range(extra_edges)]
    A = sp.identity(n, format="lil")
    for i, j in edges:
        A[i, j] = A[j, i] = 1
    return A.tocsr()


@pytest.mark.parametrize("seed", range(40))
def test_the_path_of_four_kernel_matches_its_definition(seed):
    """An off-diagonal edge whose two ends both have another neighbour, by the Numba kernel and by
    array operations on every entry (random symmetric patterns with and without diagonals)."""
    from asd.coloring.choose import has_path_of_four
    from asd.patterns import as_pattern

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    A = sp.random(n, n, density=float(rng.choice([0.05, 0.15, 0.4])), random_state=seed, format="csr")
    A = (A + A.T).tocsr()
    if seed % 2:
        A = (A + sp.identity(n)).tocsr()
    P = as_pattern(A, name="pattern")
    rows, cols = P.rows, P.indices
    off = rows != cols
    degree = np.bincount(rows[off], minlength=n)
    want = bool(((degree[rows[off]] >= 2) & (degree[cols[off]] >= 2)).any())
    assert has_path_of_four(P) is want


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind", ["path", "forest", "star", "cyclic"])
def test_choose_hessian_skips_a_star_coloring_that_cannot_win(seed, kind):
    """Where acyclic needs two colors and the graph has a path on four vertices, star coloring is
    skipped: the choice must be the one made by coloring both (and star must need three)."""
    from asd.coloring.choose import choose_hessian, has_path_of_four
    from asd.patterns import as_pattern

    n = 4 + seed
    A = {"path": lambda: sp.diags([np.ones(n - 1), np.ones(n), np.ones(n - 1)], [-1, 0, 1], format="csr"),
         "forest": lambda: _random_forest(n, seed),
         "star": lambda: sp.csr_matrix(  # vertex 0 joined to every other one: no path on four vertices
             (np.ones(3 * n - 2), (np.r_[np.arange(n), np.zeros(n - 1, int), np.arange(1, n)],
                                   np.r_[np.arange(n), np.arange(1, n), np.zeros(n - 1, int)])), shape=(n, n)),
         "cyclic": lambda: _random_forest(n, seed, extra_edges=2)}[kind]()
    P = as_pattern(A, name="pattern")
    star, acyclic = C.color(P, "star"), C.color(P, "acyclic")
    want = acyclic if acyclic.ncolors < star.ncolors else star
    got = choose_hessian(P, None, "natural", exact_arithmetic=True, max_levels=None)
    assert type(got) is type(want) and got.ncolors == want.ncolors
    assert np.array_equal(got.colors, want.colors)
    if acyclic.ncolors <= 2 and has_path_of_four(P):
        assert star.ncolors >= 3


def test_choose_hessian_does_not_color_star_on_a_path(monkeypatch):
    import asd.coloring
    from asd.coloring.choose import choose_hessian
    from asd.patterns import as_pattern

    asked = []
    real = asd.coloring.color
    monkeypatch.setattr(asd.coloring, "color", lambda p, problem, **kw: asked.append(problem) or real(p, problem, **kw))
    n = 30
    P = as_pattern(sp.diags([np.ones(n - 1), np.ones(n), np.ones(n - 1)], [-1, 0, 1], format="csr"), name="pattern")
    got = choose_hessian(P, None, "natural", exact_arithmetic=True, max_levels=None)
    assert got.ncolors == 2 and asked == ["acyclic"]


def test_a_star_coloring_with_flags_or_colors_of_the_wrong_length_is_refused():
    # the plan's Numba kernel reads colors[j] and from_column[p] without bounds checks
    from asd.coloring.result import StarColoring

    good = C.color(banded(16, 2), "star")
    P = good.pattern
    with pytest.raises(ColoringError, match="from_column"):
        StarColoring(P, "given", good.colors, good.ncolors, good.from_column[:-1])
    with pytest.raises(ColoringError, match="one color per vertex"):
        StarColoring(P, "given", good.colors[:-1], good.ncolors, good.from_column)
    again = StarColoring(P, "given", good.colors, good.ncolors, good.from_column)
    np.testing.assert_array_equal(again.plan.gather, good.plan.gather)


def test_seeds_refuse_colors_beyond_the_count():
    from asd.coloring.result import ColumnColoring

    from asd.patterns import as_pattern

    P = as_pattern(sp.eye(3, format="csr"))
    with pytest.raises(ColoringError, match="colors must lie"):
        ColumnColoring(P, "given", np.array([0, 1, 5]), 2).seeds()
    seeds = ColumnColoring(P, "given", np.array([0, 1, -1]), 2).seeds()
    np.testing.assert_array_equal(seeds, [[1, 0, 0], [0, 1, 0]])
