"""Numba kernels on CSR set matrices (private; imported on the first set operation that uses
them). Every kernel reads only ``indices[:indptr[-1]]`` and returns new arrays. The kernels have
no bounds checks of their own, so each checks the row pointers it follows first: a malformed
matrix (a user rule's, built by hand) raises instead of reading or writing past an array."""

import numpy as np
from numba import njit

_MALFORMED = "a set matrix has malformed row pointers (decreasing, negative, or past its indices)"


@njit(cache=True)
def _check_pointers(indptr, nnz_max):
    """Raise unless ``indptr`` is nondecreasing from 0 or more to at most ``nnz_max`` (one pass
    without early exits, so it vectorizes)."""
    m = indptr.shape[0] - 1
    bad = indptr[0] < 0 or indptr[m] > nnz_max
    for i in range(m):
        bad |= indptr[i + 1] < indptr[i]
    if bad:
        raise ValueError(_MALFORMED)


@njit(cache=True, inline="always")
def _merge(x, p, pe, y, q, qe, out, k):
    """Merge the sorted runs ``x[p:pe]`` and ``y[q:qe]`` into ``out`` from position ``k`` (an
    entry in both once); returns the position after the last entry written."""
    while p < pe and q < qe:
        u, v = x[p], y[q]
        if u < v:
            out[k] = u
            p += 1
        elif v < u:
            out[k] = v
            q += 1
        else:
            out[k] = u
            p += 1
            q += 1
        k += 1
    while p < pe:
        out[k] = x[p]
        p += 1
        k += 1
    while q < qe:
        out[k] = y[q]
        q += 1
        k += 1
    return k


@njit(cache=True)
def union2(ap, aj, bp, bj):
    """Row-wise union of two CSR structures with the same rows and sorted rows: ``(indptr, indices)``
    (an entry that both hold is kept once; one stored twice in the same operand stays twice, as the
    set algebra allows: patterns are summed at the end of a trace)."""
    m = ap.shape[0] - 1
    if bp.shape[0] - 1 != m:
        raise ValueError("union of set matrices with different numbers of rows")
    _check_pointers(ap, aj.shape[0])
    _check_pointers(bp, bj.shape[0])
    cp = np.empty(m + 1, dtype=ap.dtype)
    cj = np.empty(ap[m] - ap[0] + bp[m] - bp[0], dtype=aj.dtype)
    k = 0
    cp[0] = 0
    for i in range(m):
        k = _merge(aj, ap[i], ap[i + 1], bj, bp[i], bp[i + 1], cj, k)
        cp[i + 1] = k
    return cp, cj[:k]


@njit(cache=True)
def consecutive(idx, s):
    """Whether ``idx`` is ``s, s + 1, ..., s + len(idx) - 1``."""
    for t in range(idx.shape[0]):
        if idx[t] != s + t:
            return False
    return True


@njit(cache=True)
def gather_rows(indptr, indices, idx):
    """Rows ``idx`` of a CSR structure (a negative index gives an empty row; one past the last
    row raises ``IndexError``): ``(indptr, indices)``, the indptr in int64. Where every row taken
    is a row of the structure holding one entry within ``indices`` (the elements of an input moved
    by ``roll``, ``flip``, a permutation), each output row is that entry, read in one pass that
    checks as it goes (in the number of rows taken)."""
    k = idx.shape[0]
    rows = indptr.shape[0] - 1
    nnz = indices.shape[0]
    unit = True
    cj = np.empty(k, dtype=indices.dtype)
    for r in range(k):
        i = idx[r]
        if i < 0 or i >= rows:
            unit = False
            break
        s = indptr[i]
        if s < 0 or s >= nnz or indptr[i + 1] != s + 1:  # (s < nnz: s + 1 cannot wrap)
            unit = False
            break
        cj[r] = indices[s]
    if unit:
        return np.arange(k + 1).astype(np.int64), cj
    cp = np.empty(k + 1, dtype=np.int64)
    cp[0] = 0
    total = 0
    for r in range(k):
        i = idx[r]
        if i >= rows:
            raise IndexError("take_rows: a row index is out of range")
        if i >= 0:
            s, e = indptr[i], indptr[i + 1]
            if s < 0 or e < s or e > nnz:
                raise ValueError(_MALFORMED)
            total += e - s
        cp[r + 1] = total
    cj = np.empty(total, dtype=indices.dtype)
    for r in range(k):
        i = idx[r]
        if i >= 0:
            p0 = indptr[i]
            base = cp[r]
            for t in range(indptr[i + 1] - p0):
                cj[base + t] = indices[p0 + t]
    return cp, cj


@njit(cache=True)
def _sort8(b):
    """Sort the 8 entries of ``b`` in place with a fixed network (Batcher's odd-even merge sort):
    no data-dependent branches, where an insertion sort mispredicts on most entries."""
    x, y = b[0], b[1]
    b[0], b[1] = min(x, y), max(x, y)
    x, y = b[2], b[3]
    b[2], b[3] = min(x, y), max(x, y)
    x, y = b[4], b[5]
    b[4], b[5] = min(x, y), max(x, y)
    x, y = b[6], b[7]
    b[6], b[7] = min(x, y), max(x, y)
    x, y = b[0], b[2]
    b[0], b[2] = min(x, y), max(x, y)
    x, y = b[1], b[3]
    b[1], b[3] = min(x, y), max(x, y)
    x, y = b[4], b[6]
    b[4], b[6] = min(x, y), max(x, y)
    x, y = b[5], b[7]
    b[5], b[7] = min(x, y), max(x, y)
    x, y = b[1], b[2]
    b[1], b[2] = min(x, y), max(x, y)
    x, y = b[5], b[6]
    b[5], b[6] = min(x, y), max(x, y)
    x, y = b[0], b[4]
    b[0], b[4] = min(x, y), max(x, y)
    x, y = b[1], b[5]
    b[1], b[5] = min(x, y), max(x, y)
    x, y = b[2], b[6]
    b[2], b[6] = min(x, y), max(x, y)
    x, y = b[3], b[7]
    b[3], b[7] = min(x, y), max(x, y)
    x, y = b[2], b[4]
    b[2], b[4] = min(x, y), max(x, y)
    x, y = b[3], b[5]
    b[3], b[5] = min(x, y), max(x, y)
    x, y = b[1], b[2]
    b[1], b[2] = min(x, y), max(x, y)
    x, y = b[3], b[4]
    b[3], b[4] = min(x, y), max(x, y)
    x, y = b[5], b[6]
    b[5], b[6] = min(x, y), max(x, y)


@njit(cache=True)
def union_k(P, J):
    """Row-wise union of ``k`` CSR structures with the same rows: row ``i`` of structure ``j``
    is ``J[P[j, i]:P[j, i + 1]]`` (sorted). Returns ``(indptr, indices)`` with each row sorted and
    every column once (also one stored twice in a single structure). A row of at most 8 entries in
    all is sorted by a network; a longer one is merged part by part, as a chain of pairwise unions
    would, without their intermediate matrices."""
    k = P.shape[0]
    m = P.shape[1] - 1
    for j in range(k):
        _check_pointers(P[j], J.shape[0])
    total = 0
    for j in range(k):
        total += P[j, m] - P[j, 0]
    cp = np.empty(m + 1, dtype=np.int64)
    cj = np.empty(total, dtype=J.dtype)
    pad = np.iinfo(J.dtype).max
    s8 = np.empty(8, dtype=J.dtype)
    a = np.empty(64, dtype=J.dtype)
    b = np.empty(64, dtype=J.dtype)
    pos = 0
    cp[0] = 0
    for i in range(m):
        start = pos
        for j in range(k):
            for p in range(P[j, i], P[j, i + 1]):
                cj[pos] = J[p]
                pos += 1
        r = pos - start
        if r <= 1:
            cp[i + 1] = pos
            continue
        if r <= 8:
            for q in range(8):
                s8[q] = cj[start + q] if q < r else pad
            _sort8(s8)
            na = r
            merged = s8
        else:
            if r > a.shape[0]:
                a = np.empty(2 * r, dtype=J.dtype)
                b = np.empty(2 * r, dtype=J.dtype)
            na = 0
            for j in range(k):
                q, qe = P[j, i], P[j, i + 1]
                if q == qe:
                    continue
                if na == 0:
                    for t in range(q, qe):
                        a[na] = J[t]
                        na += 1
                    continue
                na = _merge(a, 0, na, J, q, qe, b, 0)
                a, b = b, a
            merged = a
        # sorted: drop adjacent repeats (a column in several parts, or twice in one)
        pos = start
        last = -1
        for q in range(na):
            v = merged[q]
            cj[pos] = v
            pos += v != last
            last = v
        cp[i + 1] = pos
    return cp, cj[:pos]


@njit(cache=True)
def gram(indptr, indices, n):
    """The boolean ``G^T G`` of a CSR structure ``G`` with ``n`` columns: row ``i`` is the union of
    the rows of ``G`` that hold column ``i``. Returns ``(indptr, indices)``, the indptr in int64,
    each row sorted with every column once."""
    m = indptr.shape[0] - 1
    _check_pointers(indptr, indices.shape[0])
    # the rows holding each column (a transpose), and a bound on each output row: the total length
    # of those rows (far above the row where many rows repeat one block of columns)
    start = np.zeros(n + 1, dtype=np.int64)
    bound = np.zeros(n, dtype=np.int64)
    for r in range(m):
        s, e = indptr[r], indptr[r + 1]
        for p in range(s, e):
            j = indices[p]
            if j < 0 or j >= n:
                raise ValueError("a set matrix holds a column outside its shape")
            start[j + 1] += 1
            bound[j] += e - s
    total = 0
    for j in range(n):
        start[j + 1] += start[j]
        bound[j] = min(bound[j], n)
        total += bound[j]
    holders = np.empty(start[n], dtype=np.int64)
    nxt = start[:-1].copy()
    for r in range(m):
        for p in range(indptr[r], indptr[r + 1]):
            j = indices[p]
            holders[nxt[j]] = r
            nxt[j] += 1
    cp = np.empty(n + 1, dtype=np.int64)
    # room for the bound where it is within a few times the input, else grown as needed (by
    # doubling, never past what the bound still allows)
    cj = np.empty(min(total, 16 * (indptr[m] - indptr[0] + n) + (1 << 20)), dtype=indices.dtype)
    seen = np.full(n, -1, dtype=np.int64)
    cp[0] = 0
    pos = 0
    for i in range(n):
        first = pos
        ordered = True
        if pos + bound[i] > cj.shape[0]:
            bigger = np.empty(min(pos + total, max(2 * cj.shape[0], pos + bound[i])), dtype=indices.dtype)
            bigger[:pos] = cj[:pos]
            cj = bigger
        total -= bound[i]
        for t in range(start[i], start[i + 1]):
            r = holders[t]
            s, e = indptr[r], indptr[r + 1]
            for p in range(s, e):
                j = indices[p]
                if seen[j] != i:
                    seen[j] = i
                    if pos > first and cj[pos - 1] > j:
                        ordered = False
                    cj[pos] = j
                    pos += 1
        if not ordered:
            if pos - first <= 16:
                for q in range(first + 1, pos):
                    v = cj[q]
                    w = q
                    while w > first and cj[w - 1] > v:
                        cj[w] = cj[w - 1]
                        w -= 1
                    cj[w] = v
            else:
                cj[first:pos].sort()
        cp[i + 1] = pos
    if 2 * pos <= cj.shape[0]:  # most of the room unused: keep none of it
        return cp, cj[:pos].copy()
    return cp, cj[:pos]
