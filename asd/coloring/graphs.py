"""Graph structures on integer index arrays (no numba at import, no torch).

Canonical CSR structure, transposes and mirror positions live on
:class:`asd.patterns.SparsityPattern` (built once per pattern); this module adds

* :func:`augmented` - adjacency structure of the bipartite graph ``[[0, A^T], [A, 0]]``;
* :func:`heavy_vertices`, :func:`acyclic_tables` - the per-color table slots of the star and
  acyclic kernels;
* :func:`to_igraph` - the colored graph of a coloring result.
"""

from __future__ import annotations

import numpy as np

__all__ = ["augmented", "csr_rows", "acyclic_tables", "heavy_vertices", "to_igraph"]

_I = np.int64


def csr_rows(indptr):
    """Row index of every stored entry."""
    m = len(indptr) - 1
    return np.repeat(np.arange(m, dtype=_I), np.diff(indptr))


#: degree above which the star kernel keeps a representative edge per color for a vertex
HEAVY_THRESHOLD = 32
#: degree above which the star and acyclic kernels keep color bitsets for a vertex
BITSET_THRESHOLD = 8


def _index_type(n, nnz):
    """int32 where every vertex, position, color and star number fits, else int64."""
    return np.int32 if max(n, nnz) < 2**31 - 2 else _I


def _by_degree(deg, sel, it):
    """The vertices with ``sel`` by decreasing degree (ties by index), and their slot numbers."""
    cand = np.flatnonzero(sel)
    bvert = cand[np.argsort(-deg[cand], kind="stable")].astype(it)
    bslot = np.full(deg.shape[0], -1, dtype=it)
    bslot[bvert] = np.arange(bvert.shape[0], dtype=it)
    return bslot, bvert


def heavy_vertices(indptr, threshold: int | None = None, bits_threshold: int | None = None):
    """The table layout of the star kernel: ``(heavy, nheavy, bslot, bvert, cap, budget, neg)``.

    ``cap`` exceeds every color a greedy coloring can use (at most dmax^2 + 1, never more than
    n).  ``heavy[v] >= 0`` numbers the vertices of degree above ``threshold`` that keep a
    representative edge per color (``cap`` entries each; the threshold is doubled until these
    tables stay within ~4 nnz + 1M entries).  ``bslot[v] >= 0`` numbers the vertices that keep
    two color bitsets: the heavy ones and those of degree above ``bits_threshold``, by
    decreasing degree (``bvert`` lists them, heavy vertices first, and ``heavy[v] == bslot[v]``
    for them); the bitsets grow with the colors used, and when they would exceed ``budget``
    words (~nnz + 1M) the kernel drops those of the last (lowest-degree) non-heavy vertices.
    ``neg`` is ``-1`` of the kernel's integer type: int32 unless the graph is too large."""
    deg = np.diff(indptr)
    n = deg.shape[0]
    nnz = int(indptr[-1]) if n else 0
    it = _index_type(n, nnz)
    dmax = int(deg.max()) if n else 0
    cap = min(n, dmax * dmax + 1) + 1
    ht = HEAVY_THRESHOLD if threshold is None else threshold
    budget = 4 * nnz + (1 << 20)
    while ht <= n and ht < dmax and int(np.count_nonzero(deg > ht)) * cap > budget:
        ht = max(2 * ht, 1)
    if ht > n:
        ht = dmax  # no heavy vertex
    bt = BITSET_THRESHOLD if bits_threshold is None else bits_threshold
    bslot, bvert = _by_degree(deg, deg > min(bt, ht), it)
    nheavy = int(np.count_nonzero(deg[bvert] > ht))
    heavy = np.full(n, -1, dtype=it)
    heavy[bvert[:nheavy]] = bslot[bvert[:nheavy]]
    return heavy, nheavy, bslot, bvert, cap, nnz + (1 << 20), it(-1)


def acyclic_tables(indptr, bits_threshold: int | None = None):
    """The table layout of the acyclic kernel: ``(bslot, bvert, budget, neg)``.

    ``bslot[v] >= 0`` numbers the vertices of degree above ``bits_threshold`` that keep a color
    bitset and a representative edge per color, by decreasing degree (``bvert`` lists them);
    the tables grow with the colors used, and when they would exceed ``budget`` entries
    (~2 nnz + 1M) the kernel drops those of the last (lowest-degree) vertices.  ``neg`` is
    ``-1`` of the kernel's integer type: int32 unless the graph is too large for it."""
    deg = np.diff(indptr)
    n = deg.shape[0]
    nnz = int(indptr[-1]) if n else 0
    it = _index_type(n, nnz)
    bt = BITSET_THRESHOLD if bits_threshold is None else bits_threshold
    bslot, bvert = _by_degree(deg, deg > bt, it)
    return bslot, bvert, 2 * nnz + (1 << 20), it(-1)


def augmented(pattern):
    """Adjacency CSR of the bipartite graph of ``pattern``: vertices ``0..n-1`` are columns,
    ``n..n+m-1`` rows.

    Returns ``(aptr, aidx, apos, atpos)`` where ``apos[q]`` is the CSR position (in the original
    pattern) of the entry that the augmented entry ``q`` stands for and ``atpos[q]`` the position
    of the mirrored augmented entry.
    """
    m, n = pattern.shape
    T, torder = pattern.transpose_with_positions
    nnz = pattern.nnz
    # column vertex j: neighbours n + rows of column j; row vertex n+i: neighbours cols of row i
    aptr = np.concatenate([T.indptr, T.indptr[-1] + pattern.indptr[1:]]).astype(_I)
    aidx = np.concatenate([T.indices + n, pattern.indices]).astype(_I)
    apos = np.concatenate([torder, np.arange(nnz, dtype=_I)]).astype(_I)
    # the mirror of (column j -> row i) at q < nnz is (row i -> column j) at nnz + apos[q]
    back = np.empty(nnz, dtype=_I)
    back[torder] = np.arange(nnz, dtype=_I)
    atpos = np.concatenate([nnz + torder, back]).astype(_I)
    return aptr, aidx, apos, atpos


def _require_igraph():
    try:
        import igraph  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "Coloring.graph() and asd.viz.coloring need the optional dependency igraph: "
            "pip install asd[graph]  (or: pip install igraph)"
        ) from exc
    import igraph

    return igraph


def to_igraph(coloring):
    """The colored graph of ``coloring`` as an ``igraph.Graph`` (``color`` vertex attribute)."""
    igraph = _require_igraph()
    import scipy.sparse as sp

    from asd.coloring.result import BiColoring, ColumnColoring, RowColoring

    m, n = coloring.shape
    ptr, idx = coloring.indptr, coloring.indices
    A = sp.csr_array((np.ones(len(idx), dtype=np.int8), idx, ptr), shape=(m, n))
    if isinstance(coloring, (ColumnColoring, RowColoring)):
        G = (A.T @ A) if isinstance(coloring, ColumnColoring) else (A @ A.T)
        G = sp.triu(sp.coo_array(G), k=1)
        edges = np.stack([G.row, G.col], axis=1) if hasattr(G, "row") else np.stack(G.coords, axis=1)
        nv = G.shape[0]
        g = igraph.Graph(n=nv, edges=edges.tolist())
        g.vs["color"] = np.asarray(coloring.colors).tolist()
    elif not isinstance(coloring, BiColoring):  # star / acyclic
        rows = csr_rows(ptr)
        keep = rows < idx
        g = igraph.Graph(n=n, edges=np.stack([rows[keep], idx[keep]], axis=1).tolist())
        g.vs["color"] = np.asarray(coloring.colors).tolist()
    else:  # bidirectional: bipartite graph, columns 0..n-1 then rows n..n+m-1
        rows = csr_rows(ptr)
        g = igraph.Graph(n=n + m, edges=np.stack([idx, n + rows], axis=1).tolist())
        rc, cc = coloring.colors
        g.vs["color"] = np.concatenate([cc, rc]).tolist()
        g.vs["kind"] = ["column"] * n + ["row"] * m
        g.vs["type"] = [False] * n + [True] * m
    return g
