"""The sparsity pattern passed between the stages: a frozen boolean CSR structure.

``SparsityPattern`` is what detection returns and what coloring, evaluation and decompression
read. It holds the canonical CSR arrays (sorted column indices, no duplicates, int64, read-only)
and the shapes of the function's input and output, so a Jacobian pattern knows which tensors it
describes. The transpose is built once, on first use. ``to_scipy()`` gives the public
``scipy.sparse.csr_array`` form; ``save``/``load`` use ``.npz`` files without pickle.

This module imports neither torch nor numba.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import InitVar, dataclass
from functools import cached_property

import numpy as np

from .errors import InputError

__all__ = ["SparsityPattern", "as_pattern"]

_I = np.int64
#: square patterns of at least this many entries look for their mirrors with a Numba kernel even
#: before Numba is loaded (see :meth:`SparsityPattern.transpose_with_positions`)
SYMMETRIC_KERNEL_NNZ = 1 << 16
_FORMAT = "asd.SparsityPattern/1"


def _frozen(a, dtype=_I) -> np.ndarray:
    """``a`` as a read-only contiguous array of ``dtype``: ``a`` itself only where no one can write
    it (see :func:`_unwritable`), else a copy."""
    a = np.ascontiguousarray(a, dtype=dtype)
    if not _unwritable(a):  # never freeze (or alias) an array the caller may still write
        a = a.copy()
        a.setflags(write=False)
    return a


def _unwritable(a: np.ndarray) -> bool:
    """Whether no one can write ``a``'s elements through numpy: it and every array it views are
    read-only, down to memory numpy owns or immutable bytes (a read-only view of a writable buffer
    is not)."""
    while True:
        if a.flags.writeable:
            return False
        base = a.base
        if base is None:
            return True
        if not isinstance(base, np.ndarray):
            return isinstance(base, bytes)
        a = base


@dataclass(frozen=True, eq=False)
class SparsityPattern:
    """A boolean sparse matrix in canonical CSR form.

    Parameters
    ----------
    shape
        ``(m, n)``: rows are output elements, columns input elements (row-major flattening).
    indptr, indices
        Canonical CSR structure: ``indices[indptr[i]:indptr[i+1]]`` are the sorted, distinct
        columns of row ``i``. Use :meth:`from_csr` or :func:`as_pattern` for arbitrary input.
    input_shape, output_shape
        Shapes of the tensors the pattern describes (``(n,)`` and ``(m,)`` when unknown).
    """

    shape: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    input_shape: tuple[int, ...] | None = None
    output_shape: tuple[int, ...] | None = None
    #: asd's own constructions of structures known canonical (a trace's sets, a transpose, a
    #: validated input) skip the O(nnz) check below; every other construction pays it
    _trusted: InitVar[bool] = False

    def __post_init__(self, _trusted: bool = False):
        m, n = (int(s) for s in self.shape)
        object.__setattr__(self, "shape", (m, n))
        object.__setattr__(self, "indptr", _frozen(self.indptr))
        object.__setattr__(self, "indices", _frozen(self.indices))
        object.__setattr__(self, "input_shape", (n,) if self.input_shape is None else tuple(int(s) for s in self.input_shape))
        object.__setattr__(self, "output_shape",
                           (m,) if self.output_shape is None else tuple(int(s) for s in self.output_shape))
        if self.indptr.shape != (m + 1,) or self.indptr[0] != 0 or self.indptr[-1] != self.indices.shape[0]:
            raise InputError(f"indptr must have {m + 1} entries from 0 to nnz={self.indices.shape[0]}")
        if int(np.prod(self.input_shape)) != n or int(np.prod(self.output_shape)) != m:
            raise InputError(f"input_shape {self.input_shape} / output_shape {self.output_shape} do not match "
                             f"the pattern's shape {(m, n)}")
        if not _trusted:
            _check_canonical(self.indptr, self.indices, n)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_csr(cls, indptr, indices, shape, *, input_shape=None, output_shape=None,
                 canonical: bool = False) -> "SparsityPattern":
        """A pattern from CSR arrays; sorted and deduplicated unless ``canonical=True``."""
        m, n = (int(s) for s in shape)
        indptr = np.asarray(indptr, dtype=_I)
        indices = np.asarray(indices, dtype=_I)
        if indptr.ndim != 1 or indices.ndim != 1 or indptr.shape[0] != m + 1:
            raise InputError(f"a CSR pattern of shape {(m, n)} needs indptr of length {m + 1} and 1-D indices")
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            raise InputError(f"pattern column indices must lie in [0, {n}), got range "
                             f"[{int(indices.min())}, {int(indices.max())}]")
        if np.any(np.diff(indptr) < 0) or indptr[0] != 0 or indptr[-1] != indices.shape[0]:
            raise InputError("pattern indptr must be non-decreasing from 0 to len(indices)")
        if not canonical:
            indptr, indices = _canonicalize(indptr, indices, (m, n))
            return cls((m, n), indptr, indices, input_shape, output_shape, _trusted=True)
        return cls((m, n), indptr, indices, input_shape, output_shape)

    @classmethod
    def from_coo(cls, rows, cols, shape, **shapes) -> "SparsityPattern":
        """A pattern from coordinate lists (duplicates merged)."""
        import scipy.sparse as sp

        rows = np.asarray(rows, dtype=_I)
        cols = np.asarray(cols, dtype=_I)
        A = sp.coo_array((np.ones(rows.shape[0], dtype=np.int8), (rows, cols)), shape=tuple(shape)).tocsr()
        return cls.from_csr(A.indptr, A.indices, shape, **shapes)

    @classmethod
    def empty(cls, shape, **shapes) -> "SparsityPattern":
        return cls(shape, np.zeros(int(shape[0]) + 1, dtype=_I), np.zeros(0, dtype=_I), **shapes, _trusted=True)

    # -- basic properties -------------------------------------------------------------------
    @property
    def nnz(self) -> int:
        """Number of structural nonzeros."""
        return int(self.indices.shape[0])

    @property
    def density(self) -> float:
        m, n = self.shape
        return self.nnz / max(m * n, 1)

    @cached_property
    def rows(self) -> np.ndarray:
        """Row index of every stored entry, in CSR order (read-only)."""
        if "numba" in sys.modules or self.nnz >= SYMMETRIC_KERNEL_NNZ:  # np.repeat: a tenth of a 10^6 star coloring
            from ._pattern_kernels import csr_rows

            rows = csr_rows(self.indptr, np.empty(self.nnz, dtype=_I))
        else:
            rows = np.repeat(np.arange(self.shape[0], dtype=_I), np.diff(self.indptr))
        rows.setflags(write=False)  # made here, held by no one else: frozen without a copy
        return rows

    @cached_property
    def transpose_with_positions(self) -> tuple["SparsityPattern", np.ndarray]:
        """``(P^T, perm)``: the transposed pattern and, for each of its entries, the position of
        the same entry in this pattern's CSR order. Built once."""
        m, n = self.shape
        # (while Numba is not loaded, a small pattern takes scipy's route: importing it costs more)
        if m == n and m and ("numba" in sys.modules or self.nnz >= SYMMETRIC_KERNEL_NNZ):
            from ._pattern_kernels import symmetric_mirror

            # a symmetric structure is its own transpose: one pass finds every entry's mirror (and
            # checks the symmetry in full), without scipy's transposed copy
            mirror, symmetric = symmetric_mirror(self.indptr, self.indices)
            if symmetric:
                mirror.setflags(write=False)
                self.__dict__["is_symmetric"] = True
                T = SparsityPattern((n, m), self.indptr, self.indices, self.output_shape, self.input_shape, _trusted=True)
                return T, mirror
        # CSR -> CSC carrying each entry's position: linear time, rows sorted within columns
        indptr, indices, order = _csr_to_csc(m, n, self.indptr, self.indices)
        for a in (indptr, indices, order):  # fresh arrays of this function's own: frozen, not copied
            a.setflags(write=False)
        T = SparsityPattern((n, m), indptr, indices, self.output_shape, self.input_shape, _trusted=True)
        return T, order

    @property
    def has_transpose(self) -> bool:
        """Whether :attr:`T` is built already (reading it then costs nothing)."""
        return "transpose_with_positions" in self.__dict__

    @property
    def T(self) -> "SparsityPattern":
        """The transposed pattern (built once)."""
        return self.transpose_with_positions[0]

    @cached_property
    def is_symmetric(self) -> bool:
        if self.shape[0] != self.shape[1]:
            return False
        T = self.T
        return bool(np.array_equal(T.indptr, self.indptr) and np.array_equal(T.indices, self.indices))

    @cached_property
    def fingerprint(self) -> str:
        """A content hash of the structure (shape and index arrays): equal patterns, equal hashes."""
        h = hashlib.blake2b(digest_size=16)
        h.update(np.asarray(self.shape, dtype=_I).tobytes())
        h.update(self.indptr.tobytes())
        h.update(self.indices.tobytes())
        return h.hexdigest()

    def equals(self, other: "SparsityPattern") -> bool:
        """Same shape and the same structural nonzeros."""
        return (isinstance(other, SparsityPattern) and self.shape == other.shape
                and np.array_equal(self.indptr, other.indptr) and np.array_equal(self.indices, other.indices))

    def contains(self, other: "SparsityPattern") -> bool:
        """Whether every nonzero of ``other`` is a nonzero of this pattern (same shape)."""
        if self.shape != other.shape:
            return False
        if other.nnz == 0:
            return True
        key = self.rows * self.shape[1] + self.indices
        okey = other.rows * other.shape[1] + other.indices
        pos = np.searchsorted(key, okey)
        pos = np.minimum(pos, max(key.shape[0] - 1, 0))
        return bool(key.shape[0] and np.array_equal(key[pos], okey))

    # -- conversions --------------------------------------------------------------------
    def to_scipy(self):
        """The pattern as a boolean ``scipy.sparse.csr_array`` (fresh, writable arrays), its index
        arrays ``int32`` where the shape and the number of entries fit (``int64`` beyond), as
        scipy's own constructors choose."""
        import scipy.sparse as sp

        # scipy scans the contents of int64 index arrays (and keeps int64); int32 ones it takes as
        # they are: 4x faster at B1 N=64
        dt = np.int32 if max(*self.shape, self.nnz) <= np.iinfo(np.int32).max else np.int64
        return sp.csr_array((np.ones(self.nnz, dtype=bool), self.indices.astype(dt), self.indptr.astype(dt)),
                            shape=self.shape)

    def toarray(self) -> np.ndarray:
        """Dense boolean matrix (for small patterns and tests)."""
        out = np.zeros(self.shape, dtype=bool)
        out[self.rows, self.indices] = True
        return out

    def with_shapes(self, input_shape=None, output_shape=None) -> "SparsityPattern":
        """The same structure describing tensors of other (compatible) shapes."""
        return SparsityPattern(self.shape, self.indptr, self.indices,
                               self.input_shape if input_shape is None else input_shape,
                               self.output_shape if output_shape is None else output_shape, _trusted=True)

    def save(self, path) -> None:
        """Write the pattern to an ``.npz`` file (no pickle)."""
        np.savez(path, format=np.array(_FORMAT), shape=np.asarray(self.shape, dtype=_I), indptr=self.indptr,
                 indices=self.indices, input_shape=np.asarray(self.input_shape, dtype=_I),
                 output_shape=np.asarray(self.output_shape, dtype=_I))

    @classmethod
    def load(cls, path) -> "SparsityPattern":
        """Read a pattern written by :meth:`save` (validated, no pickle)."""
        with np.load(os.fspath(path), allow_pickle=False) as z:
            if "format" not in z or str(z["format"]) != _FORMAT:
                raise InputError(f"{os.fspath(path)!r} is not an asd sparsity pattern file")
            return cls.from_csr(z["indptr"], z["indices"], tuple(z["shape"]),
                                input_shape=tuple(z["input_shape"]), output_shape=tuple(z["output_shape"]))

    def __repr__(self) -> str:
        return f"SparsityPattern(shape={self.shape}, nnz={self.nnz})"


def _check_canonical(indptr: np.ndarray, indices: np.ndarray, n: int) -> None:
    """Raise :class:`InputError` unless the row pointers never decrease and every row's columns are
    strictly increasing within ``[0, n)`` (asd's kernels index with them unchecked)."""
    nnz = indices.shape[0]
    if indptr.shape[0] > 1 and (np.diff(indptr) < 0).any():
        raise InputError("pattern indptr must be non-decreasing; build patterns of arbitrary CSR arrays with "
                         "SparsityPattern.from_csr or asd.patterns.as_pattern")
    if nnz and (int(indices.min()) < 0 or int(indices.max()) >= n):
        raise InputError(f"pattern column indices must lie in [0, {n}), got range [{int(indices.min())}, "
                         f"{int(indices.max())}]")
    if nnz > 1:
        rising = indices[1:] > indices[:-1]
        starts = indptr[1:-1]
        starts = starts[(starts > 0) & (starts < nnz)]
        rising[starts - 1] = True  # a new row may start anywhere
        if not rising.all():
            raise InputError("pattern columns must be sorted and distinct within each row; build patterns of "
                             "arbitrary CSR arrays with SparsityPattern.from_csr or asd.patterns.as_pattern")


def _csr_to_csc_scipy(m: int, n: int, indptr, indices):
    import scipy.sparse as sp

    C = sp.csr_array((np.arange(indices.shape[0], dtype=_I), indices, indptr), shape=(m, n)).tocsc()
    return C.indptr.astype(_I, copy=False), C.indices.astype(_I, copy=False), C.data.astype(_I, copy=False)


def _csr_to_csc_kernel():
    """scipy's C++ CSR -> CSC conversion called directly (without the matrix objects and their
    validation), checked once against ``tocsc``; ``None`` where this scipy lacks it or answers
    otherwise."""
    try:
        from scipy.sparse import _sparsetools

        fn = _sparsetools.csr_tocsc
        ip, ix = np.array([0, 2, 2, 4], dtype=_I), np.array([1, 3, 0, 1], dtype=_I)
        want = _csr_to_csc_scipy(3, 4, ip, ix)
        bp, bi, bx = np.empty(5, _I), np.empty(4, _I), np.empty(4, _I)
        fn(3, 4, ip, ix, np.arange(4, dtype=_I), bp, bi, bx)
        if not all(np.array_equal(a, b) for a, b in zip((bp, bi, bx), want)):
            return None
        return fn
    except Exception:  # noqa: BLE001  (another scipy: the matrix route)
        return None


_TOCSC: list = []


def _csr_to_csc(m: int, n: int, indptr: np.ndarray, indices: np.ndarray):
    """``(indptr, indices, position)`` of the transpose of a canonical CSR structure: columns in
    CSR form, rows sorted within each, and each entry's position in the original CSR order."""
    if not _TOCSC:
        _TOCSC.append(_csr_to_csc_kernel())
    fn = _TOCSC[0]
    if fn is None:
        return _csr_to_csc_scipy(m, n, indptr, indices)
    nnz = indices.shape[0]
    bp, bi, bx = np.empty(n + 1, _I), np.empty(nnz, _I), np.empty(nnz, _I)
    fn(m, n, indptr, indices, np.arange(nnz, dtype=_I), bp, bi, bx)
    return bp, bi, bx


def _canonicalize(indptr, indices, shape):
    import scipy.sparse as sp

    # copied: sorting and merging run in place, and the arrays may be the caller's (an int64 matrix)
    A = sp.csr_array((np.ones(indices.shape[0], dtype=np.int8), indices, indptr), shape=shape, copy=True)
    if not A.has_canonical_format:
        A.sum_duplicates()
    return A.indptr.astype(_I, copy=False), A.indices.astype(_I, copy=False)


def _from_torch(t, name: str):
    """A torch tensor as a pattern a scipy/numpy path takes: a dense one as a numpy array, a sparse
    one (any layout) as a scipy COO array of its stored entries."""
    import scipy.sparse as sp
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a scipy.sparse matrix, a dense array, a torch tensor or an "
                        f"asd.SparsityPattern, got a torch {type(t).__name__}")
    if t.dim() != 2:
        raise InputError(f"{name} must be a 2-D matrix, got a {t.dim()}-D torch tensor of shape {tuple(t.shape)}")
    if t.layout == torch.strided:
        return t.detach().cpu().numpy()
    coo = t.detach().to_sparse_coo().coalesce().cpu()
    if coo.dense_dim():
        raise InputError(f"{name} must have scalar entries, got a hybrid sparse tensor (dense_dim {coo.dense_dim()})")
    rows, cols = coo.indices().numpy()
    return sp.coo_array((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=tuple(t.shape))


def as_pattern(pattern, *, name: str = "pattern", input_shape=None, output_shape=None) -> SparsityPattern:
    """Any pattern a user may pass, as a :class:`SparsityPattern`.

    Accepts a ``SparsityPattern``, a scipy sparse matrix or array, a dense 2-D numpy/bool array
    or a 2-D torch tensor of any layout (in dense arrays every nonzero is structural; in sparse
    inputs every stored entry is, explicit zeros included, except the padding a DIA matrix stores:
    its zeros are not entries). Anything else raises a ``TypeError``/``InputError`` naming ``name``.
    """
    import scipy.sparse as sp

    if type(pattern).__module__.startswith("torch"):
        pattern = _from_torch(pattern, name)
    if isinstance(pattern, SparsityPattern):
        P = pattern
    elif sp.issparse(pattern):
        if pattern.ndim != 2:
            raise InputError(f"{name} must be a 2-D matrix, got a {pattern.ndim}-D sparse array")
        A = sp.csr_array(pattern)
        P = SparsityPattern.from_csr(A.indptr, A.indices, A.shape)
    else:
        try:
            arr = np.asarray(pattern)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"{name} must be a scipy.sparse matrix or a dense 2-D array, got "
                            f"{type(pattern).__name__}") from exc
        if arr.ndim != 2 or arr.dtype == object or arr.dtype.kind in "SUV":
            what = (f"a {type(pattern).__name__}" if arr.ndim == 0 or arr.dtype.kind in "OSUV"
                    else f"shape {arr.shape}")
            raise InputError(f"{name} must be a 2-D matrix (scipy.sparse, a dense bool array or a torch tensor), "
                             f"got {what}")
        rows, cols = np.nonzero(arr)
        P = SparsityPattern.from_coo(rows, cols, arr.shape)
    if input_shape is not None or output_shape is not None:
        P = P.with_shapes(input_shape, output_shape)
    return P
