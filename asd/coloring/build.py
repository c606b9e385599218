"""Build a coloring result from colors computed elsewhere - a published coloring, another
tool's output - so that :func:`asd.coloring.check` can verify it and asd can decompress with it."""

from __future__ import annotations

import numpy as np

from asd.coloring.check import _pair_counts
from asd.coloring.result import AcyclicColoring, BiColoring, Coloring, ColumnColoring, RowColoring, StarColoring
from asd.errors import ColoringError
from asd.patterns import as_pattern

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
    from asd.coloring import symmetric_pattern

    P = as_pattern(pattern)
    if problem in ("star", "acyclic"):
        P = symmetric_pattern(P)
    rows, idx = P.rows, P.indices
    if problem in ("column", "row"):
        c, k = _contig(colors)
        return (ColumnColoring if problem == "column" else RowColoring)(P, "given", c, k)
    if problem == "star":
        c, k = _contig(colors)
        cj = c[idx]
        return StarColoring(P, "given", c, k, (cj >= 0) & (_pair_counts(rows, cj) == 1))
    if problem == "acyclic":
        c, k = _contig(colors)
        res = AcyclicColoring(P, "given", c, k)
        res.plan  # noqa: B018  (builds the substitution plan: raises if the colors are not acyclic)
        return res
    if problem == "bidirectional":
        rc, nr = _contig(colors[0])
        cc, ncc = _contig(colors[1])
        ccj = cc[idx]
        by_col = (ccj >= 0) & (_pair_counts(rows, ccj) == 1)
        k = nr + ncc
        acolors = np.concatenate([np.where(cc >= 0, cc, k), np.where(rc >= 0, ncc + rc, k)])
        return BiColoring(P, "given", rc, cc, nr, ncc, by_col, acolors)
    raise ColoringError(f"unknown coloring problem {problem!r}")
