"""Numba kernels on CSR structures (private; imported lazily)."""

import numpy as np
from numba import njit


@njit(cache=True)
def transpose(ptr, idx, ncols):
    """Counting-sort transpose: (tptr, tidx, perm) with perm[q] = source position of the
    transposed entry q; rows stay sorted within each column."""
    nnz = idx.shape[0]
    m = ptr.shape[0] - 1
    tptr = np.zeros(ncols + 1, dtype=np.int64)
    for p in range(nnz):
        tptr[idx[p] + 1] += 1
    for j in range(ncols):
        tptr[j + 1] += tptr[j]
    nxt = tptr[:-1].copy()
    tidx = np.empty(nnz, dtype=np.int64)
    perm = np.empty(nnz, dtype=np.int64)
    for i in range(m):
        for p in range(ptr[i], ptr[i + 1]):
            j = idx[p]
            q = nxt[j]
            nxt[j] += 1
            tidx[q] = i
            perm[q] = p
    return tptr, tidx, perm


@njit(cache=True)
def union(ptr, idx, tptr, tidx):
    """Row-wise union of two canonical CSR structures with the same number of rows."""
    m = ptr.shape[0] - 1
    out_ptr = np.zeros(m + 1, dtype=np.int64)
    out = np.empty(idx.shape[0] + tidx.shape[0], dtype=np.int64)
    k = 0
    for i in range(m):
        a, ae = ptr[i], ptr[i + 1]
        b, be = tptr[i], tptr[i + 1]
        while a < ae or b < be:
            if b >= be or (a < ae and idx[a] < tidx[b]):
                out[k] = idx[a]
                a += 1
            elif a >= ae or tidx[b] < idx[a]:
                out[k] = tidx[b]
                b += 1
            else:
                out[k] = idx[a]
                a += 1
                b += 1
            k += 1
        out_ptr[i + 1] = k
    return out_ptr, out[:k].copy()


@njit(cache=True, inline="always")
def first_fit(forbidden, v):
    """The smallest color ``c`` with ``forbidden[c] != v`` (colors forbidden for vertex ``v`` are
    marked with ``v``, so the array never needs clearing between vertices)."""
    c = 0
    while forbidden[c] == v:
        c += 1
    return c
