"""Partial distance-2 coloring of the bipartite graph: column (JVP) and row (VJP) compression."""

from __future__ import annotations

import numpy as np

import sys

from asd.coloring.orders import vertex_order
from asd.coloring.result import ColumnColoring, RowColoring
from asd.patterns import SparsityPattern

__all__ = ["color_partial"]


#: below this much work (sum over vertices of their nets' sizes), and while Numba is not loaded
#: yet, the greedy coloring runs in Python: importing Numba costs more than coloring a small
#: pattern, and the first call of a fresh process should not pay it
PYTHON_WORK_LIMIT = 150_000


def _work(p1, p2, i1) -> int:
    net_size = np.diff(p2)
    return int(net_size[i1].sum()) if i1.size else 0


def greedy_d2_python(order, p1, i1, p2, i2, nv):
    """The first-fit partial distance-2 coloring of ``_order_kernels.greedy_d2``, in Python (the
    same colors)."""
    p1, i1, p2, i2 = p1.tolist(), i1.tolist(), p2.tolist(), i2.tolist()
    color = [-1] * nv
    ncol = 0
    for v in order.tolist():
        forbidden = set()
        for a in range(p1[v], p1[v + 1]):
            net = i1[a]
            for b in range(p2[net], p2[net + 1]):
                forbidden.add(color[i2[b]])
        c = 0
        while c in forbidden:
            c += 1
        color[v] = c
        ncol = max(ncol, c + 1)
    return np.asarray(color, dtype=np.int64), ncol


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
    if nv and "numba" not in sys.modules and _work(p1, p2, i1) <= PYTHON_WORK_LIMIT:
        colors, ncolors = greedy_d2_python(perm, p1, i1, p2, i2, nv)
    elif nv:
        from asd.coloring._order_kernels import greedy_d2

        colors, ncolors = greedy_d2(perm, p1, i1, p2, i2, nv)
    else:
        colors, ncolors = np.zeros(0, dtype=np.int64), 0
    cls = ColumnColoring if problem == "column" else RowColoring
    return cls(pattern, order, colors, int(ncolors))
