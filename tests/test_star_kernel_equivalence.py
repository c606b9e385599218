"""Star and acyclic coloring kernels: the per-vertex tables (color bitsets, representative edges,
their growth with the colors used and the dropping of tables over the memory budget) and the
int32/int64 work arrays are accelerations only - the coloring, the star of every entry and the
hub of every star never depend on them.

* Golden digests: computed with the kernels as they were before the bitset tables (plain scans
  plus per-color count tables for vertices of high degree) on seeded graphs - dense random,
  arrowheads, hubs, sparse, a grid, a clique - and explicit vertex orders; every table layout
  must reproduce them.
* Property test: random symmetric patterns (up to 300 vertices, densities up to ~60% before
  symmetrization, with and without hub rows) in every order of ``asd.coloring.ORDERS``: the
  results pass ``asd.coloring.check`` and every table layout agrees with the table-free kernels
  (``_star_light`` / ``_acyclic_light``, which scan every neighbourhood).
"""

import functools
import hashlib

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asd.coloring as C
from asd.coloring._acyclic_kernels import _acyclic_light, acyclic_color
from asd.coloring._star_kernels import _star_light, star_color
from asd.coloring.graphs import acyclic_tables, heavy_vertices
from asd.coloring.orders import vertex_order
from asd.patterns import as_pattern


# -- graphs, orders and digests ------------------------------------------------------------------

def _csr(A):
    """Sorted symmetric CSR of ``A + A^T`` (both triangles) and the mirror position of every entry."""
    A = sp.csr_array(A, dtype=bool)
    S = sp.csr_array((A + A.T).astype(bool))
    S.sort_indices()
    n = S.shape[0]
    ptr = S.indptr.astype(np.int64)
    idx = S.indices.astype(np.int64)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    key = rows * n + idx
    tpos = np.searchsorted(key, idx * n + rows).astype(np.int64)
    return ptr, idx, tpos


def _coo(n, r, c):
    return sp.csr_array((np.ones(len(r), dtype=bool), (np.asarray(r), np.asarray(c))), shape=(n, n))


@functools.lru_cache(maxsize=None)
def _golden_graphs():
    g = {}
    rng = np.random.default_rng(1)
    g["dense_200_p50"] = rng.random((200, 200)) < 0.5
    rng = np.random.default_rng(2)
    g["dense_300_p20"] = rng.random((300, 300)) < 0.2
    # benchmarks/clients.py's "arrowhead + random" at 40000 entries: one hub, random rest
    n = 800
    rng = np.random.default_rng(0)
    m = 40000 - 2 * n
    r = np.concatenate([np.zeros(n, int), np.arange(n), rng.integers(0, n, m)])
    c = np.concatenate([np.arange(n), np.zeros(n, int), rng.integers(0, n, m)])
    g["arrow_random_800"] = _coo(n, r, c)
    a = np.arange(500)
    r = [a, a[:-1], a[:-2]] + [np.full(500, k) for k in range(3)]
    c = [a, a[1:], a[2:]] + [a] * 3
    g["arrowhead_500_3"] = _coo(500, np.concatenate(r), np.concatenate(c))
    rng = np.random.default_rng(3)
    n = 3000
    r = np.concatenate([np.repeat(np.arange(n), 3), np.repeat(rng.integers(0, n, 4), 1500)])
    c = np.concatenate([rng.integers(0, n, 3 * n), rng.integers(0, n, 6000)])
    g["hubs_3000"] = _coo(n, r, c)
    rng = np.random.default_rng(4)
    n = 5000
    g["sparse_5000"] = _coo(n, np.repeat(np.arange(n), 4), rng.integers(0, n, 4 * n))
    N = 30
    T = sp.diags([np.ones(N - 1), np.ones(N), np.ones(N - 1)], [-1, 0, 1])
    eye = sp.identity(N)
    g["laplacian_30x30"] = sp.csr_array((sp.kron(eye, T) + sp.kron(T, eye)).astype(bool))
    g["clique_60"] = np.ones((60, 60), dtype=bool)
    rng = np.random.default_rng(5)
    n = 1500
    g["mixed_1500"] = _coo(n, np.concatenate([np.repeat(np.arange(n), 2), np.repeat(np.arange(100), 120)]),
                           np.concatenate([rng.integers(0, n, 2 * n), rng.integers(0, 200, 12000)]))
    return {k: _csr(v) for k, v in g.items()}


def _golden_orders(ptr):
    n = ptr.shape[0] - 1
    return {
        "natural": np.arange(n, dtype=np.int64),
        "reversed": np.arange(n - 1, -1, -1, dtype=np.int64),
        "shuffled": np.random.default_rng(7).permutation(n).astype(np.int64),
        "degree": np.argsort(-np.diff(ptr), kind="stable").astype(np.int64),
    }


def _digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a, dtype=np.int64)).astype("<i8").tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


# (graph, order): (star colors, digest of star (colors, ncolors, star, hub), acyclic colors, digest
# of acyclic (colors, ncolors))
GOLDEN = {
    ("dense_200_p50", "natural"): (193, "4a21c30802853a5b", 182, "8671859f709cc660"),
    ("dense_200_p50", "reversed"): (193, "02b739d91b9d02aa", 182, "56123c1551000285"),
    ("dense_200_p50", "shuffled"): (194, "a1eb175551c95aa7", 182, "250c809024afc3a6"),
    ("dense_200_p50", "degree"): (194, "594e8ccfb7a08e1e", 187, "fd60e4acca966706"),
    ("dense_300_p20", "natural"): (255, "ab25b7d64c17dd94", 148, "ca08befb8450febb"),
    ("dense_300_p20", "reversed"): (255, "59a661b640163750", 148, "5012f39a4e5ba0a9"),
    ("dense_300_p20", "shuffled"): (253, "5a79e667d9b4a1b1", 144, "fd38fd7bfb07d5da"),
    ("dense_300_p20", "degree"): (257, "e3429f9e9f1ba2d8", 140, "7b491c5272f526c6"),
    ("arrow_random_800", "natural"): (322, "3e696976fc2b7653", 104, "b11f673ed3ba2c68"),
    ("arrow_random_800", "reversed"): (319, "cfb6a76337f65ccf", 103, "5958caf7a33d90d9"),
    ("arrow_random_800", "shuffled"): (323, "f46e234409c92926", 104, "67f4a516a30f5f98"),
    ("arrow_random_800", "degree"): (315, "67ecf9636799cf96", 97, "50c847312d4ae013"),
    ("arrowhead_500_3", "natural"): (8, "fcc133ba4980cd86", 6, "a7dbe8942e2a08bd"),
    ("arrowhead_500_3", "reversed"): (8, "847835063ab1c5b6", 6, "e2c99ca11f5b3458"),
    ("arrowhead_500_3", "shuffled"): (10, "1749337aa4e4b34d", 8, "065a81e34cade40d"),
    ("arrowhead_500_3", "degree"): (8, "1b6a076544457615", 6, "f5c72a5588f02c5a"),
    ("hubs_3000", "natural"): (101, "bce5e77feccc962d", 10, "c98fe5b465ab4a7d"),
    ("hubs_3000", "reversed"): (49, "a9114b9836b6bd92", 11, "1ad9b4bf67387f6a"),
    ("hubs_3000", "shuffled"): (21, "5effd635efb86868", 10, "75e0ab253c8f31c3"),
    ("hubs_3000", "degree"): (669, "abac52b4ddeced76", 479, "b39fd583858fc98f"),
    ("sparse_5000", "natural"): (19, "608cf1ae47ef91b1", 8, "7e6ba9ed4d589b62"),
    ("sparse_5000", "reversed"): (19, "b5b3d8c8a92e24fe", 8, "622747fe5a379275"),
    ("sparse_5000", "shuffled"): (19, "108b60610bbd858f", 9, "99ab461a8bbb3269"),
    ("sparse_5000", "degree"): (21, "3275a359daee8fd3", 8, "eed53a9317adab7c"),
    ("laplacian_30x30", "natural"): (5, "eaae458d77f628b8", 4, "8038108f94e4b293"),
    ("laplacian_30x30", "reversed"): (5, "5b051d3d33cbcfad", 4, "186f896af6246d3d"),
    ("laplacian_30x30", "shuffled"): (8, "82c8c06a0c70a05a", 5, "ef56adb0a8e09aee"),
    ("laplacian_30x30", "degree"): (5, "7e229cc7133beac2", 4, "5050ec1f08392063"),
    ("clique_60", "natural"): (60, "b5c19d460b560569", 60, "29bc5f7912351036"),
    ("clique_60", "reversed"): (60, "3cd0703072acae25", 60, "63b1e7807fe12e7c"),
    ("clique_60", "shuffled"): (60, "1d0d69093a6d83c0", 60, "5a0476f48161be71"),
    ("clique_60", "degree"): (60, "b5c19d460b560569", 60, "29bc5f7912351036"),
    ("mixed_1500", "natural"): (152, "a477690b54128f37", 99, "2baad3ff73ddaf5a"),
    ("mixed_1500", "reversed"): (108, "cacefd6fa11cc46c", 104, "1cb3122c49d49b37"),
    ("mixed_1500", "shuffled"): (125, "9751203aa5b2ced7", 98, "73230236c26515dc"),
    ("mixed_1500", "degree"): (152, "dd92a8bccaa936f8", 103, "3bcae7de154ec8d5"),
}


# -- table layouts -------------------------------------------------------------------------------

def _wide(layout):
    """The same layout with int64 work arrays (as for graphs beyond int32)."""
    out = [x.astype(np.int64) if isinstance(x, np.ndarray) else x for x in layout]
    out[-1] = np.int64(-1)
    return tuple(out)


def _with_budget(layout, budget):
    out = list(layout)
    out[-2] = budget
    return tuple(out)


def _star_layouts(ptr):
    """Default tables; every vertex with bitsets and representative edges; bitsets only; tight
    budgets (tables dropped at the start and as the bitsets grow); int64 work arrays."""
    return {
        "default": heavy_vertices(ptr),
        "all": heavy_vertices(ptr, threshold=0, bits_threshold=0),
        "bits_only": heavy_vertices(ptr, threshold=2**40, bits_threshold=0),
        "budget_6": _with_budget(heavy_vertices(ptr, threshold=2**40, bits_threshold=0), 6),
        "budget_60": _with_budget(heavy_vertices(ptr, threshold=2**40, bits_threshold=0), 60),
        "no_tables": _with_budget(heavy_vertices(ptr, threshold=2**40), 0),
        "int64": _wide(heavy_vertices(ptr, threshold=1, bits_threshold=2)),
    }


def _acyclic_layouts(ptr):
    return {
        "default": acyclic_tables(ptr),
        "all": acyclic_tables(ptr, bits_threshold=0),
        "budget_200": _with_budget(acyclic_tables(ptr, bits_threshold=0), 200),
        "budget_5000": _with_budget(acyclic_tables(ptr, bits_threshold=0), 5000),
        "no_tables": _with_budget(acyclic_tables(ptr), 0),
        "int64": _wide(acyclic_tables(ptr, bits_threshold=2)),
    }


def _star_digest(res):
    col, k, star, hub = res
    assert col.dtype == star.dtype == hub.dtype == np.int64
    return _digest(col, [k], star, hub)


def test_golden_keys():
    graphs = _golden_graphs()
    assert set(GOLDEN) == {(g, o) for g in graphs for o in _golden_orders(graphs[g][0])}


@pytest.mark.parametrize("graph", sorted({g for g, _ in GOLDEN}))
def test_golden_star(graph):
    ptr, idx, tpos = _golden_graphs()[graph]
    layouts = _star_layouts(ptr)
    for oname, perm in _golden_orders(ptr).items():
        k, want, _, _ = GOLDEN[graph, oname]
        for lname, layout in layouts.items():
            res = star_color(perm, ptr, idx, tpos, *layout)
            assert (int(res[1]), _star_digest(res)) == (k, want), (graph, oname, lname)


@pytest.mark.parametrize("graph", sorted({g for g, _ in GOLDEN}))
def test_golden_acyclic(graph):
    ptr, idx, tpos = _golden_graphs()[graph]
    layouts = _acyclic_layouts(ptr)
    for oname, perm in _golden_orders(ptr).items():
        _, _, k, want = GOLDEN[graph, oname]
        for lname, layout in layouts.items():
            col, ncol = acyclic_color(perm, ptr, idx, tpos, *layout)
            assert col.dtype == np.int64
            assert (int(ncol), _digest(col, [ncol])) == (k, want), (graph, oname, lname)


# -- property test ---------------------------------------------------------------------------------

@st.composite
def symmetric_patterns(draw):
    n = draw(st.integers(1, 300))
    density = draw(st.sampled_from([0.0, 0.002, 0.01, 0.05, 0.2, 0.6]))
    hubs = draw(st.integers(0, 3))
    diag = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    D = rng.random((n, n)) < density
    for h in rng.integers(0, n, hubs):
        D[h, rng.random(n) < rng.uniform(0.5, 1.0)] = True
    if diag:
        D[np.arange(n), np.arange(n)] = True
    return sp.csr_array(D)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(symmetric_patterns(), st.sampled_from(C.ORDERS), st.integers(0, 3),
       st.sampled_from(["default", "all", "bits_only", "budget_6", "budget_60", "no_tables", "int64"]),
       st.sampled_from(["default", "all", "budget_200", "budget_5000", "no_tables", "int64"]))
def test_tables_never_change_the_coloring(A, order, seed, star_layout, acyclic_layout):
    P = C.symmetric_pattern(as_pattern(A))
    ptr, idx = P.indptr, P.indices
    tpos = P.transpose_with_positions[1]
    perm = vertex_order(order, P.shape[0], False, ptr, idx, seed=seed)

    want = _star_light(perm, ptr, idx, tpos, np.int64(-1))
    layout = _star_layouts(ptr)[star_layout]
    got = star_color(perm, ptr, idx, tpos, *layout)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    res = C.color(A, "star", order, seed=seed)
    assert C.check(A, res)
    if res.order == order:  # not the dense fallback
        np.testing.assert_array_equal(res.colors, want[0])

    want = _acyclic_light(perm, ptr, idx, tpos, np.int64(-1))
    layout = _acyclic_layouts(ptr)[acyclic_layout]
    got = acyclic_color(perm, ptr, idx, tpos, *layout)
    np.testing.assert_array_equal(want[0], got[0])
    assert int(want[1]) == int(got[1])
    res = C.color(A, "acyclic", order, seed=seed)
    assert C.check(A, res)
    if res.order == order:
        np.testing.assert_array_equal(res.colors, want[0])
