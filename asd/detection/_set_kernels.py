"""Numba kernels on canonical CSR set matrices (private; imported on the first set operation
that uses them). Every kernel reads only ``indices[:indptr[-1]]`` and returns new arrays."""

import numpy as np
from numba import njit


@njit(cache=True)
def union2(ap, aj, bp, bj):
    """Row-wise union of two canonical CSR structures with the same rows: ``(indptr, indices)``."""
    m = ap.shape[0] - 1
    cp = np.empty(m + 1, dtype=ap.dtype)
    cj = np.empty(ap[m] + bp[m], dtype=aj.dtype)
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
    cp = np.empty(k + 1, dtype=np.int64)
    cp[0] = 0
    total = 0
    for r in range(k):
        i = idx[r]
        if i >= rows:
            raise IndexError("take_rows: a row index is out of range")
        if i >= 0:
            total += indptr[i + 1] - indptr[i]
        cp[r + 1] = total
    cj = np.empty(total, dtype=indices.dtype)
    for r in range(k):
        i = idx[r]
        if i >= 0:
            p0 = indptr[i]
            w = indptr[i + 1] - p0
            base = cp[r]
            for t in range(w):
                cj[base + t] = indices[p0 + t]
    return cp, cj

