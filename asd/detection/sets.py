"""Index sets: boolean CSR matrices, one row per tensor element, one column per input.

Every operation here is a whole-tensor operation on ``scipy.sparse.csr_matrix`` objects with
``bool`` data, sorted indices and no duplicates. Row ``r`` of a set matrix lists the inputs that
element ``r`` of a (flattened, row-major) tensor may depend on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp

INDEX = np.int64


def _csr(indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    data = np.ones(len(indices), dtype=bool)
    out = sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)
    out.has_sorted_indices = True
    return out


def empty(rows: int, n: int) -> sp.csr_matrix:
    """``rows`` empty sets over ``n`` inputs."""
    return _csr(np.zeros(rows + 1, dtype=INDEX), np.zeros(0, dtype=INDEX), (rows, n))


def identity(n: int) -> sp.csr_matrix:
    """The sets of the input itself: element ``i`` depends on input ``i``."""
    return _csr(np.arange(n + 1, dtype=INDEX), np.arange(n, dtype=INDEX), (n, n))


def full_row(S: sp.csr_matrix) -> sp.csr_matrix:
    """The union of all rows of ``S`` as a single-row set matrix."""
    cols = np.unique(S.indices)
    return _csr(np.array([0, len(cols)], dtype=INDEX), cols.astype(INDEX), (1, S.shape[1]))


def take_rows(S: sp.csr_matrix, idx: np.ndarray) -> sp.csr_matrix:
    """Rows ``idx`` of ``S`` (any integer array, flattened); a negative index gives an empty row."""
    idx = np.asarray(idx, dtype=INDEX).ravel()
    indptr = S.indptr
    lens_all = np.diff(indptr)
    valid = idx >= 0
    safe = np.where(valid, idx, 0)
    lens = np.where(valid, lens_all[safe], 0)
    new_indptr = np.zeros(len(idx) + 1, dtype=INDEX)
    np.cumsum(lens, out=new_indptr[1:])
    total = int(new_indptr[-1])
    if total == 0:
        return empty(len(idx), S.shape[1])
    starts = indptr[safe].astype(INDEX)
    offsets = np.repeat(starts - new_indptr[:-1], lens)
    pos = offsets + np.arange(total, dtype=INDEX)
    return _csr(new_indptr, S.indices[pos].astype(INDEX, copy=False), (len(idx), S.shape[1]))


def union(mats: Sequence[sp.csr_matrix | None], rows: int, n: int) -> sp.csr_matrix:
    """Row-wise union of set matrices of equal shape; ``None`` entries are skipped."""
    present = [m for m in mats if m is not None and m.nnz > 0]
    if not present:
        return empty(rows, n)
    out = present[0]
    for m in present[1:]:
        out = out + m
    return _canonical(out)


def vstack(mats: Sequence[sp.csr_matrix]) -> sp.csr_matrix:
    """Stack set matrices vertically (rows of the first, then of the second, ...)."""
    if len(mats) == 1:
        return mats[0]
    n = mats[0].shape[1]
    indptrs, offset = [np.zeros(1, dtype=INDEX)], 0
    for m in mats:
        indptrs.append(m.indptr[1:].astype(INDEX) + offset)
        offset += m.nnz
    rows = sum(m.shape[0] for m in mats)
    return _csr(np.concatenate(indptrs), np.concatenate([m.indices for m in mats]).astype(INDEX), (rows, n))


def gather_union(S: sp.csr_matrix, rows: np.ndarray, cols: np.ndarray, nrows: int) -> sp.csr_matrix:
    """Output row ``rows[k]`` takes the union of input rows ``cols[k]`` over all ``k``.

    This is the product ``D @ S`` for the boolean dependency matrix ``D`` given in coordinates.
    Negative ``cols`` are ignored.
    """
    rows = np.asarray(rows, dtype=INDEX).ravel()
    cols = np.asarray(cols, dtype=INDEX).ravel()
    keep = cols >= 0
    if not keep.all():
        rows, cols = rows[keep], cols[keep]
    if S.nnz == 0 or len(rows) == 0:
        return empty(nrows, S.shape[1])
    D = sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=(nrows, S.shape[0]))
    return matmul(D, S)


def matmul(D: sp.spmatrix, S: sp.csr_matrix) -> sp.csr_matrix:
    """Boolean product ``D @ S``: row ``i`` is the union of the rows of ``S`` selected by ``D[i]``."""
    if S.nnz == 0 or D.nnz == 0:
        return empty(D.shape[0], S.shape[1])
    D = D.tocsr()
    if D.dtype != np.bool_:
        D = D.astype(bool)
    return _canonical(D @ S)


def _canonical(M: sp.spmatrix) -> sp.csr_matrix:
    M = M.tocsr()
    if M.dtype != np.bool_:
        M = M.astype(bool)
    if not M.has_sorted_indices:
        M.sort_indices()
    if M.indptr.dtype != INDEX:
        return _csr(M.indptr.astype(INDEX), M.indices.astype(INDEX), M.shape)
    return M
