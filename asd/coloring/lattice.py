"""Lattice colorings of stencil patterns: colors that are a linear function of grid coordinates.

Greedy orders color the Jacobian of a 2-D 5-point stencil with 7 colors; the optimum, 5, is the
lattice coloring ``(i + 2 j) mod 5``. When the vertices of a pattern (the columns of a column
coloring, the rows of a row coloring) lie on a regular grid - the shape of ``x`` (or ``f(x)``), or
a grid width read off the pattern's index differences when ``x`` is flat - colorings
``c = (a . coords) mod k`` are tried for ``k`` from the lower bound up, first on a sample of
rows (every ``k`` of a grid in one batch), then, fewest colors first, checked exactly on all of them
(by a Numba kernel where Numba is loaded already). The search is bounded (:data:`MAX_CANDIDATES`
coefficient vectors), so its cost stays a small multiple of the pattern size.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from asd.patterns import SparsityPattern

__all__ = ["lattice_colors"]

#: coefficient vectors tried at most, over all k
MAX_CANDIDATES = 400


def _valid(rows: np.ndarray, cols: np.ndarray, colors: np.ndarray, k: int) -> bool:
    """No row holds two vertices of the same color."""
    counts = np.bincount(rows * k + colors[cols], minlength=(int(rows[-1]) + 1) * k if rows.size else 0)
    return not bool((counts > 1).any())


def _distinct_in_rows(indptr, indices, colors, k):
    """:func:`_valid` on the CSR structure, compiled with Numba (:func:`_valid_pattern`)."""
    seen = np.full(k, -1, dtype=np.int64)
    for r in range(indptr.shape[0] - 1):
        for a in range(indptr[r], indptr[r + 1]):
            c = colors[indices[a]]
            if seen[c] == r:
                return False
            seen[c] = r
    return True


_KERNEL: list = []


def _valid_pattern(P: SparsityPattern, colors: np.ndarray, k: int) -> bool:
    """No row of ``P`` holds two vertices of the same color: the Numba kernel where Numba is loaded
    already (the greedy coloring loads it beyond small patterns), else :func:`_valid`."""
    if "numba" not in sys.modules:
        return _valid(P.rows, P.indices, colors, k)
    if not _KERNEL:
        from numba import njit

        _KERNEL.append(njit(cache=True)(_distinct_in_rows))
    return bool(_KERNEL[0](P.indptr, P.indices, colors, k))


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


def _candidates(ks: range, d: int, budget: int):
    """Coefficient vectors ``a + (1,)`` for each ``k`` in ``ks`` (in order), as ``(K, A)`` arrays
    (``K[c]`` the modulus of candidate ``c``), stopping before the first ``k`` whose candidates
    would exceed ``budget``; and whether that happened."""
    K, A = [], []
    for k in ks:
        count = k ** (d - 1)
        if count > budget:
            return K, A, True
        budget -= count
        A.append(np.array([a + (1,) for a in itertools.product(range(k), repeat=d - 1)], dtype=np.int64))
        K.append(np.full(count, k, dtype=np.int64))
    return K, A, False


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
    budget = MAX_CANDIDATES
    for grid in _grids(sample, n, shape):
        d = len(grid)
        K, A, exhausted = _candidates(range(max(lower, 2), upper), d, budget)
        if K:
            budget -= sum(len(k) for k in K)
            K, A = np.concatenate(K), np.concatenate(A)
            sc = np.stack(np.unravel_index(np.maximum(sample, 0), grid)).astype(np.int64)  # (d, R, D)
            # every candidate (all k at once) on a few sampled rows (no repeated color within a
            # row; padding gets colors of its own, k and up), the survivors on all sampled rows,
            # then, in order (fewest colors first), on the whole pattern
            ok = np.arange(K.shape[0])
            for rows in (slice(0, 8), slice(None)):
                col = np.einsum("cd,drk->crk", A[ok], sc[:, rows]) % K[ok, None, None]
                col = np.where(pad[None, rows], K[ok, None, None] + np.arange(pad.shape[1])[None, None, :], col)
                col.sort(axis=2)
                ok = ok[~(col[:, :, 1:] == col[:, :, :-1]).any(axis=(1, 2))]
            coords = np.stack(np.unravel_index(np.arange(n), grid)).astype(np.int64) if ok.size else None  # (d, n)
            for c in ok:
                k = int(K[c])
                colors = (A[c] @ coords) % k
                if _valid_pattern(P, colors, k):
                    used = np.flatnonzero(np.bincount(colors, minlength=k))
                    remap = np.full(k, -1, dtype=np.int64)
                    remap[used] = np.arange(used.size)
                    return remap[colors], int(used.size)
        if exhausted:
            return None
    return None
