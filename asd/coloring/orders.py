"""Vertex orderings for greedy coloring.

Every ordering works on a graph described by integer arrays (see
:mod:`asd.coloring._order_kernels`): an explicit adjacency CSR (symmetric problems) or the
implicit distance-2 graph of one side of a bipartite graph (column / row problems).
Degrees are exact (distinct neighbours).  All orderings are deterministic; ``random`` is
seeded.
"""

from __future__ import annotations

import numpy as np

from asd.errors import ColoringError

ORDERS = (
    "natural",
    "largest_first",
    "smallest_last",
    "incidence_degree",
    "dynamic_largest_first",
    "random",
)
#: the orderings tried by ``order="best"`` (plus a few seeded random orders)
BEST_ORDERS = ("natural", "largest_first", "smallest_last", "incidence_degree", "dynamic_largest_first")

__all__ = ["ORDERS", "BEST_ORDERS", "vertex_order", "check_order"]


def check_order(order) -> str:
    if not isinstance(order, str) or (order not in ORDERS and order != "best"):
        raise ColoringError(
            f"unknown order {order!r}; choose one of {', '.join(repr(o) for o in ORDERS)} or 'best'"
        )
    return order


def vertex_order(order: str, nv: int, d2: bool, p1, i1, p2=None, i2=None, *, seed: int = 0) -> np.ndarray:
    """Permutation (int64) of ``0..nv-1`` in which greedy coloring visits the vertices."""
    check_order(order)
    if order == "natural":
        return np.arange(nv, dtype=np.int64)
    if order == "random":
        return np.random.default_rng(seed).permutation(nv).astype(np.int64)
    if nv == 0:
        return np.zeros(0, dtype=np.int64)
    from asd.coloring import _order_kernels as K

    if p2 is None:
        p2 = np.zeros(1, dtype=np.int64)
        i2 = np.zeros(0, dtype=np.int64)
    args = (nv, bool(d2), p1, i1, p2, i2)
    if order == "largest_first":
        deg = K.degrees(*args)
        return np.argsort(-deg, kind="stable").astype(np.int64)
    if order == "smallest_last":
        return K.smallest_last(*args)
    if order == "incidence_degree":
        return K.incidence_degree(*args)
    if order == "dynamic_largest_first":
        return K.dynamic_largest_first(*args)
    raise ColoringError(f"order {order!r} cannot be used here")
