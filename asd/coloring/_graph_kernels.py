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
