"""Numba CSR kernels (CPU). Imported lazily by :mod:`asd.linalg._kernels`, compiled on first use.

Kernels take only numpy arrays and write into preallocated outputs (allocating wrapper, in-place
core). ``X``/``Y`` are C-contiguous ``(rows, k)`` arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit


# The product kernels take unsigned index arrays (uint64 views of the int64 indices): Numba then
# skips its negative-index wrap-around check, which halves the time of an SpMV.
_fast = dict(cache=True, nogil=True, fastmath=True)


@njit(**_fast)
def spmv(crow, col, vals, x, y):
    for i in range(crow.shape[0] - 1):
        s = 0.0
        for p in range(crow[i], crow[i + 1]):
            s += vals[p] * x[col[p]]
        y[i] = s


@njit(**_fast)
def spmv_t(crow, col, vals, x, y):
    y[:] = 0.0
    for i in range(crow.shape[0] - 1):
        xi = x[i]
        for p in range(crow[i], crow[i + 1]):
            y[col[p]] += vals[p] * xi


@njit(**_fast)
def spmm(crow, col, vals, X, Y):
    k = X.shape[1]
    for i in range(crow.shape[0] - 1):
        for c in range(k):
            Y[i, c] = 0.0
        for p in range(crow[i], crow[i + 1]):
            v = vals[p]
            j = col[p]
            for c in range(k):
                Y[i, c] += v * X[j, c]


@njit(**_fast)
def spmm_t(crow, col, vals, X, Y):
    k = X.shape[1]
    Y[:, :] = 0.0
    for i in range(crow.shape[0] - 1):
        for p in range(crow[i], crow[i + 1]):
            v = vals[p]
            j = col[p]
            for c in range(k):
                Y[j, c] += v * X[i, c]


@njit(**_fast)
def sddmm_vec(crow, col, u, v, out):
    for i in range(crow.shape[0] - 1):
        ui = u[i]
        for p in range(crow[i], crow[i + 1]):
            out[p] = ui * v[col[p]]


@njit(**_fast)
def sddmm(crow, col, U, V, out):
    k = U.shape[1]
    for i in range(crow.shape[0] - 1):
        for p in range(crow[i], crow[i + 1]):
            j = col[p]
            s = 0.0
            for c in range(k):
                s += U[i, c] * V[j, c]
            out[p] = s


@njit(cache=True, nogil=True)
def trsv(crow, col, vals, X, lower, trans, unit):
    """Solve op(T) X = X in place for triangular CSR T; returns -1 or the row of a zero pivot."""
    n = crow.shape[0] - 1
    k = X.shape[1]
    if not trans:
        for t in range(n):
            i = t if lower else n - 1 - t
            d = 1.0 if unit else 0.0               # a missing diagonal entry is a zero pivot
            for p in range(crow[i], crow[i + 1]):
                j = col[p]
                if j == i:
                    if not unit:
                        d = vals[p]
                else:
                    v = vals[p]
                    for c in range(k):
                        X[i, c] -= v * X[j, c]
            if d == 0.0:
                return i
            if not unit:
                for c in range(k):
                    X[i, c] /= d
    else:
        # op(T) = T^T: rows of T are columns of T^T; sweep in the opposite order
        for t in range(n):
            i = n - 1 - t if lower else t
            d = 1.0
            if not unit:
                d = 0.0
                for p in range(crow[i], crow[i + 1]):
                    if col[p] == i:
                        d = vals[p]
                if d == 0.0:
                    return i
                for c in range(k):
                    X[i, c] /= d
            for p in range(crow[i], crow[i + 1]):
                j = col[p]
                if j != i:
                    v = vals[p]
                    for c in range(k):
                        X[j, c] -= v * X[i, c]
    return -1


@njit(cache=True, nogil=True)
def product_triples(a_crow, a_col, b_crow, b_col, n_cols_b):
    """Symbolic SpGEMM: C's CSR pattern and, per scalar product, (index in A, in B, in C)."""
    n = a_crow.shape[0] - 1
    marker = np.full(n_cols_b, -1, np.int64)
    # first pass: count
    c_crow = np.zeros(n + 1, np.int64)
    ntrip = 0
    for i in range(n):
        cnt = 0
        for pa in range(a_crow[i], a_crow[i + 1]):
            j = a_col[pa]
            for pb in range(b_crow[j], b_crow[j + 1]):
                l = b_col[pb]
                ntrip += 1
                if marker[l] != i:
                    marker[l] = i
                    cnt += 1
        c_crow[i + 1] = c_crow[i] + cnt
    nnz = c_crow[n]
    c_col = np.empty(nnz, np.int64)
    ka = np.empty(ntrip, np.int64)
    kb = np.empty(ntrip, np.int64)
    kc = np.empty(ntrip, np.int64)
    marker[:] = -1
    pos = np.empty(n_cols_b, np.int64)
    t = 0
    for i in range(n):
        start = c_crow[i]
        cnt = 0
        for pa in range(a_crow[i], a_crow[i + 1]):
            j = a_col[pa]
            for pb in range(b_crow[j], b_crow[j + 1]):
                l = b_col[pb]
                if marker[l] != i:
                    marker[l] = i
                    c_col[start + cnt] = l
                    cnt += 1
        # sort this row's columns, then record positions
        c_col[start:start + cnt] = np.sort(c_col[start:start + cnt])
        for q in range(start, start + cnt):
            pos[c_col[q]] = q
        for pa in range(a_crow[i], a_crow[i + 1]):
            j = a_col[pa]
            for pb in range(b_crow[j], b_crow[j + 1]):
                ka[t] = pa
                kb[t] = pb
                kc[t] = pos[b_col[pb]]
                t += 1
    return c_crow, c_col, ka, kb, kc


@njit(**_fast)
def union_add(ia, va, alpha, ib, vb, beta, out):
    out[:] = 0.0
    for p in range(ia.shape[0]):
        out[ia[p]] = alpha * va[p]
    for p in range(ib.shape[0]):
        out[ib[p]] += beta * vb[p]


@njit(**_fast)
def trsv_vec(crow, col, vals, x, lower, unit):
    """``T x = x`` in place for one right-hand side (row-oriented substitution)."""
    n = crow.shape[0] - 1
    for t in range(n):
        i = t if lower else n - 1 - t
        s = x[i]
        d = 1.0 if unit else 0.0
        for p in range(crow[i], crow[i + 1]):
            j = col[p]
            if j == i:
                if not unit:
                    d = vals[p]
            else:
                s -= vals[p] * x[j]
        if d == 0.0:
            return i
        x[i] = s / d
    return -1


@njit(**_fast)
def trsv_vec_t(crow, col, vals, x, lower, unit):
    """``T^T x = x`` in place for one right-hand side (column-oriented sweep over T's rows)."""
    n = crow.shape[0] - 1
    for t in range(n):
        i = n - 1 - t if lower else t
        d = 1.0
        if not unit:
            d = 0.0
            for p in range(crow[i], crow[i + 1]):
                if col[p] == i:
                    d = vals[p]
            if d == 0.0:
                return i
        xi = x[i] / d
        x[i] = xi
        for p in range(crow[i], crow[i + 1]):
            j = col[p]
            if j != i:
                x[j] -= vals[p] * xi
    return -1


@njit(cache=True, nogil=True)
def equal(a, b):
    """``a == b`` elementwise for equal-length 1-D arrays, stopping at the first difference."""
    for i in range(a.shape[0]):
        if a[i] != b[i]:
            return False
    return True
