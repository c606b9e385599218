"""Lattice colorings of stencil patterns: colors that are a linear function of grid coordinates.

Greedy orders color the Jacobian of a 2-D 5-point stencil with 7 colors; the optimum, 5, is the
lattice coloring ``(i + 2 j) mod 5``. When the vertices of a pattern (the columns of a column
coloring, the rows of a row coloring) lie on a regular grid - the shape of ``x`` (or ``f(x)``), or
a grid width read off the pattern's index differences when ``x`` is flat - colorings
``c = (a . coords) mod k`` are tried for ``k`` from the lower bound up, first on a sample of
rows, then checked exactly on all of them. The search is bounded (:data:`MAX_CANDIDATES` coefficient
vectors), so its cost stays a small multiple of the pattern size.
"""

from __future__ import annotations

import itertools

import numpy as np

from asd.patterns import SparsityPattern

__all__ = ["lattice_colors"]

#: coefficient vectors tried at most, over all k
MAX_CANDIDATES = 400


def _valid(rows: np.ndarray, cols: np.ndarray, colors: np.ndarray, k: int) -> bool:
    """No row holds two vertices of the same color."""
    counts = np.bincount(rows * k + colors[cols], minlength=(int(rows[-1]) + 1) * k if rows.size else 0)
    return not bool((counts > 1).any())


def _widths(sample: np.ndarray, n: int, limit: int = 3) -> list[int]:
    """Candidate grid widths of a flat vertex index: frequent index differences within the sampled
    rows (``sample``: padded ``(R, D)`` columns, ``-1`` = padding)."""
    ok = sample >= 0
    d = np.abs(sample[:, :, None] - sample[:, None, :])
    d = d[ok[:, :, None] & ok[:, None, :] & (d > 2)]
    if d.size == 0:
        return []
    values, counts = np.unique(d, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return sorted(int(w) for w in values[order][:limit] if n % int(w) == 0 and int(w) < n)


def _grids(sample: np.ndarray, n: int, shape: tuple) -> list[tuple]:
    shape = tuple(int(s) for s in shape if int(s) > 1)
    if len(shape) >= 2:
        return [shape]
    ws = _widths(sample, n)
    grids = [(n // w, w) for w in ws]
    for w1, w2 in itertools.combinations(ws, 2):
        if w2 % w1 == 0:
            grids.append((n // w2, w2 // w1, w1))
    return grids


def _sample_entries(P: SparsityPattern, nrows: int):
    """Columns of a random sample of rows as a padded ``(R, D)`` array (padding ``-1``)."""
    rng = np.random.default_rng(0)
    sel = rng.choice(P.shape[0], size=min(P.shape[0], nrows), replace=False)
    start, deg = P.indptr[sel], np.diff(P.indptr)[sel]
    D = int(deg.max()) if deg.size else 0
    pos = start[:, None] + np.arange(D)[None, :]
    valid = np.arange(D)[None, :] < deg[:, None]
    return np.where(valid, P.indices[np.minimum(pos, max(P.nnz - 1, 0))], -1)


def lattice_colors(P: SparsityPattern, shape: tuple, lower: int, upper: int) -> tuple[np.ndarray, int] | None:
    """Colors of the columns of ``P`` with fewer than ``upper`` colors from a lattice coloring,
    or ``None``. ``shape`` is the shape the columns come from (flat: detected)."""
    n = P.shape[1]
    if n == 0 or upper <= max(lower, 1):
        return None
    sample = _sample_entries(P, 64)
    if sample.shape[1] > 64:  # rows this dense are no stencil
        return None
    pad = sample < 0
    tried = 0
    for grid in _grids(sample, n, shape):
        coords = np.stack(np.unravel_index(np.arange(n), grid)).astype(np.int64)  # (d, n)
        d = coords.shape[0]
        sc = coords[:, np.maximum(sample, 0)]  # (d, R, D)
        for k in range(max(lower, 2), upper):
            coefs = np.array([a + (1,) for a in itertools.product(range(k), repeat=d - 1)], dtype=np.int64)
            tried += coefs.shape[0]
            if tried > MAX_CANDIDATES:
                return None
            # every candidate on a few sampled rows at once (no repeated color within a row), the
            # survivors on all sampled rows, then on the whole pattern
            ok = np.arange(coefs.shape[0])
            for rows in (slice(0, 8), slice(None)):
                col = np.einsum("cd,drk->crk", coefs[ok], sc[:, rows]) % k
                col = np.where(pad[None, rows], k + np.arange(pad.shape[1])[None, None, :], col)
                col.sort(axis=2)
                ok = ok[~(col[:, :, 1:] == col[:, :, :-1]).any(axis=(1, 2))]
            for c in ok:
                colors = (coefs[c] @ coords) % k
                if _valid(P.rows, P.indices, colors, k):
                    used = np.unique(colors)
                    remap = np.full(k, -1, dtype=np.int64)
                    remap[used] = np.arange(used.size)
                    return remap[colors], int(used.size)
    return None
