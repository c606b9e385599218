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


def _canon(A):
    """Canonical int64 (indptr, indices) of a scipy CSR structure (values ignored)."""
    import scipy.sparse as sp

    A = sp.csr_array((np.ones(A.indices.shape[0], dtype=np.int8), A.indices, A.indptr), shape=A.shape)
    if not A.has_canonical_format:
        A.sum_duplicates()  # sorts indices, merges duplicates (structure kept even if values cancel)
    return A.indptr.astype(_I, copy=True), A.indices.astype(_I, copy=True)


def _from_coo(rows, cols, shape):
    """Sorted, duplicate-free CSR structure from coordinate lists."""
    import scipy.sparse as sp

    m, n = int(shape[0]), int(shape[1])
    rows = np.asarray(rows, dtype=_I)
    cols = np.asarray(cols, dtype=_I)
    A = sp.coo_array((np.ones(rows.shape[0], dtype=np.int8), (rows, cols)), shape=(m, n)).tocsr()
    return _canon(A)


def canonical_csr(pattern):
    """Return ``(indptr, indices, shape)`` of a pattern, canonical (sorted, no duplicates)."""
    import scipy.sparse as sp

    if sp.issparse(pattern):
        if pattern.ndim != 2:
            raise ColoringError(f"pattern must be 2-D, got a {pattern.ndim}-D sparse array")
        A = pattern if pattern.format == "csr" else sp.csr_array(pattern)
        ptr, idx = _canon(A)
        return ptr, idx, (int(A.shape[0]), int(A.shape[1]))
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
    rows, cols = np.nonzero(arr)
    ptr, idx = _from_coo(rows, cols, arr.shape)
    return ptr, idx, (int(arr.shape[0]), int(arr.shape[1]))


def csr_rows(indptr):
    """Row index of every stored entry."""
    m = len(indptr) - 1
    return np.repeat(np.arange(m, dtype=_I), np.diff(indptr))


def transpose_csr(indptr, indices, shape):
    """CSR structure of the transpose (i.e. the CSC structure of the input) and, for every
    transposed entry, the position of its source entry."""
    m, n = shape
    if len(indices) == 0:
        return np.zeros(n + 1, dtype=_I), np.zeros(0, dtype=_I), np.zeros(0, dtype=_I)
    from asd.coloring._graph_kernels import transpose

    return transpose(indptr, indices, n)


def symmetrize_with_tpos(indptr, indices, shape):
    """Structure of ``A + A^T`` (square ``shape``) and its mirror positions ``tpos``."""
    tptr, tidx, perm = transpose_csr(indptr, indices, shape)
    if np.array_equal(tptr, indptr) and np.array_equal(tidx, indices):
        # already symmetric: the transposed entry q = position of (j, i) comes from p = perm[q]
        tpos = np.empty_like(perm)
        tpos[perm] = np.arange(perm.shape[0], dtype=_I)
        return indptr, indices, tpos
    from asd.coloring._graph_kernels import union

    sptr, sidx = union(indptr, indices, tptr, tidx)
    return sptr, sidx, transpose_positions(sptr, sidx)


def symmetrize(indptr, indices, shape):
    """Structure of ``A + A^T``; ``shape`` must be square."""
    sptr, sidx, _ = symmetrize_with_tpos(indptr, indices, shape)
    return sptr, sidx


def is_structurally_symmetric(indptr, indices, shape) -> bool:
    if shape[0] != shape[1]:
        return False
    tptr, tidx, _ = transpose_csr(indptr, indices, shape)
    return bool(np.array_equal(tptr, indptr) and np.array_equal(tidx, indices))


def transpose_positions(indptr, indices):
    """For a structurally symmetric canonical CSR, ``tpos[p]`` = position of the mirror entry."""
    n = len(indptr) - 1
    _, _, perm = transpose_csr(indptr, indices, (n, n))
    tpos = np.empty_like(perm)
    tpos[perm] = np.arange(perm.shape[0], dtype=_I)
    return tpos


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
