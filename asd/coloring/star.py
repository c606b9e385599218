"""Symmetric star coloring (direct Hessian recovery)."""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import csr_rows, heavy_vertices, transpose_positions
from asd.coloring.orders import vertex_order
from asd.coloring.result import Coloring, DecompressionPlan

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


def color_star(ptr, idx, shape, order, seed=0, postprocess=False, tpos=None, perm=None) -> Coloring:
    n = shape[0]
    if tpos is None:
        tpos = transpose_positions(ptr, idx)
    if perm is None:
        perm = vertex_order(order, n, False, ptr, idx, seed=seed)
    rows = csr_rows(ptr)
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
    plan = star_plan(ptr, idx, rows, colors, ncolors, star, hub, n)
    return Coloring("star", order, shape, colors, ncolors, ptr, idx, plan,
                    meta={"star": star, "hub": hub})


def star_plan(ptr, idx, rows, colors, ncolors, star, hub, n):
    i, j = rows, idx
    h = np.where(i == j, j, -1)
    off = i != j
    h[off] = hub[star[off]]
    # read (i, j) at i from the hub's color when the hub is j (or undetermined), else at j
    at_i = (h == j) | (h < 0)
    gather = np.where(at_i, colors[j] * n + i, colors[i] * n + j).astype(np.int64)
    return DecompressionPlan(kind="direct", compressed_shape=(ncolors, n), nnz=len(idx), gather=gather)
