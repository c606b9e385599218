"""Structural verification of colorings - slow-but-obvious numpy/scipy oracles.

:func:`check` verifies a :class:`~asd.coloring.Coloring` against its problem's definition and
then round-trips random integer-valued matrices of the pattern through the compressed product
(computed with scipy from :meth:`Coloring.seeds`) and the decompression plan, which must
reproduce them exactly.
"""

from __future__ import annotations

import numpy as np

from asd.errors import ColoringError

__all__ = ["check", "structurally_orthogonal_columns"]


def _pair_counts(a, b):
    """For paired arrays, how many times each (a[k], b[k]) pair occurs (per element)."""
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    lo = int(b.min())
    key = a * (int(b.max()) - lo + 1) + (b - lo)
    _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    return cnt[inv.reshape(-1)]


def structurally_orthogonal_columns(pattern, colors) -> bool:
    """Oracle: columns of one color never share a row (dense loop over color groups)."""
    import scipy.sparse as sp

    A = sp.csc_array(sp.coo_array(pattern), dtype=np.int64)
    A.data[:] = 1
    colors = np.asarray(colors)
    for c in np.unique(colors[colors >= 0]):
        cols = np.nonzero(colors == c)[0]
        if (np.asarray(A[:, cols].sum(axis=1)).ravel() > 1).any():
            return False
    return True


def _fail(msg):
    raise ColoringError(f"invalid coloring: {msg}")


def _check_colors(colors, nv, ncolors, what, allow_neutral):
    colors = np.asarray(colors)
    if colors.shape != (nv,) or colors.dtype != np.int64:
        _fail(f"{what} colors must be an int64 array of shape ({nv},), got {colors.dtype} {colors.shape}")
    lo = -1 if allow_neutral else 0
    if colors.size and (colors.min() < lo or colors.max() >= max(ncolors, 1)):
        _fail(f"{what} colors outside [{lo}, {ncolors - 1}]")
    used = np.unique(colors[colors >= 0])
    if not np.array_equal(used, np.arange(ncolors)):
        _fail(f"{what} colors are not contiguous 0..{ncolors - 1} (used: {used[:20]}...)")


def _forest(i, j, ci, cj):
    """No two-colored cycle: every color pair's edge set is a forest (E = V - C)."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    if i.size == 0:
        return True
    lo = np.minimum(ci, cj)
    hi = np.maximum(ci, cj)
    k = int(max(ci.max(), cj.max())) + 1
    pair = lo * k + hi
    _, pair = np.unique(pair, return_inverse=True)
    stride = int(pair.max()) + 1
    nodes = np.concatenate([i.astype(np.int64) * stride + pair, j.astype(np.int64) * stride + pair])
    allnodes, inv = np.unique(nodes, return_inverse=True)
    inv = inv.reshape(-1)
    V = allnodes.shape[0]
    E = i.size
    ea, eb = inv[:E], inv[E:]
    G = sp.coo_array((np.ones(E), (ea, eb)), shape=(V, V))
    C, _ = connected_components(G, directed=False)
    return E == V - C


def check(pattern, result, *, rounds: int = 2, seed: int = 0) -> bool:
    """Verify ``result`` (a :class:`Coloring`) for ``pattern``; raise ColoringError if invalid.

    Definitions checked:

    * column / row: structurally orthogonal groups (no two same-colored columns/rows share a
      row/column);
    * star: a distance-1 coloring in which every stored entry is directly recoverable, i.e.
      ``(i, j)`` is the only entry of row ``i`` in color ``c(j)`` or the only entry of row ``j``
      in color ``c(i)`` (equivalently: no two-colored path on four vertices);
    * acyclic: a distance-1 coloring with no two-colored cycle (every two-colored subgraph is
      a forest);
    * bidirectional: every entry ``(i, j)`` is the only entry of row ``i`` with column color
      ``cc[j] >= 0``, or the only entry of column ``j`` with row color ``rc[i] >= 0``.

    Then the plan must reproduce ``rounds`` random integer-valued matrices exactly.
    Returns ``True``.
    """
    from asd.coloring import symmetric_pattern
    from asd.coloring.result import AcyclicColoring, BiColoring, ColumnColoring, RowColoring, StarColoring
    from asd.patterns import as_pattern

    problem = result.problem
    P = as_pattern(pattern)
    if P.shape != tuple(result.shape):
        _fail(f"pattern shape {P.shape} != coloring shape {result.shape}")
    symmetric = isinstance(result, (StarColoring, AcyclicColoring))
    if symmetric:
        P = symmetric_pattern(P)
    if not P.equals(result.pattern):
        _fail("the coloring's CSR pattern is not the (canonical) pattern given")
    m, n = P.shape
    rows, cols, idx = P.rows, P.indices, P.indices
    tpos = P.transpose_with_positions[1] if symmetric else None
    nc = result.ncolors

    if isinstance(result, (ColumnColoring, RowColoring)):
        colors = np.asarray(result.colors)
        nv = n if problem == "column" else m
        _check_colors(colors, nv, nc, problem, allow_neutral=True)
        vert = cols if problem == "column" else rows
        other = rows if problem == "column" else cols
        if (colors[vert] < 0).any():
            _fail(f"a {problem} with stored entries is neutral (color -1)")
        if (_pair_counts(other, colors[vert]) > 1).any():
            _fail(f"two {problem}s of the same color share a {'row' if problem == 'column' else 'column'}")
    elif symmetric:
        colors = np.asarray(result.colors)
        _check_colors(colors, n, nc, problem, allow_neutral=(problem == "star"))
        off = rows != cols
        ci, cj = colors[rows], colors[cols]
        if (ci[off] == cj[off]).any() and ((ci[off] == cj[off]) & (ci[off] >= 0)).any():
            _fail("two adjacent vertices share a color (not a distance-1 coloring)")
        if isinstance(result, StarColoring):
            cnt = _pair_counts(rows, cj)
            ok_i = (cj >= 0) & (cnt == 1)
            ok = ok_i | ok_i[tpos]
            if not ok.all():
                p = int(np.nonzero(~ok)[0][0])
                _fail(f"entry ({rows[p]}, {cols[p]}) is not directly recoverable (two-colored path on 4 vertices)")
        else:
            if (colors < 0).any():
                _fail("acyclic colorings cannot have neutral vertices")
            up = rows < cols
            if not _forest(rows[up], cols[up], ci[up], cj[up]):
                _fail("a two-colored cycle exists (some two-colored subgraph is not a forest)")
    elif isinstance(result, BiColoring):
        rc, cc = result.colors
        rc, cc = np.asarray(rc), np.asarray(cc)
        nr, ncc = result.nrow_colors, result.ncol_colors
        if nr + ncc != nc:
            _fail(f"ncolors {nc} != row colors {nr} + column colors {ncc}")
        _check_colors(rc, m, nr, "row", allow_neutral=True)
        _check_colors(cc, n, ncc, "column", allow_neutral=True)
        ccj, rci = cc[cols], rc[rows]
        cnt_c = _pair_counts(rows, ccj)
        cnt_r = _pair_counts(cols, rci)
        ok = ((ccj >= 0) & (cnt_c == 1)) | ((rci >= 0) & (cnt_r == 1))
        if not ok.all():
            p = int(np.nonzero(~ok)[0][0])
            _fail(f"entry ({rows[p]}, {cols[p]}) is recoverable neither from its column nor its row color")
    else:
        _fail(f"unknown problem {problem!r}")

    # numeric round trip through the plan
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        vals = rng.integers(1, 1000, size=idx.size).astype(np.float64)
        if symmetric:
            vals = vals + vals[tpos]
        B = result.compress(vals)
        got = result.decompress(B)
        if got.shape != vals.shape or not np.array_equal(got, vals):
            bad = int(np.nonzero(got != vals)[0][0]) if got.shape == vals.shape else -1
            _fail(f"decompression does not reproduce the matrix (first bad CSR position {bad})")
    return True
