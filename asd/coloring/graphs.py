"""Graph structures on integer index arrays (no numba at import, no torch).

* :func:`canonical_csr` - any scipy-convertible pattern to a sorted, duplicate-free CSR structure
  (explicit stored zeros count as structural entries).
* :func:`transpose_csr` - CSC view (columns -> rows) of a CSR structure.
* :func:`symmetrize` - structure of ``A + A^T`` (diagonal kept where the input has it).
* :func:`transpose_positions` - for a structurally symmetric CSR, the position of ``(j, i)``
  for the entry ``(i, j)``.
* :func:`augmented` - adjacency structure of the bipartite graph ``[[0, A^T], [A, 0]]``.
"""

from __future__ import annotations

import numpy as np

from asd.errors import ColoringError

__all__ = [
    "canonical_csr",
    "transpose_csr",
    "symmetrize",
    "transpose_positions",
    "augmented",
    "csr_rows",
    "to_igraph",
]

_I = np.int64


def _from_coo(rows, cols, shape):
    """Sorted, duplicate-free CSR structure from coordinate lists (vectorised)."""
    m, n = int(shape[0]), int(shape[1])
    rows = np.asarray(rows, dtype=_I)
    cols = np.asarray(cols, dtype=_I)
    if rows.size:
        key = rows * max(n, 1) + cols
        key = np.unique(key)
        rows = key // max(n, 1)
        cols = key - rows * max(n, 1)
    indptr = np.zeros(m + 1, dtype=_I)
    if rows.size:
        np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    return indptr, np.ascontiguousarray(cols, dtype=_I)


def canonical_csr(pattern):
    """Return ``(indptr, indices, shape)`` of a pattern, canonical (sorted, no duplicates)."""
    import scipy.sparse as sp

    if sp.issparse(pattern):
        coo = sp.coo_array(pattern)
        if coo.ndim != 2:
            raise ColoringError(f"pattern must be 2-D, got a {coo.ndim}-D sparse array")
        shape = coo.shape
        rows, cols = coo.coords if hasattr(coo, "coords") else (coo.row, coo.col)
    else:
        try:
            arr = np.asarray(pattern)
        except Exception as exc:  # pragma: no cover - exotic inputs
            raise ColoringError(
                f"cannot interpret {type(pattern).__name__} as a sparsity pattern; pass a "
                "scipy.sparse array/matrix or a dense numpy bool array"
            ) from exc
        if arr.ndim != 2:
            raise ColoringError(
                f"pattern must be 2-D (a matrix), got shape {arr.shape}; reshape it or pass "
                "the Jacobian/Hessian pattern as an (m, n) matrix"
            )
        if arr.dtype == object:
            raise ColoringError("pattern has dtype object; pass a bool or numeric array")
        shape = arr.shape
        rows, cols = np.nonzero(arr)
    indptr, indices = _from_coo(rows, cols, shape)
    return indptr, indices, (int(shape[0]), int(shape[1]))


def csr_rows(indptr):
    """Row index of every stored entry."""
    m = len(indptr) - 1
    return np.repeat(np.arange(m, dtype=_I), np.diff(indptr))


def transpose_csr(indptr, indices, shape):
    """CSR structure of the transpose (i.e. the CSC structure of the input)."""
    m, n = shape
    rows = csr_rows(indptr)
    order = np.argsort(indices, kind="stable")  # stable keeps rows sorted within a column
    tptr = np.zeros(n + 1, dtype=_I)
    np.cumsum(np.bincount(indices, minlength=n), out=tptr[1:])
    return tptr, np.ascontiguousarray(rows[order]), order.astype(_I)


def symmetrize(indptr, indices, shape):
    """Structure of ``A + A^T``; ``shape`` must be square."""
    m, n = shape
    rows = csr_rows(indptr)
    r = np.concatenate([rows, indices])
    c = np.concatenate([indices, rows])
    return _from_coo(r, c, (m, n))


def is_structurally_symmetric(indptr, indices, shape) -> bool:
    if shape[0] != shape[1]:
        return False
    sp_, si = symmetrize(indptr, indices, shape)
    return len(si) == len(indices)


def transpose_positions(indptr, indices):
    """For a structurally symmetric canonical CSR, ``tpos[p]`` = position of the mirror entry."""
    rows = csr_rows(indptr)
    order = np.lexsort((rows, indices))  # entries sorted by (col, row) = CSR order of A^T = A
    tpos = np.empty_like(order)
    tpos[order] = np.arange(order.shape[0], dtype=_I)
    return tpos.astype(_I)


def augmented(indptr, indices, shape):
    """Adjacency CSR of the bipartite graph: vertices ``0..n-1`` are columns, ``n..n+m-1`` rows.

    Returns ``(aptr, aidx, apos)`` where ``apos[q]`` is the CSR position (in the original
    pattern) of the entry that the augmented entry ``q`` stands for.
    """
    m, n = shape
    tptr, tidx, torder = transpose_csr(indptr, indices, shape)
    # column vertex j: neighbours n + rows of column j; row vertex n+i: neighbours cols of row i
    aptr = np.concatenate([tptr, tptr[-1] + indptr[1:]]).astype(_I)
    aidx = np.concatenate([tidx + n, indices]).astype(_I)
    apos = np.concatenate([torder, np.arange(len(indices), dtype=_I)]).astype(_I)
    return aptr, aidx, apos


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

    m, n = coloring.shape
    ptr, idx = coloring.indptr, coloring.indices
    A = sp.csr_array((np.ones(len(idx), dtype=np.int8), idx, ptr), shape=(m, n))
    if coloring.problem in ("column", "row"):
        G = (A.T @ A) if coloring.problem == "column" else (A @ A.T)
        G = sp.triu(sp.coo_array(G), k=1)
        edges = np.stack([G.row, G.col], axis=1) if hasattr(G, "row") else np.stack(G.coords, axis=1)
        nv = G.shape[0]
        g = igraph.Graph(n=nv, edges=edges.tolist())
        g.vs["color"] = np.asarray(coloring.colors).tolist()
    elif coloring.problem in ("star", "acyclic"):
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
