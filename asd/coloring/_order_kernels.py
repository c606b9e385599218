"""Numba kernels for vertex orderings (private; imported lazily).

A graph is given either directly as an adjacency CSR (``d2 = False``: neighbours of ``v`` are
``i1[p1[v]:p1[v+1]]``) or implicitly as the distance-2 graph of one side of a bipartite graph
(``d2 = True``: vertex ``v`` -> nets ``i1[p1[v]:p1[v+1]]`` -> vertices ``i2[p2[net]:...]``),
which is how column/row intersection graphs are handled without forming ``A^T A``.
"""

import numpy as np
from numba import njit

from asd.coloring._graph_kernels import first_fit


@njit(cache=True)
def _nbrs(v, d2, p1, i1, p2, i2, marker, buf):
    k = 0
    marker[v] = v
    if d2:
        for a in range(p1[v], p1[v + 1]):
            net = i1[a]
            for b in range(p2[net], p2[net + 1]):
                w = i2[b]
                if marker[w] != v:
                    marker[w] = v
                    buf[k] = w
                    k += 1
    else:
        for a in range(p1[v], p1[v + 1]):
            w = i1[a]
            if marker[w] != v:
                marker[w] = v
                buf[k] = w
                k += 1
    return k


@njit(cache=True)
def degrees(nv, d2, p1, i1, p2, i2):
    deg = np.zeros(nv, dtype=np.int64)
    marker = np.full(nv, -1, dtype=np.int64)
    buf = np.empty(nv, dtype=np.int64)
    for v in range(nv):
        deg[v] = _nbrs(v, d2, p1, i1, p2, i2, marker, buf)
    return deg


@njit(cache=True)
def _bucket_insert(v, key, head, nxt, prv):
    h = head[key]
    nxt[v] = h
    prv[v] = -1
    if h >= 0:
        prv[h] = v
    head[key] = v


@njit(cache=True)
def _bucket_remove(v, key, head, nxt, prv):
    a = prv[v]
    b = nxt[v]
    if a >= 0:
        nxt[a] = b
    else:
        head[key] = b
    if b >= 0:
        prv[b] = a


@njit(cache=True)
def smallest_last(nv, d2, p1, i1, p2, i2):
    """Matula-Beck smallest-last ordering (exact dynamic degrees, bucket queues)."""
    deg = degrees(nv, d2, p1, i1, p2, i2)
    head = np.full(nv + 1, -1, dtype=np.int64)
    nxt = np.empty(nv, dtype=np.int64)
    prv = np.empty(nv, dtype=np.int64)
    for v in range(nv - 1, -1, -1):
        _bucket_insert(v, deg[v], head, nxt, prv)
    removed = np.zeros(nv, dtype=np.bool_)
    marker = np.full(nv, -1, dtype=np.int64)
    buf = np.empty(nv, dtype=np.int64)
    order = np.empty(nv, dtype=np.int64)
    mind = 0
    for step in range(nv - 1, -1, -1):
        while head[mind] < 0:
            mind += 1
        v = head[mind]
        _bucket_remove(v, mind, head, nxt, prv)
        removed[v] = True
        order[step] = v
        k = _nbrs(v, d2, p1, i1, p2, i2, marker, buf)
        for t in range(k):
            w = buf[t]
            if not removed[w]:
                _bucket_remove(w, deg[w], head, nxt, prv)
                deg[w] -= 1
                _bucket_insert(w, deg[w], head, nxt, prv)
        mind = mind - 1 if mind > 0 else 0
    return order


@njit(cache=True)
def incidence_degree(nv, d2, p1, i1, p2, i2):
    """Incidence-degree ordering: next is the vertex with most already-ordered neighbours
    (ties: larger degree first, then smaller index)."""
    deg = degrees(nv, d2, p1, i1, p2, i2)
    # insert ascending (deg, -index) so that the bucket head is the max-degree, min-index vertex
    srt = np.argsort(deg * (nv + 1) + (nv - np.arange(nv)), kind="mergesort")
    head = np.full(nv + 1, -1, dtype=np.int64)
    nxt = np.empty(nv, dtype=np.int64)
    prv = np.empty(nv, dtype=np.int64)
    inc = np.zeros(nv, dtype=np.int64)
    for t in range(nv):
        _bucket_insert(srt[t], 0, head, nxt, prv)
    done = np.zeros(nv, dtype=np.bool_)
    marker = np.full(nv, -1, dtype=np.int64)
    buf = np.empty(nv, dtype=np.int64)
    order = np.empty(nv, dtype=np.int64)
    maxi = 0
    for step in range(nv):
        while head[maxi] < 0:
            maxi -= 1
        v = head[maxi]
        _bucket_remove(v, maxi, head, nxt, prv)
        done[v] = True
        order[step] = v
        k = _nbrs(v, d2, p1, i1, p2, i2, marker, buf)
        for t in range(k):
            w = buf[t]
            if not done[w]:
                _bucket_remove(w, inc[w], head, nxt, prv)
                inc[w] += 1
                _bucket_insert(w, inc[w], head, nxt, prv)
                if inc[w] > maxi:
                    maxi = inc[w]
    return order


@njit(cache=True)
def dynamic_largest_first(nv, d2, p1, i1, p2, i2):
    """Dynamic largest-first: next is the vertex with most not-yet-ordered neighbours."""
    deg = degrees(nv, d2, p1, i1, p2, i2)
    head = np.full(nv + 1, -1, dtype=np.int64)
    nxt = np.empty(nv, dtype=np.int64)
    prv = np.empty(nv, dtype=np.int64)
    maxd = 0
    for v in range(nv - 1, -1, -1):
        _bucket_insert(v, deg[v], head, nxt, prv)
        if deg[v] > maxd:
            maxd = deg[v]
    done = np.zeros(nv, dtype=np.bool_)
    marker = np.full(nv, -1, dtype=np.int64)
    buf = np.empty(nv, dtype=np.int64)
    order = np.empty(nv, dtype=np.int64)
    for step in range(nv):
        while head[maxd] < 0:
            maxd -= 1
        v = head[maxd]
        _bucket_remove(v, maxd, head, nxt, prv)
        done[v] = True
        order[step] = v
        k = _nbrs(v, d2, p1, i1, p2, i2, marker, buf)
        for t in range(k):
            w = buf[t]
            if not done[w]:
                _bucket_remove(w, deg[w], head, nxt, prv)
                deg[w] -= 1
                _bucket_insert(w, deg[w], head, nxt, prv)
    return order


@njit(cache=True)
def greedy_d2(order, p1, i1, p2, i2, nv):
    """First-fit partial distance-2 coloring of the vertices ``0..nv-1`` in ``order``:
    vertex -> nets (p1, i1), net -> vertices (p2, i2).

    The scan of a vertex's nets stops once every color used so far is forbidden (the vertex then
    gets a new color whatever the remaining nets hold): on dense-ish patterns, where most vertices
    see every color in their first few nets, this replaces the sum of squared net sizes by about
    ``ncolors log ncolors`` per vertex, with the same colors."""
    color = np.full(nv, -1, dtype=np.int64)
    forbidden = np.full(nv + 1, -1, dtype=np.int64)
    ncol = 0
    for t in range(order.shape[0]):
        v = order[t]
        seen = 0  # distinct colors forbidden for v so far
        for a in range(p1[v], p1[v + 1]):
            if seen == ncol:
                break
            net = i1[a]
            for b in range(p2[net], p2[net + 1]):
                c = color[i2[b]]
                if c >= 0 and forbidden[c] != v:
                    forbidden[c] = v
                    seen += 1
        c = ncol if seen == ncol else first_fit(forbidden, v)
        color[v] = c
        ncol = max(ncol, c + 1)
    return color, ncol
