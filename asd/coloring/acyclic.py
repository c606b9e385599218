"""Symmetric acyclic coloring with substitution decompression."""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import csr_rows, heavy_vertices, transpose_positions
from asd.coloring.orders import vertex_order
from asd.coloring.result import Coloring, DecompressionPlan
from asd.errors import ColoringError

__all__ = ["color_acyclic", "substitution_plan"]


def substitution_plan(ptr, idx, colors, ncolors, tpos=None) -> DecompressionPlan:
    """Substitution plan of an acyclic coloring of the symmetric pattern ``(ptr, idx)``.

    Every two-colored forest is peeled leaf by leaf: the entry ``(i, j)`` for a leaf ``i`` with
    remaining neighbour ``j`` is ``B[c(j)][i]`` minus ``i``'s already solved entries of the same
    forest.  Steps are sorted by level (1 + the deepest step they depend on), so a vectorised
    kernel can solve one level at a time.
    """
    n = len(ptr) - 1
    nnz = len(idx)
    if tpos is None:
        tpos = transpose_positions(ptr, idx)
    rows = csr_rows(ptr)
    colors = np.asarray(colors, dtype=np.int64)
    if (colors < 0).any():
        raise ColoringError("substitution needs a coloring without neutral vertices")
    off = rows != idx
    if (colors[rows[off]] == colors[idx[off]]).any():
        raise ColoringError("substitution needs a distance-1 coloring (two adjacent vertices share a color)")
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return DecompressionPlan("substitution", (int(ncolors), n), nnz, None, z, z, z,
                                 np.zeros(1, np.int64), z, z, np.zeros(1, np.int64))
    from asd.coloring._acyclic_kernels import build_substitution, group_by_pair, sort_steps_by_level

    k = max(int(ncolors), 1)
    perm, gstart = group_by_pair(rows, idx, colors, k)
    sp_, spt, ssrc, slvl, dptr, dpos, ok = build_substitution(ptr, idx, tpos, rows, colors, perm, gstart, n)
    if not ok:
        raise ColoringError("the coloring has a two-colored cycle: it is not acyclic, substitution impossible")
    pos, pos_t, src, dep_ptr, dep_pos, dep_step, level_ptr = sort_steps_by_level(sp_, spt, ssrc, slvl, dptr, dpos)
    return DecompressionPlan(
        kind="substitution",
        compressed_shape=(int(ncolors), n),
        nnz=nnz,
        gather=None,
        step_pos=pos,
        step_pos_t=pos_t,
        step_src=src,
        dep_ptr=dep_ptr,
        dep_pos=dep_pos,
        dep_step=dep_step,
        level_ptr=level_ptr,
    )


def color_acyclic(ptr, idx, shape, order, seed=0, tpos=None, perm=None) -> Coloring:
    n = shape[0]
    if tpos is None:
        tpos = transpose_positions(ptr, idx)
    if perm is None:
        perm = vertex_order(order, n, False, ptr, idx, seed=seed)
    if n:
        from asd.coloring._acyclic_kernels import acyclic_color

        colors, ncolors = acyclic_color(perm, ptr, idx, tpos, *heavy_vertices(ptr))
        ncolors = int(ncolors)
    else:
        colors, ncolors = np.zeros(0, dtype=np.int64), 0
    plan = substitution_plan(ptr, idx, colors, ncolors, tpos)
    return Coloring("acyclic", order, shape, colors, ncolors, ptr, idx, plan)
