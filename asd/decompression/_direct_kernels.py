"""Numba kernel of the direct plan of a star coloring (private; imported lazily)."""

from numba import njit


@njit(cache=True)
def star_gather(rows, idx, colors, from_column, n, out):
    """``colors[j] * n + i`` where the entry ``(i, j)`` is read from its column's product, else
    ``colors[i] * n + j``: the flat position of every stored entry in the compressed buffer (into
    ``out``, an array numpy allocated: the plan keeps it without a copy)."""
    for p in range(idx.shape[0]):
        i = rows[p]
        j = idx[p]
        if from_column[p]:
            out[p] = colors[j] * n + i
        else:
            out[p] = colors[i] * n + j
