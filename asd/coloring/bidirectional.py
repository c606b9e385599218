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
passes is kept.

The greedy star coloring alone fails on the patterns bicoloring exists for.  It decides
neutrality only after coloring, so the light vertices of a side reuse the color of a dense
vertex of that side (in the natural order every column is colored before any row and they all
get color 0).  On an arrowhead (dense row 0, dense column 0, diagonal), column 0 and column
``j`` then share rows 0 and ``j``, every row becomes a hub whose partners need fresh colors, and
the coloring degenerates into ``n`` colors for every deterministic order.  So, as in the
vertex-cover bicolorings of Coleman & Verma and Gebremedhin et al. (2005), the seeded vertices
are also chosen *before* coloring: *split* bicolorings read the entries of the densest rows
from VJPs (those rows partial distance-2 colored among themselves) and all other entries from
JVPs (the columns colored on the remaining rows only; columns without such entries and the
other rows neutral), for every degree threshold whose lower bound can beat the best count so
far, and the same for ``A^T`` (dense columns to JVPs).  With no dense row this is the one-sided
column (row) coloring in the same order, so a bidirectional coloring is never worse than the
column or row coloring of the same order; the arrowhead needs 3 passes for every order.  The
star bicoloring is kept on ties.
"""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import augmented, heavy_vertices
from asd.coloring.orders import vertex_order
from asd.coloring.result import BiColoring
from asd.coloring.star import renumber, star_endpoints
from asd.patterns import SparsityPattern

__all__ = ["color_bidirectional"]


def _bicolor(perm, pattern, aug, postprocess):
    """Star bicoloring in the vertex order ``perm`` of the augmented graph ``aug``.
    Returns ``(row_colors, col_colors, nrow, ncol, from_column, augmented colors)``."""
    from asd.coloring._star_kernels import choose_hubs, star_color

    m, n = pattern.shape
    idx, rows = pattern.indices, pattern.rows
    nnz = pattern.nnz
    aptr, aidx, apos, atpos = aug
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
    return rc, cc, nrc, ncc, by_col, colors


def _rows_pattern(pattern, sel):
    """The rows ``sel`` (sorted int64) of ``pattern`` as a pattern of their own."""
    ptr, idx = pattern.indptr, pattern.indices
    deg = np.diff(ptr)[sel]
    sptr = np.zeros(sel.shape[0] + 1, dtype=np.int64)
    np.cumsum(deg, out=sptr[1:])
    src = np.repeat(ptr[sel] - sptr[:-1], deg) + np.arange(int(sptr[-1]), dtype=np.int64)
    return SparsityPattern((sel.shape[0], pattern.shape[1]), sptr, idx[src], _trusted=True)  # rows of a pattern


def _compact(colors, used):
    """Colors of the vertices in ``used`` renumbered ``0..k-1`` (order kept), the rest neutral."""
    out = np.full(colors.shape[0], -1, dtype=np.int64)
    if not used.any():
        return out, 0
    u, inv = np.unique(colors[used], return_inverse=True)
    out[used] = inv.reshape(-1)
    return out, int(u.shape[0])


def _split(pattern, order, seed, dense):
    """Split bicoloring: the entries of the rows ``dense`` (a boolean mask) are read from VJPs,
    all others from JVPs.  The columns are colored (partial distance-2, ``order``) on the other
    rows only, the dense rows on their own; columns without entries outside the dense rows and
    the other rows are neutral.  With no dense row this is the column coloring.  Returns the
    tuple of :func:`_bicolor`."""
    from asd.coloring.greedy import color_partial

    m, n = pattern.shape
    light = np.nonzero(~dense)[0].astype(np.int64)
    heavy = np.nonzero(dense)[0].astype(np.int64)
    lpat = _rows_pattern(pattern, light)
    cr = color_partial(lpat, "column", order, seed)
    used_c = np.zeros(n, dtype=np.bool_)
    used_c[lpat.indices] = True
    cc, ncc = _compact(np.asarray(cr.colors), used_c)
    rc = np.full(m, -1, dtype=np.int64)
    nrc = 0
    if heavy.shape[0]:
        hpat = _rows_pattern(pattern, heavy)
        rr = color_partial(hpat, "row", order, seed)
        sub, nrc = _compact(np.asarray(rr.colors), np.diff(hpat.indptr) > 0)
        rc[heavy] = sub
    by_col = ~dense[pattern.rows]
    k = ncc + nrc
    acolors = np.concatenate([np.where(cc >= 0, cc, k), np.where(rc >= 0, ncc + rc, k)])
    return rc, cc, nrc, ncc, by_col, acolors


def _split_candidates(pattern, order, seed, best, max_tries=12):
    """Split bicolorings of ``A`` (dense rows to VJPs) and of ``A^T`` (dense columns to JVPs)
    for thresholds on the row (column) degree, tried from the one-sided coloring (no dense
    row) upwards while a lower bound (densest remaining row + densest column among the dense
    rows) is below the best count so far.  Returns the best candidate strictly better than
    ``best`` (or ``best``)."""
    T, tsrc = pattern.transpose_with_positions
    # entry p of A is entry inv[p] of A^T
    inv = np.empty_like(tsrc)
    inv[tsrc] = np.arange(tsrc.shape[0], dtype=np.int64)
    count = best[2] + best[3]
    for P in (pattern, T):
        deg = np.diff(P.indptr)
        if deg.shape[0] == 0:
            continue
        rank = np.argsort(-deg, kind="stable")
        dsorted = deg[rank]
        # candidate numbers of dense rows: 0 and every boundary between distinct degrees
        ks = [0] + [int(k) for k in np.nonzero(dsorted[:-1] > dsorted[1:])[0] + 1]
        tries = 0
        for k in ks:
            if tries >= max_tries:
                break
            rest = int(dsorted[k]) if k < dsorted.shape[0] else 0
            dense = np.zeros(P.shape[0], dtype=np.bool_)
            dense[rank[:k]] = True
            if k:
                hi = np.bincount(P.indices[np.repeat(dense, deg)], minlength=P.shape[1])
                lb = rest + int(hi.max())
                if int(hi.max()) >= count:
                    break
            else:
                lb = rest
            if lb >= count:
                continue
            tries += 1
            res = _split(P, order, seed, dense)
            if res[2] + res[3] >= count:
                continue
            if P is T:
                # JVPs of A^T are VJPs of A and vice versa; A^T's rows are A's columns
                rc_t, cc_t, nr_t, nc_t, by_col_t, acol_t = res
                kk = nr_t + nc_t
                acolors = np.concatenate([np.where(rc_t >= 0, rc_t, kk), np.where(cc_t >= 0, nr_t + cc_t, kk)])
                res = (cc_t, rc_t, nc_t, nr_t, ~by_col_t[inv], acolors)
            best = res
            count = res[2] + res[3]
    return best


def color_bidirectional(pattern, order, seed=0, postprocess=False, perm=None) -> BiColoring:
    """Star bicoloring, or a split bicoloring when it needs fewer AD passes (see the module
    docstring).  The order is computed on the bipartite graph in two layouts (columns first,
    rows first - they differ in tie-breaking, decisive e.g. for ``natural``); the coloring with
    fewer AD passes is kept (columns-first on ties).  An explicit ``perm`` (iterated greedy)
    colors the augmented graph in that order only."""
    m, n = pattern.shape
    nv = n + m
    if nv == 0:
        z = np.zeros(0, dtype=np.int64)
        return BiColoring(pattern, order, z, z, 0, 0, np.zeros(0, dtype=bool), z)
    aug = augmented(pattern)
    explicit = perm is not None
    if explicit:
        perms = (perm,)  # explicit vertex order of the augmented graph (columns, then rows)
    else:
        aptr, aidx = aug[0], aug[1]
        perm1 = vertex_order(order, nv, False, aptr, aidx, seed=seed)
        # rows-first layout: the augmented graph of A^T; map its vertex ids back
        bptr, bidx = augmented(pattern.T)[:2]
        perm2 = vertex_order(order, nv, False, bptr, bidx, seed=seed)
        perms = (perm1, np.where(perm2 < m, perm2 + n, perm2 - m).astype(np.int64))
    best = None
    for perm in perms:
        res = _bicolor(perm, pattern, aug, postprocess)
        if best is None or res[2] + res[3] < best[2] + best[3]:
            best = res
    if not explicit:
        best = _split_candidates(pattern, order, seed, best)
    rc, cc, nrc, ncc, by_col, acolors = best
    return BiColoring(pattern, order, rc, cc, nrc, ncc, by_col, acolors)
