"""Build a coloring result from colors computed elsewhere - a published coloring, another
tool's output - so that :func:`asd.coloring.check` can verify it and asd can decompress with it."""

from __future__ import annotations

import numpy as np

from asd.coloring.check import _pair_counts, check
from asd.coloring.result import AcyclicColoring, BiColoring, Coloring, ColumnColoring, RowColoring, StarColoring
from asd.errors import ColoringError
from asd.patterns import as_pattern

__all__ = ["from_colors"]


def _contig(c, size: int, what: str):
    a = np.asarray(c)
    if a.ndim != 1 or a.shape[0] != size:
        raise ColoringError(f"{what} must be a 1-D array of {size} integer colors, got shape {a.shape}")
    if a.dtype.kind not in "iu" and not (a.dtype.kind == "b" and a.size == 0):
        if a.dtype.kind != "f" or not np.array_equal(a, np.round(a)):
            raise ColoringError(f"{what} must be integers (any labels, negative for none), got dtype {a.dtype}")
    if a.size and (a.dtype.kind in "uf") and float(np.max(a)) >= 2.0 ** 53:
        raise ColoringError(f"{what} must be labels below 2**53, got {np.max(a)!r}: renumber them")
    c = a.astype(np.int64)
    used = np.unique(c[c >= 0])
    remap = np.full(int(used.max()) + 1 if used.size else 1, -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    return np.where(c >= 0, remap[np.maximum(c, 0)], -1).astype(np.int64), int(used.size)


def from_colors(pattern, problem, colors) -> Coloring:
    """Coloring of ``pattern`` for ``problem`` with the given colors (any integer labels;
    renumbered to ``0..k-1`` in increasing label order, negative = neutral; for
    ``"bidirectional"`` a pair (row colors, column colors)). The result is verified with
    :func:`asd.coloring.check`: raises ColoringError when the colors do not admit a decompression
    plan, or are not one integer per row or column."""
    from asd.coloring import symmetric_pattern

    P = as_pattern(pattern)
    if problem in ("star", "acyclic"):
        P = symmetric_pattern(P)
    rows, idx = P.rows, P.indices
    m, n = P.shape
    if problem in ("column", "row"):
        c, k = _contig(colors, n if problem == "column" else m, f"{problem} colors")
        res = (ColumnColoring if problem == "column" else RowColoring)(P, "given", c, k)
    elif problem == "star":
        c, k = _contig(colors, n, "star colors")
        cj = c[idx]
        res = StarColoring(P, "given", c, k, (cj >= 0) & (_pair_counts(rows, cj) == 1))
    elif problem == "acyclic":
        c, k = _contig(colors, n, "acyclic colors")
        res = AcyclicColoring(P, "given", c, k)
        res.plan  # noqa: B018  (builds the substitution plan: raises if the colors are not acyclic)
    elif problem == "bidirectional":
        if not isinstance(colors, (tuple, list, np.ndarray)) or len(colors) != 2:
            raise ColoringError("bidirectional colors must be a pair (row colors, column colors)")
        rc, nr = _contig(colors[0], m, "bidirectional row colors")
        cc, ncc = _contig(colors[1], n, "bidirectional column colors")
        ccj = cc[idx]
        by_col = (ccj >= 0) & (_pair_counts(rows, ccj) == 1)
        k = nr + ncc
        acolors = np.concatenate([np.where(cc >= 0, cc, k), np.where(rc >= 0, ncc + rc, k)])
        res = BiColoring(P, "given", rc, cc, nr, ncc, by_col, acolors)
    else:
        raise ColoringError(f"unknown coloring problem {problem!r}")
    check(P, res)  # the definitions, and exact decompression of random matrices
    return res
