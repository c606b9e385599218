"""Numba gather of the compiled products' stored entries (private; imported lazily)."""

from numba import njit


@njit(cache=True, boundscheck=False)
def take_into(flat, index, out):
    """``out[p] = flat[index[p]]`` (``index`` checked in range by the caller)."""
    for p in range(index.shape[0]):
        out[p] = flat[index[p]]
