"""Numba kernels: acyclic coloring with a disjoint-set forest of two-colored trees
(Gebremedhin, Tarafdar, Manne & Pothen 2007) (private; lazy).

Edges are identified by the smaller of their two CSR positions; each two-colored tree is a set
of a disjoint-set forest over edges.  All edges from a vertex w to vertices of one color lie in
one two-colored tree, so one representative edge per color names it.  The colors forbidden for
the vertex being colored are a bitset (int64 words); vertices with a bitset slot
(``bslot[w] >= 0``, see :func:`asd.coloring.graphs.acyclic_tables`) keep the bitset of the
colors of their colored neighbours and a representative edge per color, so that the search of
their neighbourhood visits only the colors not yet forbidden, 64 at a time, instead of every
neighbour.  The colors only depend on the partition of the edges into trees, never on which
edge of a tree is used or which one is its root.
"""

import numpy as np
from numba import njit

from asd.coloring._star_kernels import _ONE, _ctz, _first_zero, _set


@njit(cache=True)
def _find(parent, e):
    r = e
    while parent[r] != r:
        r = parent[r]
    while parent[e] != r:  # path compression
        nx = parent[e]
        parent[e] = r
        e = nx
    return r


@njit(cache=True)
def _union(parent, rank, a, b):
    ra = _find(parent, a)
    rb = _find(parent, b)
    if ra == rb:
        return
    if rank[ra] < rank[rb]:
        parent[ra] = rb
    elif rank[ra] > rank[rb]:
        parent[rb] = ra
    else:
        parent[rb] = ra
        rank[ra] += 1


@njit(cache=True)
def _acyclic_light(order, ptr, idx, tpos, neg):
    """:func:`acyclic_color` without tables, every neighbourhood scanned.  Forbidden colors
    are marked with the vertex (never cleared)."""
    n = ptr.shape[0] - 1
    nnz = idx.shape[0]
    color = np.full(n, neg)
    forbidden = np.full(n + 1, neg)
    parent = np.empty(nnz, dtype=color.dtype)
    for e in range(nnz):
        parent[e] = e
    rank = np.zeros(nnz, dtype=np.int8)
    visit = np.full((nnz, 2), neg)  # first visit of a tree (root) by (v, w)
    fn_v = np.full(n + 1, neg)  # per color: v's first edge to that color
    fn_e = np.full(n + 1, neg)
    ncol = 0
    for t in range(order.shape[0]):
        v = order[t]
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w != v:
                cw = color[w]
                if cw >= 0:
                    forbidden[cw] = v
        # two neighbours of one color in the same two-colored tree: that tree's other color
        # would close a cycle
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w == v or color[w] < 0:
                continue
            for q in range(ptr[w], ptr[w + 1]):
                x = idx[q]
                if x == v or x == w:
                    continue
                cx = color[x]
                if cx < 0 or forbidden[cx] == v:
                    continue
                e = q if q < tpos[q] else tpos[q]
                r = _find(parent, e)
                if visit[r, 0] != v:
                    visit[r, 0] = v
                    visit[r, 1] = w
                elif visit[r, 1] != w:
                    forbidden[cx] = v
        c = 0
        while forbidden[c] == v:
            c += 1
        color[v] = c
        ncol = max(ncol, c + 1)
        # merge the new edges into the two-colored trees they touch
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w == v:
                continue
            cw = color[w]
            if cw < 0:
                continue
            e = p if p < tpos[p] else tpos[p]
            for q in range(ptr[w], ptr[w + 1]):
                x = idx[q]
                if x != v and x != w and color[x] == c:
                    f = q if q < tpos[q] else tpos[q]
                    _union(parent, rank, e, f)
                    break  # all of w's c-colored edges already share one tree
            if fn_v[cw] == v:
                _union(parent, rank, e, fn_e[cw])
            else:
                fn_v[cw] = v
                fn_e[cw] = e
    return color.astype(np.int64), ncol


@njit(cache=True)
def _grow(nbr, rep, W, bslot, bvert, budget):
    """Double the words of the color bitsets (and the representative edges: 64 per word); when
    that exceeds ``budget`` entries, the vertices of the last slots (lowest degrees) lose their
    tables and go back to scanning their neighbourhoods."""
    nb = nbr.shape[0]
    W2 = 2 * W
    nb2 = min(nb, budget // (65 * W2))
    for k in range(nb2, nb):
        bslot[bvert[k]] = -1
    nbr2 = np.zeros((nb2, W2), dtype=np.int64)
    rep2 = np.empty((nb2, 64 * W2), dtype=rep.dtype)
    for k in range(nb2):
        for i in range(W):
            nbr2[k, i] = nbr[k, i]
        for i in range(64 * W):
            rep2[k, i] = rep[k, i]
    return nbr2, rep2


def acyclic_color(order, ptr, idx, tpos, bslot, bvert, budget, neg):
    """Greedy acyclic coloring in ``order``: ``(colors, ncolors)`` (int64 colors).  The table
    layout (see :func:`asd.coloring.graphs.acyclic_tables`): ``bslot``/``bvert`` number the
    vertices that keep a color bitset and representative edges (by decreasing degree), within
    ``budget`` entries (see the module doc); ``neg`` is ``-1`` of the integer type of the work
    arrays.  Without any table the scanning kernel runs (only the kernel used is compiled)."""
    if min(bvert.shape[0], budget // 65) == 0:
        return _acyclic_light(order, ptr, idx, tpos, neg)
    return _acyclic_tables(order, ptr, idx, tpos, bslot, bvert, budget, neg)


@njit(cache=True)
def _acyclic_tables(order, ptr, idx, tpos, bslot, bvert, budget, neg):
    """:func:`acyclic_color` with the tables (at least one vertex has them)."""
    n = ptr.shape[0] - 1
    nnz = idx.shape[0]
    W = 1  # words per bitset; 64 W representative edges
    nbits = min(bvert.shape[0], budget // (65 * W))
    bslot = bslot.copy()
    for k in range(nbits, bvert.shape[0]):
        bslot[bvert[k]] = -1
    color = np.full(n, neg)
    nbr = np.zeros((nbits, W), dtype=np.int64)  # colors of the colored neighbours
    rep = np.empty((nbits, 64 * W), dtype=color.dtype)  # edge per color; only where nbr has the bit
    forb = np.zeros((n >> 6) + 2, dtype=np.int64)
    parent = np.empty(nnz, dtype=color.dtype)
    for e in range(nnz):
        parent[e] = e
    rank = np.zeros(nnz, dtype=np.int8)
    visit = np.full((nnz, 2), neg)  # first visit of a tree (root) by (v, w)
    fn_v = np.full(n + 1, neg)  # per color: v's first edge to that color
    fn_e = np.full(n + 1, neg)
    ncol = 0
    for t in range(order.shape[0]):
        v = order[t]
        nw = (ncol >> 6) + 1  # colors so far lie in words < nw; color ncol is free
        for i in range(nw):
            forb[i] = 0
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w != v:
                cw = color[w]
                if cw >= 0:
                    _set(forb, cw)
        # two neighbours of one color in the same two-colored tree: that tree's other color
        # would close a cycle
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w == v or color[w] < 0:
                continue
            b = bslot[w]
            if b >= 0:
                for i in range(nw):
                    bits = nbr[b, i] & ~forb[i]
                    while bits != 0:
                        k = _ctz(bits)
                        bits ^= _ONE << k
                        cx = (i << 6) + k
                        r = _find(parent, rep[b, cx])
                        rep[b, cx] = r  # the root is an edge of that tree too: a shorter path
                        if visit[r, 0] != v:
                            visit[r, 0] = v
                            visit[r, 1] = w
                        elif visit[r, 1] != w:
                            forb[i] |= _ONE << (cx & 63)
                continue
            for q in range(ptr[w], ptr[w + 1]):
                x = idx[q]
                if x == v or x == w:
                    continue
                cx = color[x]
                if cx < 0 or (forb[cx >> 6] >> (cx & 63)) & 1:
                    continue
                e = q if q < tpos[q] else tpos[q]
                r = _find(parent, e)
                if visit[r, 0] != v:
                    visit[r, 0] = v
                    visit[r, 1] = w
                elif visit[r, 1] != w:
                    _set(forb, cx)
        c = _first_zero(forb)
        color[v] = c
        if c >= ncol:
            ncol = c + 1
            if nbits > 0 and ncol >= 64 * W:  # keep nw <= W
                nbr, rep = _grow(nbr, rep, W, bslot, bvert, budget)
                W *= 2
                nbits = nbr.shape[0]
        cword = c >> 6
        cbit = _ONE << (c & 63)
        # merge the new edges into the two-colored trees they touch; v's color becomes a
        # neighbour color of its bitset neighbours
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w == v:
                continue
            b = bslot[w]
            cw = color[w]
            e = p if p < tpos[p] else tpos[p]
            if cw >= 0:
                if b >= 0:
                    if (nbr[b, cword] & cbit) != 0:
                        _union(parent, rank, e, rep[b, c])
                else:
                    for q in range(ptr[w], ptr[w + 1]):
                        x = idx[q]
                        if x != v and x != w and color[x] == c:
                            f = q if q < tpos[q] else tpos[q]
                            _union(parent, rank, e, f)
                            break  # all of w's c-colored edges already share one tree
                if fn_v[cw] == v:
                    _union(parent, rank, e, fn_e[cw])
                else:
                    fn_v[cw] = v
                    fn_e[cw] = e
            if b >= 0 and (nbr[b, cword] & cbit) == 0:
                nbr[b, cword] |= cbit
                rep[b, c] = e
    return color.astype(np.int64), ncol
