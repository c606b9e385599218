"""Everything the JAX backend reads from a coloring result and its decompression plan.

This is the one module written against the coloring result types (:mod:`asd.coloring.result`)
and the plan types (:mod:`asd.decompression.plans`); the rest of :mod:`asd.jax` sees only the
typed blocks below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asd.decompression.plans import DirectPlan, SubstitutionPlan


@dataclass(frozen=True)
class _Seeds:
    seeds: np.ndarray


class Forward(_Seeds):
    """Seed rows ``S`` (``(k, n)``): products ``J @ S[c]`` (JVPs, or HVPs ``H @ S[c]``)."""


class Reverse(_Seeds):
    """Seed rows ``S`` (``(k, m)``): products ``S[c]^T J`` (VJPs)."""


@dataclass(frozen=True)
class Gather:
    """Direct decompression: ``values = compressed.ravel()[index]``."""

    index: np.ndarray


#: level-sorted substitution steps: the plan sorted by level (its arrays are read-only int64 already)
Substitution = SubstitutionPlan


def seed_blocks(coloring) -> list:
    """The products to compute, in the order of the flat batch-first compressed buffer."""
    from asd.coloring.result import ColumnSeeds

    return [(Forward if isinstance(b, ColumnSeeds) else Reverse)(np.asarray(b.matrix, dtype=np.float64))
            for b in coloring.seed_blocks()]


def decompression(coloring) -> Gather | Substitution:
    """How the stored values (CSR order of the coloring's pattern) come from the compressed buffer."""
    plan = coloring.plan
    if isinstance(plan, DirectPlan):
        return Gather(np.asarray(plan.gather, dtype=np.int64))
    return plan.leveled


def structure(coloring) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """``(indptr, indices, shape)`` of the pattern whose values the plan fills."""
    return np.asarray(coloring.indptr), np.asarray(coloring.indices), tuple(coloring.shape)


def ncolors(coloring) -> int:
    return int(coloring.ncolors)
