"""Partial distance-2 coloring of the bipartite graph: column (JVP) and row (VJP) compression."""

from __future__ import annotations

import numpy as np

from asd.coloring.orders import vertex_order
from asd.coloring.result import ColumnColoring, RowColoring
from asd.patterns import SparsityPattern

__all__ = ["color_partial"]


def color_partial(pattern: SparsityPattern, problem: str, order: str, seed: int = 0, perm=None):
    """Partial distance-2 coloring of the columns (``problem="column"``) or rows (``"row"``)."""
    m, n = pattern.shape
    T = pattern.T
    if problem == "column":
        nv, p1, i1, p2, i2 = n, T.indptr, T.indices, pattern.indptr, pattern.indices
    else:
        nv, p1, i1, p2, i2 = m, pattern.indptr, pattern.indices, T.indptr, T.indices
    if perm is None:
        perm = vertex_order(order, nv, True, p1, i1, p2, i2, seed=seed)
    if nv:
        from asd.coloring._order_kernels import greedy_d2

        colors, ncolors = greedy_d2(perm, p1, i1, p2, i2, nv)
    else:
        colors, ncolors = np.zeros(0, dtype=np.int64), 0
    cls = ColumnColoring if problem == "column" else RowColoring
    return cls(pattern, order, colors, int(ncolors))
