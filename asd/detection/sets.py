"""Index sets: boolean CSR matrices, one row per tensor element, one column per input.

Every operation here is a whole-tensor operation on ``scipy.sparse.csr_matrix`` objects with
``bool`` data, sorted indices and no duplicates. Row ``r`` of a set matrix lists the inputs that
element ``r`` of a (flattened, row-major) tensor may depend on.

Set matrices are never modified in place: an operation may return one of its arguments, or a
matrix sharing index arrays with one, where the result has the same rows.

A trace makes thousands of these small matrices, so they are built without scipy's validation
(which costs tens of microseconds per matrix) when scipy is one whose ``csr_matrix`` this module
recognizes (checked once, against the validated constructor; otherwise every matrix takes the
validated path). Indices are ``int32`` where they fit, as scipy itself chooses. Merging set
matrices (two, or three and more in one pass) and gathering rows are Numba kernels
(:mod:`asd.detection._set_kernels`, loaded at the first use). A :class:`PendingUnion` is a union
not merged yet: the first-order tracer keeps one in an elementwise op's output storage until its
sets are read.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import InputError

INDEX = np.int64
_INT32_MAX = np.iinfo(np.int32).max


def _index_dtype(shape: tuple[int, int], nnz: int):
    return np.int32 if max(shape[0], shape[1], nnz) <= _INT32_MAX else np.int64


def _csr_validated(indptr, indices, shape) -> sp.csr_matrix:
    out = sp.csr_matrix((np.ones(len(indices), dtype=bool), indices, indptr), shape=shape, copy=False)
    out.has_sorted_indices = True
    return out


# The attributes scipy's validated constructor leaves on a set matrix, where :func:`_csr` can set
# them itself; ``None`` where this scipy does something else (then every matrix is validated).
_KNOWN_FIELDS = frozenset({"_shape", "maxprint", "indices", "indptr", "data", "_has_sorted_indices"})


def _template() -> dict | None:
    try:
        t = _csr_validated(np.array([0, 1, 1], dtype=np.int32), np.array([1], dtype=np.int32), (2, 3))
        if set(vars(t)) != _KNOWN_FIELDS or t._shape != (2, 3) or not t.has_sorted_indices:
            return None
        fields = {k: v for k, v in vars(t).items() if k not in ("_shape", "indices", "indptr", "data")}
        fast = sp.csr_matrix.__new__(sp.csr_matrix)
        fast.__dict__.update(fields, _shape=(2, 3), indices=t.indices, indptr=t.indptr, data=t.data)
        fast.check_format(full_check=True)
        probe = (fast + fast).toarray(), (fast @ fast.T).toarray(), fast[1:].toarray(), fast.tocsc().toarray()
        want = (t + t).toarray(), (t @ t.T).toarray(), t[1:].toarray(), t.tocsc().toarray()
        if not (all(np.array_equal(p, w) for p, w in zip(probe, want)) and fast.nnz == 1
                and fast.has_canonical_format and np.array_equal(fast.toarray(), t.toarray())):
            return None
        return fields
    except Exception:  # noqa: BLE001  (another scipy: validate every matrix)
        return None


_FIELDS = _template()


def _csr(indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """A set matrix from canonical CSR arrays (sorted, distinct columns per row), not copied where
    they have the index dtype already."""
    shape = (int(shape[0]), int(shape[1]))
    dt = _index_dtype(shape, len(indices))
    indptr = np.asarray(indptr).astype(dt, copy=False)
    indices = np.asarray(indices).astype(dt, copy=False)
    # set matrices share their arrays (views, reused structures): a write into one would change
    # others, so any attempt raises instead
    indptr.flags.writeable = False
    indices.flags.writeable = False
    if _FIELDS is None:
        return _csr_validated(indptr, indices, shape)
    out = sp.csr_matrix.__new__(sp.csr_matrix)
    out.__dict__.update(_FIELDS, _shape=shape, indices=indices, indptr=indptr,
                        data=np.ones(len(indices), dtype=bool))
    return out


_KERNELS: list = []


def _kernels():
    """:mod:`asd.detection._set_kernels`, imported at the first use (it compiles or loads Numba
    code)."""
    if not _KERNELS:
        from . import _set_kernels

        _KERNELS.append(_set_kernels)
    return _KERNELS[0]


def empty(rows: int, n: int) -> sp.csr_matrix:
    """``rows`` empty sets over ``n`` inputs."""
    return _csr(np.zeros(rows + 1, dtype=INDEX), np.zeros(0, dtype=INDEX), (rows, n))


def identity(n: int) -> sp.csr_matrix:
    """The sets of the input itself: element ``i`` depends on input ``i``."""
    return _csr(np.arange(n + 1, dtype=INDEX), np.arange(n, dtype=INDEX), (n, n))


def full_row(S: sp.csr_matrix) -> sp.csr_matrix:
    """The union of all rows of ``S`` as a single-row set matrix."""
    n = S.shape[1]
    present = S.indices[:int(S.indptr[-1])]
    if n <= 4 * len(present) + 4096:  # a mask over the inputs: linear, where sorting is not
        mask = np.zeros(n, dtype=bool)
        mask[present] = True
        cols = np.flatnonzero(mask)
    else:
        cols = np.unique(present)
    return _csr(np.array([0, len(cols)], dtype=INDEX), cols, (1, n))


def _range_start(idx: np.ndarray, rows: int) -> int | None:
    """``s`` where ``idx`` is ``s, s + 1, ..., s + len(idx) - 1`` within ``[0, rows)``, else ``None``."""
    k = len(idx)
    s = int(idx[0])
    if s < 0 or int(idx[-1]) != s + k - 1 or s + k > rows:
        return None
    if k > 4096:  # without a compared copy (a tenth of a 10^6 Hessian's trace): a kernel
        return s if _kernels().consecutive(idx, s) else None
    if k > 2 and not np.array_equal(idx, np.arange(s, s + k, dtype=idx.dtype)):
        return None
    return s


def take_rows(S: sp.csr_matrix, idx: np.ndarray) -> sp.csr_matrix:
    """Rows ``idx`` of ``S`` (any integer array, flattened); a negative index gives an empty row."""
    idx = np.asarray(idx).ravel()
    rows, n = S.shape
    k = len(idx)
    if idx.dtype.kind not in "iu":
        idx = idx.astype(INDEX)
    elif k and idx.dtype.kind == "u" and int(idx.max()) >= rows:  # would wrap to a negative index
        raise IndexError("take_rows: a row index is out of range")
    if k == 0 or S.nnz == 0:
        if k and int(idx.max()) >= rows:
            raise IndexError("take_rows: a row index is out of range")
        return empty(k, n)
    indptr, indices = S.indptr, S.indices
    s = _range_start(idx, rows)
    if s is not None:  # a block of consecutive rows: views of S's arrays
        if s == 0 and k == rows:
            return S
        ip = indptr[s:s + k + 1]
        lo = int(ip[0])
        return _csr(ip - lo if lo else ip, indices[lo:int(ip[-1])], (k, n))
    cp, cj = _kernels().gather_rows(indptr, indices, idx.astype(INDEX, copy=False))
    return _csr(cp, cj, (k, n))


def _same_structure(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    if a is b or (a.indptr is b.indptr and a.indices is b.indices):
        return True
    return (a.nnz == b.nnz and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices))


def _check_shape(m: sp.csr_matrix, shape: tuple[int, int]) -> None:
    if m.shape != shape:
        raise ValueError(f"union of set matrices of shapes {m.shape} and {shape}: a rule returned sets of the "
                         "wrong shape")


def _union2(a: sp.csr_matrix, b: sp.csr_matrix) -> sp.csr_matrix:
    _check_shape(b, a.shape)
    if _same_structure(a, b):
        return a
    canonical = (a.has_sorted_indices and b.has_sorted_indices and a.dtype == np.bool_ and b.dtype == np.bool_
                 and a.format == "csr" and b.format == "csr")
    if not canonical:
        return _canonical(a + b)
    dt = _index_dtype(a.shape, a.nnz + b.nnz)
    cp, cj = _kernels().union2(a.indptr.astype(dt, copy=False), a.indices.astype(dt, copy=False),
                    b.indptr.astype(dt, copy=False), b.indices.astype(dt, copy=False))
    if 2 * len(cj) <= a.nnz + b.nnz:  # most entries were shared: keep no spare room
        cj = cj.copy()
    return _csr(cp, cj, a.shape)


def _is_canonical(a: sp.csr_matrix) -> bool:
    return a.format == "csr" and a.dtype == np.bool_ and a.has_sorted_indices


def _distinct(mats: Sequence[sp.csr_matrix]) -> list[sp.csr_matrix]:
    """``mats`` without repeats of one structure (the same matrix, or one sharing its arrays)."""
    out: list = []
    seen: set = set()
    for m in mats:
        key = (id(m.indptr), id(m.indices))
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def _union_k(mats: list[sp.csr_matrix]) -> sp.csr_matrix:
    """Row-wise union of several canonical set matrices of one shape, in one pass."""
    shape = mats[0].shape
    P = np.empty((len(mats), shape[0] + 1), dtype=np.int64)
    segments, offset = [], 0
    for j, m in enumerate(mats):
        lo, hi = int(m.indptr[0]), int(m.indptr[-1])
        if lo < 0 or hi > len(m.indices):  # the kernel checks the pointers within each segment
            raise ValueError("a set matrix has malformed row pointers (decreasing, negative, or past its indices)")
        np.add(m.indptr, offset - lo, out=P[j], casting="unsafe")
        segments.append(m.indices[lo:hi])
        offset += hi - lo
    dt = _index_dtype(shape, offset)
    cp, cj = _kernels().union_k(P, np.concatenate(segments).astype(dt, copy=False))
    if 2 * len(cj) <= offset:  # most entries were shared: keep no spare room
        cj = cj.copy()
    return _csr(cp, cj, shape)


#: fewest parts merged in one pass (fewer: one pairwise merge after another)
ONE_PASS_PARTS = 5
#: most entries per row, on average over all parts together, for a merge in one pass
ONE_PASS_ROW = 8


def _one_pass(mats: list[sp.csr_matrix], rows: int) -> bool:
    """Whether to merge ``mats`` in one pass (:func:`_union_k`): many parts with short rows, where
    the pairwise merges would each pay their call and intermediate matrix for a few entries per
    row. With few parts, or long rows, the pairwise merges are faster: they keep the rows merged
    so far deduplicated, and copy no inputs."""
    if len(mats) < ONE_PASS_PARTS:
        return False
    total = 0
    for m in mats:
        if not _is_canonical(m):
            return False
        total += m.nnz
    return total <= ONE_PASS_ROW * max(rows, 1)


def union(mats: Sequence[sp.csr_matrix | None], rows: int, n: int) -> sp.csr_matrix:
    """Row-wise union of set matrices of equal shape; ``None`` entries are skipped."""
    present = _distinct([m for m in mats if m is not None and m.nnz > 0])
    if not present:
        return empty(rows, n)
    for m in present:
        _check_shape(m, (rows, n))
    if _one_pass(present, rows):
        return _union_k(present)
    out = present[0]
    for m in present[1:]:
        out = _union2(out, m)
    return _canonical(out)


class PendingUnion:
    """The row-wise union of several set matrices of one shape, merged when first read.

    What an elementwise rule returns for an output while the tracer allows it
    (:attr:`asd.detection._core.Call.lazy`): a chain of elementwise ops (``a + b - c * d``) then
    merges its operands' rows once, where they are read, instead of at every op. Only a
    :class:`asd.detection._core.Storage` holds one; reading its ``sets`` merges.
    """

    __slots__ = ("parts", "shape", "taken")

    #: most parts kept unmerged: beyond, the parts are merged at once. It bounds the extra work
    #: where every intermediate of an elementwise chain is read at the end (each merges the parts
    #: before it again) and the extra memory of parts kept unmerged
    MAX_PARTS = 8

    def __init__(self, parts: tuple, shape: tuple[int, int]):
        self.parts = parts
        self.shape = shape
        #: whether a consumer took the parts unmerged (a second one gets them merged, once)
        self.taken = False

    def merged(self) -> sp.csr_matrix:
        return union(self.parts, *self.shape)


def lazy_union(parts: Sequence[sp.csr_matrix], rows: int, n: int):
    """The union of ``parts`` (non-empty set matrices of shape ``(rows, n)``) as a
    :class:`PendingUnion`, or merged where that is as cheap (one part, or too many)."""
    present = _distinct([m for m in parts if m.nnz])
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    if len(present) > PendingUnion.MAX_PARTS:
        return union(present, rows, n)
    for m in present:
        _check_shape(m, (rows, n))
    return PendingUnion(tuple(present), (rows, n))


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
    return _csr(np.concatenate(indptrs), np.concatenate([m.indices[:m.nnz] for m in mats]), (rows, n))


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
    if nrows == 1:  # a full reduction (x.sum()): the union of the rows read (each once), without a product
        if 8 * len(cols) < S.shape[0]:
            return full_row(take_rows(S, np.unique(cols)))
        read = np.zeros(S.shape[0], dtype=bool)
        read[cols] = True
        return full_row(take_rows(S, np.flatnonzero(read)))
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


def from_rule(M, shape: tuple[int, int], who: str = "a sparsity rule") -> sp.csr_matrix:
    """A set matrix from what a user's rule returned (or built by hand), checked in full: a scipy
    sparse matrix or array of ``shape`` with valid row pointers and column indices (any format,
    order, dtype or duplicates), as a new canonical set matrix (``M``'s own arrays are never
    modified). ``who`` names the rule in the :class:`asd.InputError` (a ``ValueError``: PyTorch turns a
    ``TypeError`` raised under an operator such as ``*`` into "unsupported operand type")."""
    if not sp.issparse(M):
        raise InputError(f"{who} returned {type(M).__name__} for an output: return a scipy.sparse matrix "
                        "(one row per output element, one column per input) or None")
    if M.shape != tuple(shape):
        raise InputError(f"{who} returned sets of shape {M.shape} for an output that needs {tuple(shape)} (one row "
                         "per output element, one column per input)")
    try:
        C = sp.csr_matrix(M, copy=True)
        C.check_format(full_check=True)
    except (ValueError, TypeError, IndexError) as exc:
        raise InputError(f"{who} returned a malformed sparse matrix ({exc}); build it with scipy's constructors, "
                         "which check their arrays") from None
    C.sum_duplicates()
    C.sort_indices()
    return _csr(C.indptr, C.indices[:C.indptr[-1]], shape)


def _canonical(M: sp.spmatrix) -> sp.csr_matrix:
    """``M`` as a set matrix: CSR, bool, sorted indices (``M`` itself where it is one)."""
    M = M.tocsr()
    if M.dtype != np.bool_:
        M = M.astype(bool)
    if not M.has_sorted_indices:
        M.sort_indices()
    return M
