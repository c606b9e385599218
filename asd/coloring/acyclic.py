"""Symmetric acyclic coloring with substitution decompression."""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import csr_rows, transpose_positions
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
    off = np.nonzero(rows != idx)[0]
    ci, cj = colors[rows[off]], colors[idx[off]]
    if (ci == cj).any() or (colors < 0).any():
        raise ColoringError("substitution needs a distance-1 coloring without neutral vertices")
    k = max(int(ncolors), 1)
    pair = np.minimum(ci, cj) * k + np.maximum(ci, cj)
    srt = np.lexsort((idx[off], rows[off], pair))
    perm = off[srt].astype(np.int64)
    pair_s = pair[srt]
    if perm.size:
        bounds = np.nonzero(np.diff(pair_s))[0] + 1
        gstart = np.concatenate([[0], bounds, [perm.size]]).astype(np.int64)
    else:
        gstart = np.zeros(1, dtype=np.int64)
    if n:
        from asd.coloring._acyclic_kernels import build_substitution

        sp_, spt, ssrc, slvl, dptr, dpos, ok = build_substitution(ptr, idx, tpos, rows, colors, perm, gstart, n)
    else:
        z = np.zeros(0, dtype=np.int64)
        sp_, spt, ssrc, slvl, dptr, dpos, ok = z, z, z, z, np.zeros(1, np.int64), z, True
    if not ok:
        raise ColoringError("the coloring has a two-colored cycle: it is not acyclic, substitution impossible")
    # sort steps by level (stable), carrying their dependency lists along
    order = np.argsort(slvl, kind="stable")
    lens = np.diff(dptr)[order]
    new_ptr = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    starts = dptr[:-1][order]
    total = int(new_ptr[-1])
    step_of_dep = np.repeat(np.arange(len(order), dtype=np.int64), lens)
    offs = np.arange(total, dtype=np.int64) - new_ptr[:-1][step_of_dep]
    dep_pos = dpos[starts[step_of_dep] + offs] if total else np.zeros(0, dtype=np.int64)
    lv = slvl[order]
    nlev = int(lv.max()) + 1 if lv.size else 0
    level_ptr = np.zeros(nlev + 1, dtype=np.int64)
    if lv.size:
        np.cumsum(np.bincount(lv, minlength=nlev), out=level_ptr[1:])
    return DecompressionPlan(
        kind="substitution",
        compressed_shape=(int(ncolors), n),
        nnz=nnz,
        gather=None,
        step_pos=sp_[order].astype(np.int64),
        step_pos_t=spt[order].astype(np.int64),
        step_src=ssrc[order].astype(np.int64),
        dep_ptr=new_ptr,
        dep_pos=dep_pos.astype(np.int64),
        dep_step=step_of_dep,
        level_ptr=level_ptr,
    )


def color_acyclic(ptr, idx, shape, order, seed=0) -> Coloring:
    n = shape[0]
    tpos = transpose_positions(ptr, idx)
    perm = vertex_order(order, n, False, ptr, idx, seed=seed)
    if n:
        from asd.coloring._acyclic_kernels import acyclic_color

        colors, ncolors = acyclic_color(perm, ptr, idx, tpos)
        ncolors = int(ncolors)
    else:
        colors, ncolors = np.zeros(0, dtype=np.int64), 0
    plan = substitution_plan(ptr, idx, colors, ncolors, tpos)
    return Coloring("acyclic", order, shape, colors, ncolors, ptr, idx, plan)
