"""Numba CPU kernel of substitution decompression (private; imported lazily)."""

import numpy as np
from numba import njit


@njit(cache=True)
def _substitute(flat, step_pos, step_pos_t, step_src, dep_ptr, dep_pos, out):
    for k in range(step_pos.shape[0]):
        v = flat[step_src[k]]
        for d in range(dep_ptr[k], dep_ptr[k + 1]):
            v -= out[dep_pos[d]]
        out[step_pos[k]] = v
        out[step_pos_t[k]] = v
    return out


def substitute_numba(flat, step_pos, step_pos_t, step_src, dep_ptr, dep_pos, nnz):
    """Values in CSR order from the flat compressed buffer (steps in a valid order)."""
    flat = np.ascontiguousarray(flat)
    out = np.zeros(nnz, dtype=flat.dtype)
    return _substitute(flat, step_pos, step_pos_t, step_src, dep_ptr, dep_pos, out)
