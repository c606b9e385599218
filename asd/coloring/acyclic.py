"""Symmetric acyclic coloring (entries recovered by substitution)."""

from __future__ import annotations

import numpy as np

from asd.coloring.graphs import acyclic_tables
from asd.coloring.orders import vertex_order
from asd.coloring.result import AcyclicColoring

__all__ = ["color_acyclic"]


def color_acyclic(pattern, order, seed=0, perm=None) -> AcyclicColoring:
    """Acyclic coloring of the symmetric ``pattern`` (both triangles stored)."""
    n = pattern.shape[0]
    ptr, idx = pattern.indptr, pattern.indices
    if perm is None:
        perm = vertex_order(order, n, False, ptr, idx, seed=seed)
    if n:
        from asd.coloring._acyclic_kernels import acyclic_color

        colors, ncolors = acyclic_color(perm, ptr, idx, pattern.transpose_with_positions[1], *acyclic_tables(ptr))
        ncolors = int(ncolors)
    else:
        colors, ncolors = np.zeros(0, dtype=np.int64), 0
    return AcyclicColoring(pattern, order, colors, ncolors)
