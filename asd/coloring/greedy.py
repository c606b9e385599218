"""Partial distance-2 coloring of the bipartite graph: column (JVP) and row (VJP) compression."""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import csr_rows, transpose_csr
from asd.coloring.orders import vertex_order
from asd.coloring.result import Coloring, DecompressionPlan

__all__ = ["color_partial", "partial_plan"]


def partial_plan(problem, colors, ncolors, indptr, indices, shape) -> DecompressionPlan:
    m, n = shape
    rows = csr_rows(indptr)
    if problem == "column":
        gather = colors[indices] * m + rows
        cshape = (ncolors, m)
    else:
        gather = colors[rows] * n + indices
        cshape = (ncolors, n)
    return DecompressionPlan(kind="direct", compressed_shape=cshape, nnz=len(indices), gather=gather.astype(np.int64))


def color_partial(indptr, indices, shape, problem, order, seed=0, perm=None) -> Coloring:
    m, n = shape
    tptr, tidx, _ = transpose_csr(indptr, indices, shape)
    if problem == "column":
        nv, p1, i1, p2, i2 = n, tptr, tidx, indptr, indices
    else:
        nv, p1, i1, p2, i2 = m, indptr, indices, tptr, tidx
    if perm is None:
        perm = vertex_order(order, nv, True, p1, i1, p2, i2, seed=seed)
    if nv:
        from asd.coloring._order_kernels import greedy_d2

        colors, ncolors = greedy_d2(perm, p1, i1, p2, i2, nv)
    else:
        colors, ncolors = np.zeros(0, dtype=np.int64), 0
    plan = partial_plan(problem, colors, int(ncolors), indptr, indices, shape)
    return Coloring(problem, order, shape, colors, int(ncolors), indptr, indices, plan)
