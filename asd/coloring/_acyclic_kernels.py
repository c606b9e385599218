"""Numba kernels: acyclic coloring with a disjoint-set forest of two-colored trees
(Gebremedhin, Tarafdar, Manne & Pothen 2007) (private; lazy)."""

import numpy as np
from numba import njit

from asd.coloring._graph_kernels import first_fit
from asd.coloring._star_kernels import _note_color


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
def acyclic_color(order, ptr, idx, tpos, heavy, nslots, width):
    """Greedy acyclic coloring.  Edges are identified by the smaller of their two CSR
    positions; each two-colored tree is a set of a disjoint-set forest over edges.
    Heavy vertices (``heavy[w] >= 0``) keep per-color tables of their colored neighbours:
    all of w's edges to one color lie in one two-colored tree, so one representative edge
    per color replaces the scan of w's neighbourhood."""
    n = ptr.shape[0] - 1
    nnz = idx.shape[0]
    cnt = np.zeros((nslots, width), dtype=np.int64)
    rep = np.full((nslots, width), -1, dtype=np.int64)
    clist = np.empty((nslots, width), dtype=np.int64)
    ncl = np.zeros(nslots, dtype=np.int64)
    color = np.full(n, -1, dtype=np.int64)
    forbidden = np.full(n + 1, -1, dtype=np.int64)
    parent = np.arange(nnz, dtype=np.int64)
    rank = np.zeros(nnz, dtype=np.int8)
    visit_v = np.full(nnz, -1, dtype=np.int64)  # first visit of a tree (root) by (v, w)
    visit_w = np.full(nnz, -1, dtype=np.int64)
    fn_v = np.full(n + 1, -1, dtype=np.int64)  # per color: v's first edge to that color
    fn_e = np.full(n + 1, -1, dtype=np.int64)
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
            h = heavy[w]
            if h >= 0:
                for t2 in range(ncl[h]):
                    cx = clist[h, t2]
                    if forbidden[cx] == v:
                        continue
                    q = rep[h, cx]
                    e = q if q < tpos[q] else tpos[q]
                    r = _find(parent, e)
                    if visit_v[r] != v:
                        visit_v[r] = v
                        visit_w[r] = w
                    elif visit_w[r] != w:
                        forbidden[cx] = v
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
                if visit_v[r] != v:
                    visit_v[r] = v
                    visit_w[r] = w
                elif visit_w[r] != w:
                    forbidden[cx] = v
        c = first_fit(forbidden, v)
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
            h = heavy[w]
            if h >= 0:
                if cnt[h, c] > 0:
                    q = rep[h, c]
                    f = q if q < tpos[q] else tpos[q]
                    _union(parent, rank, e, f)
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
        if nslots > 0:
            _note_color(v, c, ptr, idx, tpos, heavy, cnt, rep, clist, ncl)
    return color, ncol
