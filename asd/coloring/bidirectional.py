"""Bidirectional (star bicoloring) of a Jacobian: rows and columns colored together.

The Jacobian ``A`` (m x n) is viewed as the symmetric bipartite matrix ``[[0, A^T], [A, 0]]``
on ``n + m`` vertices (columns first, then rows) and star-colored.  A color on the column side
is one JVP (seed = the columns of that color), a color on the row side one VJP.  An entry
``(i, j)`` sits in a two-colored star; if the hub is column ``j`` it is read from the JVP of
``j``'s color at row ``i``, if the hub is row ``i`` from the VJP of ``i``'s color at column
``j``.  Without post-processing every color present on a side is seeded (single-edge stars
are read from the JVP side).  With ``postprocess=True`` single-edge stars pick their hub so as
to need as few colors as possible, and colors that no hub needs on a side become *neutral*
(``-1``: that row/column is not seeded).  For every order the vertex order is computed in two
layouts of the bipartite graph (columns first / rows first) and the coloring with fewer AD
passes is kept; so is a one-sided coloring (column or row partial distance-2 coloring in the
same order, the other side all neutral) when it needs fewer passes - a bidirectional coloring
is therefore never worse than the column or row coloring of the same order.
"""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import augmented, csr_rows, heavy_vertices, transpose_csr, transpose_positions
from asd.coloring.orders import vertex_order
from asd.coloring.result import Coloring, DecompressionPlan
from asd.coloring.star import renumber, star_endpoints

__all__ = ["color_bidirectional"]


def _bicolor(perm, ptr, idx, shape, aptr, aidx, apos, atpos, rows, postprocess):
    from asd.coloring._star_kernels import choose_hubs, star_color

    m, n = shape
    nnz = len(idx)
    nv = n + m
    colors, K, astar, hub = star_color(perm, aptr, aidx, atpos, *heavy_vertices(aptr))
    K = int(K)
    hub = hub.copy()
    side = np.zeros(nv, dtype=np.int64)
    side[n:] = 1
    key = colors + side * K  # color keys: column side 0..K-1, row side K..2K-1
    # augmented position of (column j -> row n+i) for every original entry p
    qcol = np.empty(nnz, dtype=np.int64)
    qcol[apos[:nnz]] = np.arange(nnz, dtype=np.int64)
    s = astar[qcol]
    needed = np.zeros(2 * K, dtype=np.bool_)
    if postprocess:
        needed[key[hub[hub >= 0]]] = True
        su, sw = star_endpoints(aptr, aidx, astar, hub.shape[0])
        hub = choose_hubs(su, sw, hub, key, needed)
    else:
        needed[key] = True  # every colour present on a side is seeded
    h = hub[s]
    # hub = column j (or a single-edge star without postprocessing): read from the JVP
    by_col = (h == idx) | (h < 0)
    cc, ncc = renumber(colors[:n], needed[:K])
    rc, nrc = renumber(colors[n:], needed[K:])
    gather = np.where(by_col, cc[idx] * m + rows, ncc * m + rc[rows] * n + idx).astype(np.int64)
    plan = DecompressionPlan("direct", ((ncc, m), (nrc, n)), nnz, gather=gather)
    return rc, cc, ncc + nrc, plan, colors


def _one_sided(side, ptr, idx, shape, order, seed, rows):
    """A column (or row) coloring written as a bicoloring whose other side is neutral."""
    from asd.coloring.greedy import color_partial

    m, n = shape
    r = color_partial(ptr, idx, shape, side, order, seed)
    k = r.ncolors
    if side == "column":
        cc, rc = r.colors, np.full(m, -1, dtype=np.int64)
        plan = DecompressionPlan("direct", ((k, m), (0, n)), len(idx), gather=r.plan.gather)
        acolors = np.concatenate([cc, np.full(m, k, dtype=np.int64)])
    else:
        cc, rc = np.full(n, -1, dtype=np.int64), r.colors
        plan = DecompressionPlan("direct", ((0, m), (k, n)), len(idx), gather=r.plan.gather)
        acolors = np.concatenate([np.full(n, k, dtype=np.int64), rc])
    return rc, cc, k, plan, acolors


def color_bidirectional(ptr, idx, shape, order, seed=0, postprocess=False, perm=None) -> Coloring:
    """Star bicoloring.  The order is computed on the bipartite graph in two layouts
    (columns first, rows first - they differ in tie-breaking, decisive e.g. for ``natural``);
    the coloring with fewer AD passes is kept (columns-first on ties)."""
    m, n = shape
    nv = n + m
    if nv == 0:
        z = np.zeros(0, dtype=np.int64)
        plan = DecompressionPlan("direct", ((0, m), (0, n)), 0, gather=z)
        return Coloring("bidirectional", order, shape, (z.copy(), z.copy()), 0, ptr, idx, plan,
                        meta={"augmented_colors": z.copy()})
    aptr, aidx, apos = augmented(ptr, idx, shape)
    atpos = transpose_positions(aptr, aidx)
    rows = csr_rows(ptr)
    explicit = perm is not None
    if explicit:
        perms = (perm,)  # explicit vertex order of the augmented graph (columns, then rows)
    else:
        perm1 = vertex_order(order, nv, False, aptr, aidx, seed=seed)
        # rows-first layout: the augmented graph of A^T; map its vertex ids back
        tptr, tidx, _ = transpose_csr(ptr, idx, shape)
        bptr, bidx, _ = augmented(tptr, tidx, (n, m))
        perm2 = vertex_order(order, nv, False, bptr, bidx, seed=seed)
        perms = (perm1, np.where(perm2 < m, perm2 + n, perm2 - m).astype(np.int64))
    best = None
    for perm in perms:
        res = _bicolor(perm, ptr, idx, shape, aptr, aidx, apos, atpos, rows, postprocess)
        if best is None or res[2] < best[2]:
            best = res
    if not explicit:
        # lower bounds of the one-sided colorings: the densest row / column
        lb = {"column": int(np.diff(ptr).max()) if m else 0,
              "row": int(np.bincount(idx, minlength=n).max()) if n and len(idx) else 0}
        for side in ("column", "row"):
            if lb[side] >= best[2]:
                continue
            res = _one_sided(side, ptr, idx, shape, order, seed, rows)
            if res[2] < best[2]:
                best = res
    rc, cc, k, plan, acolors = best
    return Coloring("bidirectional", order, shape, (rc, cc), k, ptr, idx, plan,
                    meta={"augmented_colors": acolors})
