"""Numba kernels: star coloring with two-colored star sets (private; imported lazily).

Symmetric adjacency CSR ``(ptr, idx)`` (diagonal entries are skipped), ``tpos`` the mirror
positions.  Follows the star-set idea of Gebremedhin, Tarafdar, Manne & Pothen (2007): every
edge with both ends colored belongs to exactly one two-colored star, whose hub is recorded
(``-1`` while the star is a single edge), so the decompression plan needs no search.
"""

import numpy as np
from numba import njit

from asd.coloring._graph_kernels import first_fit


@njit(cache=True)
def _treat(v, w, ptr, idx, color, forbidden):
    for q in range(ptr[w], ptr[w + 1]):
        x = idx[q]
        if x != v and x != w:
            cx = color[x]
            if cx >= 0:
                forbidden[cx] = v


@njit(cache=True)
def _treat_any(v, w, ptr, idx, color, forbidden, heavy, clist, ncl):
    h = heavy[w]
    if h >= 0:
        for t in range(ncl[h]):
            forbidden[clist[h, t]] = v
    else:
        _treat(v, w, ptr, idx, color, forbidden)


@njit(cache=True)
def _note_color(v, c, ptr, idx, tpos, heavy, cnt, rep, clist, ncl):
    """v was colored c: update the color tables of v's heavy neighbours."""
    for p in range(ptr[v], ptr[v + 1]):
        w = idx[p]
        if w == v:
            continue
        h = heavy[w]
        if h >= 0:
            if cnt[h, c] == 0:
                rep[h, c] = tpos[p]
                clist[h, ncl[h]] = c
                ncl[h] += 1
            cnt[h, c] += 1


@njit(cache=True)
def star_color(order, ptr, idx, tpos, heavy, nslots, width):
    """``heavy[w] >= 0`` marks high-degree vertices that keep per-color tables (count and one
    representative edge of their colored neighbours per color, plus the list of colors
    present), so scans of their neighbourhoods cost O(#colors) instead of O(degree)."""
    n = ptr.shape[0] - 1
    nnz = idx.shape[0]
    cnt = np.zeros((nslots, width), dtype=np.int64)
    rep = np.full((nslots, width), -1, dtype=np.int64)
    clist = np.empty((nslots, width), dtype=np.int64)
    ncl = np.zeros(nslots, dtype=np.int64)
    color = np.full(n, -1, dtype=np.int64)
    forbidden = np.full(n + 1, -1, dtype=np.int64)
    first_v = np.full(n + 1, -1, dtype=np.int64)  # first_v[c] == v: v has seen a neighbour of color c
    first_w = np.full(n + 1, -1, dtype=np.int64)
    treated = np.full(n, -1, dtype=np.int64)
    new_v = np.full(n + 1, -1, dtype=np.int64)  # stars created with hub v in this step, per color
    new_s = np.full(n + 1, -1, dtype=np.int64)
    star = np.full(nnz, -1, dtype=np.int64)
    hub = np.full(nnz // 2 + 1, -1, dtype=np.int64)
    nstars = 0
    ncol = 0
    for t in range(order.shape[0]):
        v = order[t]
        # 1. forbid the colors of the neighbours
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w != v:
                cw = color[w]
                if cw >= 0:
                    forbidden[cw] = v
        # 2. forbid colors that would create a two-colored path on four vertices
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w == v:
                continue
            cw = color[w]
            if cw < 0:
                continue
            if first_v[cw] == v:
                # v has two neighbours of color cw: v becomes a hub; no neighbour of them may
                # share v's color
                q = first_w[cw]
                if treated[q] != v:
                    _treat_any(v, q, ptr, idx, color, forbidden, heavy, clist, ncl)
                    treated[q] = v
                if treated[w] != v:
                    _treat_any(v, w, ptr, idx, color, forbidden, heavy, clist, ncl)
                    treated[w] = v
            else:
                first_v[cw] = v
                first_w[cw] = w
                # w is a leaf of a star whose hub is x: v must not take x's color
                h = heavy[w]
                if h >= 0:
                    for t2 in range(ncl[h]):
                        cx = clist[h, t2]
                        if cnt[h, cx] == 1 and forbidden[cx] != v:
                            q = rep[h, cx]
                            if hub[star[q]] == idx[q]:
                                forbidden[cx] = v
                else:
                    for q in range(ptr[w], ptr[w + 1]):
                        x = idx[q]
                        if x == v or x == w:
                            continue
                        cx = color[x]
                        if cx >= 0 and forbidden[cx] != v:
                            s = star[q]
                            if hub[s] == x:
                                forbidden[cx] = v
        c = first_fit(forbidden, v)
        color[v] = c
        ncol = max(ncol, c + 1)
        # 3. update the star sets with the new edges (v, w)
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w == v:
                continue
            cw = color[w]
            if cw < 0:
                continue
            found = -1
            h = heavy[w]
            if h >= 0:
                if cnt[h, c] > 0:
                    found = rep[h, c]
            else:
                for q in range(ptr[w], ptr[w + 1]):
                    x = idx[q]
                    if x != v and x != w and color[x] == c:
                        found = q
                        break
            if found >= 0:
                # join the star of (w, x): its hub is w
                s = star[found]
                hub[s] = w
            elif new_v[cw] == v:
                # second neighbour of color cw: v is the hub of that star
                s = new_s[cw]
                hub[s] = v
            else:
                s = nstars
                nstars += 1
                hub[s] = -1
                new_v[cw] = v
                new_s[cw] = s
            star[p] = s
            star[tpos[p]] = s
        if nslots > 0:
            _note_color(v, c, ptr, idx, tpos, heavy, cnt, rep, clist, ncl)
    return color, ncol, star, hub[:nstars].copy()


@njit(cache=True)
def choose_hubs(star_u, star_w, hub, key, needed):
    """Give every single-edge star (hub == -1) a hub, preferring a hub whose color key is
    already needed; otherwise the endpoint with the smaller key.  Marks needed keys."""
    for s in range(hub.shape[0]):
        if hub[s] >= 0:
            continue
        u = star_u[s]
        w = star_w[s]
        if needed[key[u]]:
            hub[s] = u
        elif needed[key[w]]:
            hub[s] = w
        elif key[u] <= key[w]:
            hub[s] = u
            needed[key[u]] = True
        else:
            hub[s] = w
            needed[key[w]] = True
    return hub
