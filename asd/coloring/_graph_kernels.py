"""Numba kernels on CSR structures (private; imported lazily)."""

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def first_fit(forbidden, v):
    """The smallest color ``c`` with ``forbidden[c] != v`` (colors forbidden for vertex ``v`` are
    marked with ``v``, so the array never needs clearing between vertices)."""
    c = 0
    while forbidden[c] == v:
        c += 1
    return c


@njit(cache=True)
def edge_between_branch_points(indptr, indices):
    """Whether some edge ``(i, j)``, ``i != j``, of the symmetric CSR structure joins two vertices
    that have another neighbour each (at least two neighbours besides themselves)."""
    n = indptr.shape[0] - 1
    degree = np.zeros(n, dtype=np.int64)
    for i in range(n):
        for p in range(indptr[i], indptr[i + 1]):
            if indices[p] != i:
                degree[i] += 1
    for i in range(n):
        if degree[i] >= 2:
            for p in range(indptr[i], indptr[i + 1]):
                j = indices[p]
                if j != i and degree[j] >= 2:
                    return True
    return False
