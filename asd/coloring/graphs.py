"""Graph structures on integer index arrays (no numba at import, no torch).

Canonical CSR structure, transposes and mirror positions live on
:class:`asd.patterns.SparsityPattern` (built once per pattern); this module adds

* :func:`augmented` - adjacency structure of the bipartite graph ``[[0, A^T], [A, 0]]``;
* :func:`heavy_vertices` - the per-color table slots of the star/acyclic kernels;
* :func:`to_igraph` - the colored graph of a coloring result.
"""

from __future__ import annotations

import numpy as np

__all__ = ["augmented", "csr_rows", "heavy_vertices", "to_igraph"]

_I = np.int64


def csr_rows(indptr):
    """Row index of every stored entry."""
    m = len(indptr) - 1
    return np.repeat(np.arange(m, dtype=_I), np.diff(indptr))


#: degree above which star/acyclic kernels keep per-color tables for a vertex
HEAVY_THRESHOLD = 32


def heavy_vertices(indptr, threshold: int | None = None):
    """Slots of high-degree vertices for the per-color tables of the star/acyclic kernels:
    returns ``(heavy, nslots, width)`` with ``heavy[v] = slot`` or ``-1``.  The threshold is
    doubled until the tables (``nslots x width`` entries) stay within ~4 nnz + 1M."""
    if threshold is None:
        threshold = HEAVY_THRESHOLD
    deg = np.diff(indptr)
    n = deg.shape[0]
    dmax = int(deg.max()) if n else 0
    # greedy star/acyclic colorings use at most dmax^2 + 1 colors (and never more than n)
    width = min(n, dmax * dmax + 1) + 1
    budget = 4 * int(indptr[-1]) + (1 << 20)
    while True:
        sel = deg > threshold
        k = int(sel.sum())
        if k * width <= budget or threshold > n:
            break
        threshold *= 2
    if threshold > n:
        k = 0
        sel = np.zeros(n, dtype=bool)
    heavy = np.full(n, -1, dtype=_I)
    heavy[sel] = np.arange(k, dtype=_I)
    return heavy, k, (width if k else 1)


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
