"""Numba kernels on the CSR structure of a pattern (private; imported on first use)."""

import numpy as np
from numba import njit


@njit(cache=True)
def symmetric_mirror(indptr, indices):
    """``(mirror, True)`` for a square canonical CSR structure (sorted, distinct columns per row)
    that is symmetric, where ``mirror[p]`` is the position of the entry mirroring entry ``p``;
    ``(empty, False)`` where it is not symmetric, a column lies outside ``[0, n)`` or the row
    pointers decrease (never reading past the arrays).

    One pass over the rows in order: the entries ``(i, j)`` of a column ``j`` arrive with ``i``
    increasing, as row ``j``'s sorted columns list them, so a cursor per row finds every mirror;
    the structure is symmetric exactly when every cursor finds its entry and ends at its row's end.
    """
    n = indptr.shape[0] - 1
    nnz = indices.shape[0]
    mirror = np.empty(nnz, dtype=np.int64)
    if n < 0 or indptr[0] != 0 or indptr[n] != nnz:
        return mirror[:0], False
    cursor = np.empty(n, dtype=np.int64)
    for j in range(n):
        if indptr[j + 1] < indptr[j]:  # decreasing row pointers would lead past the indices
            return mirror[:0], False
        cursor[j] = indptr[j]
    for i in range(n):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            if j < 0 or j >= n:
                return mirror[:0], False
            q = cursor[j]
            if q >= indptr[j + 1] or indices[q] != i:
                return mirror[:0], False
            mirror[p] = q
            cursor[j] = q + 1
    for j in range(n):
        if cursor[j] != indptr[j + 1]:
            return mirror[:0], False
    return mirror, True


@njit(cache=True)
def csr_rows(indptr, rows):
    """Write the row of each entry of a CSR structure into ``rows`` (as long as its entries, from
    numpy: memory Numba allocates is faulted in page by page); row pointers that decrease or leave
    ``[0, len(rows)]``, or that do not cover every entry, raise."""
    nnz = rows.shape[0]
    m = indptr.shape[0] - 1
    if m < 0 or indptr[0] != 0 or indptr[m] != nnz:
        raise ValueError("row pointers must run from 0 to the number of entries")
    for i in range(m):
        s, e = indptr[i], indptr[i + 1]
        if e < s or e > nnz:
            raise ValueError("row pointers must not decrease")
        for p in range(s, e):
            rows[p] = i
    return rows
