"""Build a :class:`Coloring` (with its plan) from colors computed elsewhere - a published
coloring, another tool's output - so that :func:`asd.coloring.check` can verify it and asd
can decompress with it."""

from __future__ import annotations

import numpy as np

from asd.coloring.check import _pair_counts
from asd.coloring.graphs import canonical_csr, csr_rows, symmetrize
from asd.coloring.result import Coloring, DecompressionPlan
from asd.errors import ColoringError

__all__ = ["from_colors"]


def _contig(c):
    c = np.asarray(c, dtype=np.int64)
    used = np.unique(c[c >= 0])
    remap = np.full(int(used.max()) + 1 if used.size else 1, -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    return np.where(c >= 0, remap[np.maximum(c, 0)], -1).astype(np.int64), int(used.size)


def from_colors(pattern, problem, colors) -> Coloring:
    """Coloring of ``pattern`` for ``problem`` with the given colors (any integer labels;
    renumbered to ``0..k-1`` in increasing label order, negative = neutral).  Raises
    ColoringError when the colors do not admit a decompression plan."""
    ptr, idx, shape = canonical_csr(pattern)
    m, n = shape
    if problem in ("star", "acyclic"):
        if m != n:
            raise ColoringError(f"problem={problem!r} needs a square pattern, got {shape}")
        ptr, idx = symmetrize(ptr, idx, shape)
    rows = csr_rows(ptr)
    if problem in ("column", "row"):
        from asd.coloring.greedy import partial_plan

        c, k = _contig(colors)
        plan = partial_plan(problem, c, k, ptr, idx, shape)
        return Coloring(problem, "given", shape, c, k, ptr, idx, plan)
    if problem == "star":
        c, k = _contig(colors)
        cj = c[idx]
        ok_i = (cj >= 0) & (_pair_counts(rows, cj) == 1)
        gather = np.where(ok_i, cj * n + rows, c[rows] * n + idx).astype(np.int64)
        plan = DecompressionPlan("direct", (k, n), len(idx), gather=gather)
        return Coloring("star", "given", shape, c, k, ptr, idx, plan)
    if problem == "acyclic":
        from asd.coloring.acyclic import substitution_plan

        c, k = _contig(colors)
        plan = substitution_plan(ptr, idx, c, k)
        return Coloring("acyclic", "given", shape, c, k, ptr, idx, plan)
    if problem == "bidirectional":
        rc, nr = _contig(colors[0])
        cc, ncc = _contig(colors[1])
        ccj = cc[idx]
        by_col = (ccj >= 0) & (_pair_counts(rows, ccj) == 1)
        gather = np.where(by_col, ccj * m + rows, ncc * m + rc[rows] * n + idx).astype(np.int64)
        plan = DecompressionPlan("direct", ((ncc, m), (nr, n)), len(idx), gather=gather)
        return Coloring("bidirectional", "given", shape, (rc, cc), ncc + nr, ptr, idx, plan)
    raise ColoringError(f"unknown coloring problem {problem!r}")
