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
    key = rows * k + colors[cols]
    key.sort()
    return not bool((key[1:] == key[:-1]).any())


def _widths(P: SparsityPattern, limit: int = 3) -> list[int]:
    """Candidate grid widths of a flat vertex index: frequent index differences within rows."""
    n = P.shape[1]
    rng = np.random.default_rng(0)
    sel = rng.choice(P.shape[0], size=min(P.shape[0], 512), replace=False)
    diffs = []
    for r in sel:
        c = P.indices[P.indptr[r]:P.indptr[r + 1]]
        if 1 < c.size <= 64:
            d = np.abs(c[:, None] - c[None, :]).ravel()
            diffs.append(d[d > 2])
    if not diffs:
        return []
    values, counts = np.unique(np.concatenate(diffs), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return sorted(int(w) for w in values[order][:limit] if n % int(w) == 0 and int(w) < n)


def _grids(P: SparsityPattern, shape: tuple) -> list[tuple]:
    shape = tuple(int(s) for s in shape if int(s) > 1)
    n = P.shape[1]
    if len(shape) >= 2:
        return [shape]
    ws = _widths(P)
    grids = [(n // w, w) for w in ws]
    for w1, w2 in itertools.combinations(ws, 2):
        if w2 % w1 == 0:
            grids.append((n // w2, w2 // w1, w1))
    return grids


def _sample_entries(P: SparsityPattern, nrows: int):
    """Columns of a random sample of rows as a padded ``(R, D)`` array (padding ``-1``)."""
    rng = np.random.default_rng(0)
    sel = rng.choice(P.shape[0], size=min(P.shape[0], nrows), replace=False)
    deg = np.diff(P.indptr)[sel]
    D = int(deg.max()) if deg.size else 0
    out = np.full((sel.size, D), -1, dtype=np.int64)
    for i, r in enumerate(sel):
        c = P.indices[P.indptr[r]:P.indptr[r + 1]]
        out[i, :c.size] = c
    return out


def lattice_colors(P: SparsityPattern, shape: tuple, lower: int, upper: int) -> tuple[np.ndarray, int] | None:
    """Colors of the columns of ``P`` with fewer than ``upper`` colors from a lattice coloring,
    or ``None``. ``shape`` is the shape the columns come from (flat: detected)."""
    n = P.shape[1]
    if n == 0 or upper <= max(lower, 1):
        return None
    sample = _sample_entries(P, 64)
    pad = sample < 0
    tried = 0
    for grid in _grids(P, shape):
        coords = np.stack(np.unravel_index(np.arange(n), grid)).astype(np.int64)  # (d, n)
        d = coords.shape[0]
        sc = coords[:, np.maximum(sample, 0)]  # (d, R, D)
        for k in range(max(lower, 2), upper):
            coefs = np.array([a + (1,) for a in itertools.product(range(k), repeat=d - 1)], dtype=np.int64)
            tried += coefs.shape[0]
            if tried > MAX_CANDIDATES:
                return None
            # every candidate on the sampled rows at once: no repeated color within a row
            col = np.einsum("cd,drk->crk", coefs, sc) % k
            col = np.where(pad[None], k + np.arange(pad.shape[1])[None, None, :], col)
            col.sort(axis=2)
            ok = ~(col[:, :, 1:] == col[:, :, :-1]).any(axis=(1, 2))
            for c in np.nonzero(ok)[0]:
                colors = (coefs[c] @ coords) % k
                if _valid(P.rows, P.indices, colors, k):
                    used = np.unique(colors)
                    remap = np.full(k, -1, dtype=np.int64)
                    remap[used] = np.arange(used.size)
                    return remap[colors], int(used.size)
    return None
