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
        p, pe, q, qe = ap[i], ap[i + 1], bp[i], bp[i + 1]
        while p < pe and q < qe:
            x, y = aj[p], bj[q]
            if x < y:
                cj[k] = x
                p += 1
            elif y < x:
                cj[k] = y
                q += 1
            else:
                cj[k] = x
                p += 1
                q += 1
            k += 1
        while p < pe:
            cj[k] = aj[p]
            p += 1
            k += 1
        while q < qe:
            cj[k] = bj[q]
            q += 1
            k += 1
        cp[i + 1] = k
    return cp, cj[:k]


@njit(cache=True)
def gather_rows(indptr, indices, idx):
    """Rows ``idx`` of a CSR structure (a negative index gives an empty row; one past the last
    row raises ``IndexError``): ``(indptr, indices)``, the indptr in int64."""
    k = idx.shape[0]
    rows = indptr.shape[0] - 1
    nnz = indices.shape[0]
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
