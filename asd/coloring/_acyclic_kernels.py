"""Numba kernels: acyclic coloring with a disjoint-set forest of two-colored trees
(Gebremedhin, Tarafdar, Manne & Pothen 2007), and the substitution plan (private; lazy)."""

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


@njit(cache=True)
def build_substitution(ptr, idx, tpos, rows, color, perm, gstart, n):
    """Peel the leaves of every two-colored forest.

    ``perm``: the off-diagonal CSR positions sorted by (color pair, row); ``gstart``: the start
    of each color pair's segment in ``perm`` (length ngroups + 1).  Returns the steps
    (pos, pos_t, src, level) in creation order, their dependencies (CSR-like) and ``ok``
    (False if some two-colored subgraph has a cycle).
    """
    nnz = idx.shape[0]
    # diagonal steps first
    ndiag = 0
    for p in range(nnz):
        if rows[p] == idx[p]:
            ndiag += 1
    nedge = (nnz - ndiag) // 2
    nsteps = ndiag + nedge
    step_pos = np.empty(nsteps, dtype=np.int64)
    step_pos_t = np.empty(nsteps, dtype=np.int64)
    step_src = np.empty(nsteps, dtype=np.int64)
    step_lvl = np.zeros(nsteps, dtype=np.int64)
    dep_ptr = np.zeros(nsteps + 1, dtype=np.int64)
    dep_pos = np.empty(max(nnz - ndiag - nedge, 1) * 1, dtype=np.int64)
    ndep_cap = dep_pos.shape[0]
    ndep = 0
    lvl_pos = np.full(nnz, -1, dtype=np.int64)
    k = 0
    for p in range(nnz):
        if rows[p] == idx[p]:
            i = rows[p]
            step_pos[k] = p
            step_pos_t[k] = p
            step_src[k] = color[i] * n + i
            dep_ptr[k + 1] = ndep
            k += 1
    # per-vertex scratch for the current group
    # per-vertex scratch packed in one row (one cache line): deg, nbrsum, possum, seg_a, seg_b
    vd = np.zeros((n, 5), dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    ok = True
    ngroups = gstart.shape[0] - 1
    for g in range(ngroups):
        a = gstart[g]
        b = gstart[g + 1]
        # vertex segments (perm is sorted by row inside the group)
        t = a
        while t < b:
            i = rows[perm[t]]
            u = t
            while u < b and rows[perm[u]] == i:
                u += 1
            vd[i, 3] = t
            vd[i, 4] = u
            vd[i, 0] = u - t
            s1 = 0
            s2 = 0
            for z in range(t, u):
                s1 += idx[perm[z]]
                s2 += perm[z]
            vd[i, 1] = s1
            vd[i, 2] = s2
            t = u
        # leaves
        qh = 0
        qt = 0
        t = a
        while t < b:
            i = rows[perm[t]]
            if vd[i, 0] == 1:
                queue[qt] = i
                qt += 1
            t = vd[i, 4]
        while qh < qt:
            i = queue[qh]
            qh += 1
            if vd[i, 0] != 1:
                continue
            j = vd[i, 1]
            p = vd[i, 2]
            # H[i, j] = B[c(j)][i] - sum of H[i, x] over i's other edges of this group (solved)
            step_pos[k] = p
            step_pos_t[k] = tpos[p]
            step_src[k] = color[j] * n + i
            lv = 0
            for z in range(vd[i, 3], vd[i, 4]):
                d = perm[z]
                if d != p:
                    if ndep >= ndep_cap:
                        newcap = ndep_cap * 2 + 16
                        tmp = np.empty(newcap, dtype=np.int64)
                        tmp[:ndep] = dep_pos[:ndep]
                        dep_pos = tmp
                        ndep_cap = newcap
                    dep_pos[ndep] = d
                    ndep += 1
                    if lvl_pos[d] + 1 > lv:
                        lv = lvl_pos[d] + 1
            step_lvl[k] = lv
            lvl_pos[p] = lv
            lvl_pos[tpos[p]] = lv
            dep_ptr[k + 1] = ndep
            k += 1
            vd[i, 0] = 0
            vd[j, 0] -= 1
            vd[j, 1] -= i
            vd[j, 2] -= tpos[p]
            if vd[j, 0] == 1:
                queue[qt] = j
                qt += 1
        # anything left means a cycle
        t = a
        while t < b:
            i = rows[perm[t]]
            if vd[i, 0] != 0:
                ok = False
                vd[i, 0] = 0
            t = vd[i, 4]
    if k != nsteps:
        ok = False
    return step_pos[:k], step_pos_t[:k], step_src[:k], step_lvl[:k], dep_ptr[: k + 1], dep_pos[:ndep].copy(), ok


@njit(cache=True)
def group_by_pair(rows, idx, color, k):
    """Off-diagonal positions stably counting-sorted by color pair (so (row, col) order is
    kept inside a pair); returns (perm, gstart) over the non-empty pairs."""
    nnz = idx.shape[0]
    cnt = np.zeros(k * k + 1, dtype=np.int64)
    noff = 0
    for p in range(nnz):
        i = rows[p]
        j = idx[p]
        if i != j:
            a = color[i]
            b = color[j]
            key = a * k + b if a < b else b * k + a
            cnt[key + 1] += 1
            noff += 1
    for t in range(k * k):
        cnt[t + 1] += cnt[t]
    ng = 0
    for t in range(k * k):
        if cnt[t + 1] > cnt[t]:
            ng += 1
    gstart = np.empty(ng + 1, dtype=np.int64)
    g = 0
    for t in range(k * k):
        if cnt[t + 1] > cnt[t]:
            gstart[g] = cnt[t]
            g += 1
    gstart[ng] = noff
    nxt = cnt[:-1].copy()
    perm = np.empty(noff, dtype=np.int64)
    for p in range(nnz):
        i = rows[p]
        j = idx[p]
        if i != j:
            a = color[i]
            b = color[j]
            key = a * k + b if a < b else b * k + a
            perm[nxt[key]] = p
            nxt[key] += 1
    return perm, gstart


@njit(cache=True)
def sort_steps_by_level(step_pos, step_pos_t, step_src, step_lvl, dep_ptr, dep_pos):
    ns = step_pos.shape[0]
    nlev = 0
    for s in range(ns):
        if step_lvl[s] + 1 > nlev:
            nlev = step_lvl[s] + 1
    level_ptr = np.zeros(nlev + 1, dtype=np.int64)
    for s in range(ns):
        level_ptr[step_lvl[s] + 1] += 1
    for l in range(nlev):
        level_ptr[l + 1] += level_ptr[l]
    nxt = level_ptr[:-1].copy()
    where = np.empty(ns, dtype=np.int64)
    for s in range(ns):
        l = step_lvl[s]
        where[s] = nxt[l]
        nxt[l] += 1
    o_pos = np.empty(ns, dtype=np.int64)
    o_pos_t = np.empty(ns, dtype=np.int64)
    o_src = np.empty(ns, dtype=np.int64)
    o_ptr = np.zeros(ns + 1, dtype=np.int64)
    for s in range(ns):
        w = where[s]
        o_pos[w] = step_pos[s]
        o_pos_t[w] = step_pos_t[s]
        o_src[w] = step_src[s]
        o_ptr[w + 1] = dep_ptr[s + 1] - dep_ptr[s]
    for w in range(ns):
        o_ptr[w + 1] += o_ptr[w]
    nd = dep_pos.shape[0]
    o_dep = np.empty(nd, dtype=np.int64)
    o_step = np.empty(nd, dtype=np.int64)
    for s in range(ns):
        w = where[s]
        q = o_ptr[w]
        for d in range(dep_ptr[s], dep_ptr[s + 1]):
            o_dep[q] = dep_pos[d]
            o_step[q] = w
            q += 1
    return o_pos, o_pos_t, o_src, o_ptr, o_dep, o_step, level_ptr
