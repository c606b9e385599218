"""Symmetric star coloring (direct Hessian recovery)."""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import csr_rows, heavy_vertices
from asd.coloring.orders import vertex_order
from asd.coloring.result import StarColoring

__all__ = ["color_star", "star_endpoints", "renumber"]


def star_endpoints(ptr, idx, star, nstars):
    """One edge ``(u, w)`` of every star (enough for single-edge stars)."""
    rows = csr_rows(ptr)
    up = np.nonzero(rows < idx)[0]
    su = np.full(nstars, -1, dtype=np.int64)
    sw = np.full(nstars, -1, dtype=np.int64)
    s = star[up]
    su[s] = rows[up]
    sw[s] = idx[up]
    return su, sw


def renumber(colors, keep):
    """Map kept colors to ``0..k-1`` (order preserved), others to -1."""
    newid = np.full(keep.shape[0], -1, dtype=np.int64)
    newid[keep] = np.arange(int(keep.sum()), dtype=np.int64)
    out = np.where(colors >= 0, newid[np.maximum(colors, 0)], -1)
    return out.astype(np.int64), int(keep.sum())


def color_star(pattern, order, seed=0, postprocess=False, perm=None) -> StarColoring:
    """Star coloring of the symmetric ``pattern`` (both triangles stored)."""
    n = pattern.shape[0]
    ptr, idx = pattern.indptr, pattern.indices
    tpos = pattern.transpose_with_positions[1]
    if perm is None:
        perm = vertex_order(order, n, False, ptr, idx, seed=seed)
    rows = pattern.rows
    if n == 0:
        colors, ncolors, star, hub = np.zeros(0, np.int64), 0, np.zeros(0, np.int64), np.zeros(0, np.int64)
    else:
        from asd.coloring._star_kernels import choose_hubs, star_color

        colors, ncolors, star, hub = star_color(perm, ptr, idx, tpos, *heavy_vertices(ptr))
        ncolors = int(ncolors)
        hub = hub.copy()
        if postprocess:
            needed = np.zeros(max(ncolors, 1), dtype=np.bool_)
            diag = rows == idx
            needed[colors[rows[diag]]] = True
            needed[colors[hub[hub >= 0]]] = True
            su, sw = star_endpoints(ptr, idx, star, hub.shape[0])
            hub = choose_hubs(su, sw, hub, colors, needed)
            colors, ncolors = renumber(colors, needed[:ncolors])
    if n == 0:
        return StarColoring(pattern, order, colors, ncolors, np.zeros(0, np.bool_))
    from asd.coloring._star_kernels import read_from_column

    # (i, j) is read at row i of j's color when the star's hub is j (undetermined: the larger of i and j), else at
    # row j: (i, j) and (j, i) read the same value
    from_column = np.empty(idx.shape[0], dtype=np.bool_)
    read_from_column(rows, idx, star, hub, from_column)
    from_column.setflags(write=False)  # the coloring's own: kept uncopied
    return StarColoring(pattern, order, colors, ncolors, from_column)
