"""Numba kernels: star coloring with two-colored star sets (private; imported lazily).

Symmetric adjacency CSR ``(ptr, idx)`` (diagonal entries are skipped), ``tpos`` the mirror
positions.  Follows the star-set idea of Gebremedhin, Tarafdar, Manne & Pothen (2007): every
edge with both ends colored belongs to exactly one two-colored star, whose hub is recorded
(``-1`` while the star is a single edge), so the decompression plan needs no search.

Two kernels, picked by :func:`star_color`: :func:`_star_light` scans the neighbourhoods of
the neighbours of every vertex (fastest on graphs without vertices of high degree), and
:func:`_star_tables` replaces those scans, for the vertices with a bitset slot
(``bslot[w] >= 0``, see :func:`asd.coloring.graphs.heavy_vertices`), by word-wise ORs of two
color bitsets (int64 words) into the bitset of the forbidden colors:

* ``nbr`` (row ``tab[b, :W]``): the colors of w's colored neighbours;
* ``leaf`` (row ``tab[b, W:2W]``): the colors of the hubs x of the stars that w is a leaf of
  (``hub[star(w, x)] == x``).

Both only grow: colors are final, an edge's star never changes, and a star's hub, once set, is
never changed (while w is a leaf of x's star, x is w's only neighbour of its color).  The
bitsets grow with the colors used (``W`` doubles) within a memory budget; over it, the
lowest-degree vertices drop theirs and are scanned again.  All edges from a vertex w to the
vertices of one color lie in one star, so any one of them names that star: heavy vertices
(``heavy[w] >= 0``, the first bitset slots) also keep one representative edge per color
(``rep``, valid where ``nbr`` has the color's bit).  The tables never change the result.
"""

import numpy as np
from numba import njit

try:  # count trailing zeros (llvm.cttz)
    from numba.cpython.unsafe.numbers import trailing_zeros as _ctz
except ImportError:  # pragma: no cover - older/newer numba without the intrinsic

    @njit(cache=True, inline="always")
    def _ctz(x):
        k = 0
        while (x & 1) == 0:
            x >>= 1
            k += 1
        return k

_ONE = np.int64(1)


@njit(cache=True, inline="always")
def _has(bits, c):
    return (bits[c >> 6] >> (c & 63)) & 1


@njit(cache=True, inline="always")
def _set(bits, c):
    bits[c >> 6] |= _ONE << (c & 63)


@njit(cache=True, inline="always")
def _first_zero(bits):
    """The smallest c whose bit is clear (the caller guarantees one within ``bits``)."""
    i = 0
    while bits[i] == -1:
        i += 1
    return (i << 6) + _ctz(~bits[i])


@njit(cache=True)
def _mark(v, w, ptr, idx, color, forbidden):
    """Forbid (mark with v) the colors of all colored neighbours of w (but v, w)."""
    for q in range(ptr[w], ptr[w + 1]):
        x = idx[q]
        if x != v and x != w:
            cx = color[x]
            if cx >= 0:
                forbidden[cx] = v


@njit(cache=True)
def _treat(v, w, ptr, idx, color, forb, bslot, tab, nw):
    """Forbid (set in the bitset forb) the colors of all colored neighbours of w (but v, w)."""
    b = bslot[w]
    if b >= 0:
        for i in range(nw):
            forb[i] |= tab[b, i]
        return
    for q in range(ptr[w], ptr[w + 1]):
        x = idx[q]
        if x != v and x != w:
            cx = color[x]
            if cx >= 0:
                _set(forb, cx)


@njit(cache=True)
def _grow(tab, W, bslot, bvert, nkeep, budget):
    """Double the words of the bitset table (``nbr`` words then ``leaf`` words per row); when
    that exceeds ``budget`` words, the vertices of the last slots (lowest degrees, never one of
    the first ``nkeep``) lose their bitsets and go back to scanning their neighbourhoods."""
    nb = tab.shape[0]
    W2 = 2 * W
    if nb * 2 * W2 > budget:
        nb2 = max(nkeep, budget // (2 * W2))
        for k in range(nb2, nb):
            bslot[bvert[k]] = -1
        nb = min(nb, nb2)
    out = np.zeros((nb, 2 * W2), dtype=np.int64)
    for k in range(nb):
        for i in range(W):
            out[k, i] = tab[k, i]
            out[k, W2 + i] = tab[k, W + i]
    return out


@njit(cache=True)
def _star_light(order, ptr, idx, tpos, neg):
    """:func:`star_color` without tables, every neighbourhood scanned.  Forbidden colors are
    marked with the vertex (never cleared)."""
    n = ptr.shape[0] - 1
    nnz = idx.shape[0]
    color = np.full(n, neg)
    forbidden = np.full(n + 1, neg)
    first_v = np.full(n + 1, neg)  # first_v[c] == v: v has seen a neighbour of color c
    first_w = np.full(n + 1, neg)
    treated = np.full(n, neg)
    new_v = np.full(n + 1, neg)  # stars created with hub v in this step, per color
    new_s = np.full(n + 1, neg)
    star = np.full(nnz, neg)
    hub = np.full(nnz // 2 + 1, neg)
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
                    _mark(v, q, ptr, idx, color, forbidden)
                    treated[q] = v
                if treated[w] != v:
                    _mark(v, w, ptr, idx, color, forbidden)
                    treated[w] = v
            else:
                first_v[cw] = v
                first_w[cw] = w
                # w is a leaf of a star whose hub is x: v must not take x's color
                for q in range(ptr[w], ptr[w + 1]):
                    x = idx[q]
                    if x == v or x == w:
                        continue
                    cx = color[x]
                    if cx >= 0 and forbidden[cx] != v:
                        if hub[star[q]] == x:
                            forbidden[cx] = v
        c = 0
        while forbidden[c] == v:
            c += 1
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
    return color.astype(np.int64), ncol, star.astype(np.int64), hub[:nstars].astype(np.int64)


def star_color(order, ptr, idx, tpos, heavy, nheavy, bslot, bvert, cap, budget, neg):
    """Greedy star coloring in ``order``: ``(colors, ncolors, star of every entry, hub of every
    star)``, int64 arrays.  The table layout (see :func:`asd.coloring.graphs.heavy_vertices`):
    ``cap`` exceeds every color the greedy algorithm can use; ``bslot``/``bvert`` number the
    vertices that keep color bitsets (by decreasing degree, the ``nheavy`` heavy vertices
    first), within ``budget`` words; ``heavy`` numbers those that also keep representative
    edges (see the module doc).  ``neg`` is ``-1`` of the integer type of the work arrays
    (int32 where the graph allows: half the memory traffic).  Without any table the scanning
    kernel runs (only the kernel used is compiled)."""
    if min(bvert.shape[0], max(nheavy, budget // 2)) == 0:
        return _star_light(order, ptr, idx, tpos, neg)
    return _star_tables(order, ptr, idx, tpos, heavy, nheavy, bslot, bvert, cap, budget, neg)


@njit(cache=True)
def _star_tables(order, ptr, idx, tpos, heavy, nheavy, bslot, bvert, cap, budget, neg):
    """:func:`star_color` with the tables (at least one vertex has them)."""
    n = ptr.shape[0] - 1
    nnz = idx.shape[0]
    W = 1  # words per bitset: nbr = tab[b, :W], leaf = tab[b, W:2W]
    nbits = min(bvert.shape[0], max(nheavy, budget // (2 * W)))
    bslot = bslot.copy()
    for k in range(nbits, bvert.shape[0]):
        bslot[bvert[k]] = -1
    tab = np.zeros((nbits, 2 * W), dtype=np.int64)
    color = np.full(n, neg)
    rep = np.empty((nheavy, cap), dtype=color.dtype)  # read only where nbr has the color's bit
    forb = np.zeros((n >> 6) + 2, dtype=np.int64)
    first_v = np.full(n + 1, neg)  # first_v[c] == v: v has seen a neighbour of color c
    first_w = np.full(n + 1, neg)
    treated = np.full(n, neg)
    new_v = np.full(n + 1, neg)  # stars created with hub v in this step, per color
    new_s = np.full(n + 1, neg)
    new_w = np.full(n + 1, neg)
    star = np.full(nnz, neg)
    hub = np.full(nnz // 2 + 1, neg)
    nstars = 0
    ncol = 0
    for t in range(order.shape[0]):
        v = order[t]
        nw = (ncol >> 6) + 1  # colors so far lie in words < nw; color ncol is free
        for i in range(nw):
            forb[i] = 0
        # 1. forbid the colors of the neighbours
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w != v:
                cw = color[w]
                if cw >= 0:
                    _set(forb, cw)
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
                    _treat(v, q, ptr, idx, color, forb, bslot, tab, nw)
                    treated[q] = v
                if treated[w] != v:
                    _treat(v, w, ptr, idx, color, forb, bslot, tab, nw)
                    treated[w] = v
            else:
                first_v[cw] = v
                first_w[cw] = w
                # w is a leaf of a star whose hub is x: v must not take x's color
                b = bslot[w]
                if b >= 0:
                    for i in range(nw):
                        forb[i] |= tab[b, W + i]
                else:
                    for q in range(ptr[w], ptr[w + 1]):
                        x = idx[q]
                        if x == v or x == w:
                            continue
                        cx = color[x]
                        if cx >= 0 and not _has(forb, cx):
                            if hub[star[q]] == x:
                                _set(forb, cx)
        c = _first_zero(forb)
        color[v] = c
        if c >= ncol:
            ncol = c + 1
            if nbits > 0 and ncol >= 64 * W:  # keep nw <= W
                tab = _grow(tab, W, bslot, bvert, nheavy, budget)
                W *= 2
                nbits = tab.shape[0]
        cword = c >> 6
        cbit = _ONE << (c & 63)
        bv = bslot[v]
        # 3. update the star sets with the new edges (v, w); v's color becomes a neighbour
        # color of its bitset neighbours
        for p in range(ptr[v], ptr[v + 1]):
            w = idx[p]
            if w == v:
                continue
            b = bslot[w]
            cw = color[w]
            if cw >= 0:
                found = -1
                if b < 0 or (tab[b, cword] & cbit) != 0:
                    h = heavy[w]
                    if h >= 0:
                        found = rep[h, c]
                    else:
                        for q in range(ptr[w], ptr[w + 1]):
                            x = idx[q]
                            if x != v and x != w and color[x] == c:
                                found = q
                                break
                if found >= 0:
                    # join the star of (w, x): its hub is w; x and v are its leaves
                    s = star[found]
                    hub[s] = w
                    bx = bslot[idx[found]]
                    if bx >= 0:
                        tab[bx, W + (cw >> 6)] |= _ONE << (cw & 63)
                    if bv >= 0:
                        tab[bv, W + (cw >> 6)] |= _ONE << (cw & 63)
                elif new_v[cw] == v:
                    # second neighbour of color cw: v is the hub of that star
                    s = new_s[cw]
                    hub[s] = v
                    b1 = bslot[new_w[cw]]
                    if b1 >= 0:
                        tab[b1, W + cword] |= cbit
                    if b >= 0:
                        tab[b, W + cword] |= cbit
                else:
                    s = nstars
                    nstars += 1
                    hub[s] = -1
                    new_v[cw] = v
                    new_s[cw] = s
                    new_w[cw] = w
                star[p] = s
                star[tpos[p]] = s
            if b >= 0 and (tab[b, cword] & cbit) == 0:
                tab[b, cword] |= cbit
                h = heavy[w]
                if h >= 0:
                    rep[h, c] = tpos[p]
    return color.astype(np.int64), ncol, star.astype(np.int64), hub[:nstars].astype(np.int64)


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


@njit(cache=True)
def read_from_column(rows, idx, star, hub, out):
    """For every stored entry ``(i, j)``: whether it is read at row ``i`` of ``j``'s color (the
    diagonal, an edge whose star's hub is ``j``, and one of an undetermined hub with ``j > i``)
    rather than at row ``j`` (into ``out``, an array numpy allocated: the coloring keeps it without
    a copy). Both ``(i, j)`` and ``(j, i)`` are so read from one value of one product: the result
    is exactly symmetric, also where the products are not (rounding, or a point where ``f`` is not
    twice differentiable)."""
    for p in range(idx.shape[0]):
        j = idx[p]
        i = rows[p]
        if i == j:
            out[p] = True
        else:
            h = hub[star[p]]
            out[p] = h == j or (h < 0 and j > i)
