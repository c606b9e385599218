"""Everything the JAX backend reads from a coloring result and its decompression plan.

This is the one module written against the coloring result types (:mod:`asd.coloring.result`)
and the plan types (:mod:`asd.decompression.plans`); the rest of :mod:`asd.jax` sees only the
typed blocks below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Forward:
    """Seed rows ``S`` (``(k, n)``): products ``J @ S[c]`` (JVPs, or HVPs ``H @ S[c]``)."""

    seeds: np.ndarray


@dataclass(frozen=True)
class Reverse:
    """Seed rows ``S`` (``(k, m)``): products ``S[c]^T J`` (VJPs)."""

    seeds: np.ndarray


@dataclass(frozen=True)
class Gather:
    """Direct decompression: ``values = compressed.ravel()[index]``."""

    index: np.ndarray


@dataclass(frozen=True)
class Substitution:
    """Level-sorted substitution steps (see :mod:`asd.decompression.plans`)."""

    step_pos: np.ndarray
    step_pos_t: np.ndarray
    step_src: np.ndarray
    dep_ptr: np.ndarray
    dep_pos: np.ndarray
    dep_step: np.ndarray
    level_ptr: np.ndarray
    nnz: int

    @property
    def nlevels(self) -> int:
        return len(self.level_ptr) - 1


def seed_blocks(coloring) -> list:
    """The products to compute, in the order of the flat batch-first compressed buffer."""
    from asd.coloring.result import ColumnSeeds

    return [(Forward if isinstance(b, ColumnSeeds) else Reverse)(np.asarray(b.matrix, dtype=np.float64))
            for b in coloring.seed_blocks()]


def decompression(coloring) -> Gather | Substitution:
    """How the stored values (CSR order of the coloring's pattern) come from the compressed buffer."""
    from asd.decompression.plans import DirectPlan

    plan = coloring.plan
    if isinstance(plan, DirectPlan):
        return Gather(np.asarray(plan.gather, dtype=np.int64))
    return Substitution(*(np.asarray(getattr(plan, name), dtype=np.int64) for name in
                          ("step_pos", "step_pos_t", "step_src", "dep_ptr", "dep_pos", "dep_step", "level_ptr")),
                        nnz=int(plan.nnz))


def structure(coloring) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """``(indptr, indices, shape)`` of the pattern whose values the plan fills."""
    return np.asarray(coloring.indptr), np.asarray(coloring.indices), tuple(coloring.shape)


def ncolors(coloring) -> int:
    return int(coloring.ncolors)
