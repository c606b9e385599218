"""Layout helpers: sparse patterns, differentiable value extraction and validation.

Every operation in :mod:`asd.linalg` works on a :class:`Pattern` (the fixed structure of a sparse
matrix, flattened to one 2-D block-diagonal matrix when the input is batched) and a dense 1-D
tensor of stored values.  The structure is never differentiated (seed 000: values are
differentiable, structure is not); gradients reach a sparse input through :class:`_Values`, which
rebuilds them in the input's own layout and pattern (the projection P_S).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import numpy as np
import torch

from asd.errors import InputError
from asd.linalg import _kernels as K
from asd.linalg._device import is_meta

_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr)
_CACHE: "OrderedDict[tuple, Pattern]" = OrderedDict()
_CACHE_SIZE = 32                 # patterns kept (each holds a private copy of its indices)
_CACHE_NNZ = 30_000_000          # ... and at most this many stored entries in all


class Pattern:
    """Fixed structure of a (possibly batched) sparse matrix.

    The structure is held as CSR of the block-diagonal matrix ``diag(A_1, ..., A_B)`` (shape
    ``(B*n, B*m)``); stored entries keep their storage order, which for CSR and coalesced COO is
    row-major, so values need no permutation.  Attributes derived on demand (row indices, the
    transpose permutation, numpy views, dense positions) are cached on the object.
    """

    def __init__(self, layout, shape, crow, col, *, orig, batch: Optional[int]):
        self.layout = layout
        self.shape = tuple(int(s) for s in shape)          # the user-facing shape
        self.batch = batch                                   # None or B
        self.n = self.shape[-2]
        self.m = self.shape[-1]
        b = batch or 1
        self.n_rows = b * self.n
        self.n_cols = b * self.m
        self.crow = crow                                     # int64 (n_rows + 1,)
        self.col = col                                       # int64 (nnz,)
        self.nnz = int(col.numel())
        self.device = col.device
        self.orig = orig                                     # index tensors of the user layout
        self._cache: dict[str, Any] = {}

    # ---- derived structure -------------------------------------------------------------
    @property
    def row(self) -> torch.Tensor:
        r = self._cache.get("row")
        if r is None:
            counts = self.crow[1:] - self.crow[:-1]
            r = torch.repeat_interleave(torch.arange(self.n_rows, device=self.device), counts,
                                        output_size=self.nnz)
            self._cache["row"] = r
        return r

    def np(self, name: str) -> np.ndarray:
        """numpy (CPU) view of ``crow``, ``col`` or ``row``; ``ucrow``/``ucol`` as uint64."""
        key = "np_" + name
        a = self._cache.get(key)
        if a is None:
            if name.startswith("u"):
                a = self.np(name[1:]).view(np.uint64)
            else:
                a = getattr(self, name).cpu().numpy()
            self._cache[key] = a
        return a

    @property
    def diag_mask(self) -> torch.Tensor:
        d = self._cache.get("diag_mask")
        if d is None:
            d = self.row == self.col
            self._cache["diag_mask"] = d
        return d

    @property
    def on_meta(self) -> bool:
        """The structure lives on ``meta``: its index values are unknown."""
        return self.device.type == "meta"

    @property
    def triangle(self) -> tuple[bool, bool]:
        """(has entries strictly below, has entries strictly above) the diagonal (read back to
        the host once per pattern; unknown on meta, where it must not be asked)."""
        t = self._cache.get("triangle")
        if t is None:
            t = (bool((self.col < self.row).any()), bool((self.col > self.row).any()))
            self._cache["triangle"] = t
        return t

    @property
    def linear_index(self) -> torch.Tensor:
        """Position of each stored entry in the row-major dense (batched) matrix."""
        li = self._cache.get("linear")
        if li is None:
            r, c = self.row, self.col
            li = (r // self.n) * (self.n * self.m) + (r % self.n) * self.m + (c % self.m)
            self._cache["linear"] = li
        return li

    def transpose(self) -> tuple["Pattern", torch.Tensor]:
        """Pattern of the transpose and the permutation ``perm`` with ``vals_T = vals[perm]``."""
        t = self._cache.get("transpose")
        if t is None:
            key = self.col * self.n_rows + self.row
            perm = torch.argsort(key)
            colT = self.row[perm]
            crowT = crow_of_rows(self.col[perm], self.n_cols)
            shapeT = self.shape[:-2] + (self.m, self.n)
            PT = Pattern(torch.sparse_csr, shapeT, crowT, colT, orig=None, batch=self.batch)
            t = (PT, perm)
            self._cache["transpose"] = t
        return t

    def scipy(self, values: torch.Tensor):
        """scipy CSR matrix (block diagonal when batched) sharing the pattern."""
        import scipy.sparse as sp

        v = values.detach().cpu().numpy()
        return sp.csr_array((v, self.np("col"), self.np("crow")), shape=(self.n_rows, self.n_cols))

    # ---- building tensors in the user's layout -----------------------------------------
    def build(self, values: torch.Tensor) -> torch.Tensor:
        """Sparse tensor of this pattern in its layout (no autograd handling)."""
        if self.layout == torch.sparse_csr:
            if self.orig is None:
                self.orig = _unflatten_csr(self)
            crow, col = self.orig
            v = values if self.batch is None else values.reshape(self.batch, -1)
            return torch.sparse_csr_tensor(crow, col, v, self.shape, check_invariants=False)
        if self.orig is None:
            self.orig = (_coo_indices(self),)
        (idx,) = self.orig
        return torch.sparse_coo_tensor(idx, values, self.shape, is_coalesced=True,
                                       check_invariants=False)


def crow_of_rows(rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """CSR row pointers of sorted row indices (no value-dependent shapes: runs on any device)."""
    bounds = torch.arange(n_rows + 1, dtype=rows.dtype, device=rows.device)
    return torch.searchsorted(rows, bounds).to(torch.int64)


def _unflatten_csr(P: Pattern):
    if P.batch is None:
        return P.crow, P.col
    B = P.batch
    if P.nnz % B:
        raise InputError(
            "the result has a different number of stored entries per batch item, which a batched "
            "CSR tensor cannot hold; pass COO inputs to get a batched COO result")
    k = P.nnz // B
    crow = P.crow[:-1].reshape(B, P.n)
    b = torch.arange(B, device=P.device).unsqueeze(1)
    crow = torch.cat([crow - b * k, torch.full((B, 1), k, device=P.device, dtype=torch.int64)], 1)
    col = P.col.reshape(B, k) - b * P.m
    return crow.contiguous(), col.contiguous()


def _coo_indices(P: Pattern) -> torch.Tensor:
    r, c = P.row, P.col
    if P.batch is None:
        return torch.stack([r, c])
    return torch.stack([r // P.n, r % P.n, c % P.m])


def pattern_from_csr(layout, shape, crow, col, batch) -> Pattern:
    """Pattern of a flattened CSR structure (used for results of products and sums)."""
    return Pattern(layout, shape, crow, col, orig=None, batch=batch)


# ---- extraction ---------------------------------------------------------------------------
def check_sparse(A: Any, name: str = "A") -> None:
    if not isinstance(A, torch.Tensor):
        raise InputError(f"{name} must be a torch sparse tensor (COO or CSR), got {type(A).__name__}")
    if A.layout not in _SPARSE_LAYOUTS:
        raise InputError(
            f"{name} must be a sparse COO or CSR tensor, got layout {A.layout}; convert with "
            f"{name}.to_sparse_csr() (values outside the stored pattern receive no gradient)")
    if A.dim() not in (2, 3):
        raise InputError(f"{name} must be a matrix (n, m) or a batch of matrices (B, n, m); got shape "
                         f"{tuple(A.shape)}")
    if A.layout == torch.sparse_coo and A.dense_dim() != 0:
        raise InputError(f"{name}: hybrid sparse tensors with dense dimensions are not supported")
    if A.layout == torch.sparse_csr and A.values().dim() != A.dim() - 1:
        raise InputError(f"{name}: hybrid sparse tensors with dense dimensions are not supported")


def get_pattern(A: torch.Tensor, name: str = "A") -> Pattern:
    """The (cached) :class:`Pattern` of a sparse COO or CSR tensor, validated when first built.

    Cache entries are found by the identity of A's index tensors and re-validated on every hit by
    comparing their contents with the pattern's private copy: index buffers rewritten behind
    torch's back (through ``.numpy()``, which does not bump ``_version``) build a fresh pattern.
    Off the CPU the pattern holds the user's index buffers (so their addresses cannot be reused)
    and a hit is found by address and ``_version`` alone, with no read-back; buffers rewritten
    there behind torch's back (through DLPack) must be followed by :func:`clear_cache`.  Patterns
    on ``meta`` are neither validated (there are no index values) nor cached (no addresses).
    """
    if A.device.type == "meta":
        if A.layout == torch.sparse_csr:
            return _csr_pattern(A, A.crow_indices(), A.col_indices(), name)
        return _coo_pattern(A, A._indices(), name)
    if A.layout == torch.sparse_csr:
        crow, col = A.crow_indices(), A.col_indices()
        key = ("csr", tuple(A.shape), crow.const_data_ptr(), col.const_data_ptr(), crow._version,
               col._version, col.numel(), str(A.device))
        P = _cached_pattern(key, (crow, col))
        if P is not None:
            return P
        P = _csr_pattern(A, crow, col, name)
    else:
        idx = A._indices()
        key = ("coo", tuple(A.shape), idx.const_data_ptr(), idx._version, idx.shape[1], str(A.device))
        P = _cached_pattern(key, (idx,))
        if P is not None:
            return P
        P = _coo_pattern(A, idx, name)
    if A.device.type != "cpu":
        P._cache["user_indices"] = (crow, col) if A.layout == torch.sparse_csr else (idx,)
    _CACHE[key] = P
    total = sum(p.nnz for p in _CACHE.values())
    while len(_CACHE) > 1 and (len(_CACHE) > _CACHE_SIZE or total > _CACHE_NNZ):
        total -= _CACHE.popitem(last=False)[1].nnz
    return P


def _csr_pattern(A: torch.Tensor, crow: torch.Tensor, col: torch.Tensor, name: str) -> Pattern:
    crow, col = crow.clone(), col.clone()          # private: the cache must not alias user buffers
    n, m = A.shape[-2], A.shape[-1]
    if A.dim() == 3:
        B = A.shape[0]
        k = col.shape[-1]
        offs = torch.arange(B, device=crow.device).unsqueeze(1)
        fcrow = torch.cat([(crow[:, :-1] + offs * k).reshape(-1),
                           torch.tensor([B * k], device=crow.device)]).to(torch.int64)
        fcol = (col + offs * m).reshape(-1).to(torch.int64)
    else:
        B = None
        fcrow, fcol = crow.to(torch.int64), col.to(torch.int64)
    P = Pattern(A.layout, A.shape, fcrow, fcol, orig=(crow, col), batch=B)
    if P.on_meta:
        return P
    _check_csr_indices(crow, col, n, m, name)
    _check_unique(P, name, "a repeated column index in one row",
                  f"sum the duplicates first, e.g. {name}.to_sparse_coo().coalesce().to_sparse_csr()")
    return P


def _check_csr_indices(crow: torch.Tensor, col: torch.Tensor, n: int, m: int, name: str) -> None:
    bad = None
    if crow.shape[-1] != n + 1:
        bad = f"crow_indices has {crow.shape[-1]} entries per matrix, expected {n + 1}"
    elif bool((crow[..., 0] != 0).any()) or bool((crow[..., -1] != col.shape[-1]).any()):
        bad = "crow_indices must start at 0 and end at the number of stored entries"
    elif bool((crow[..., 1:] < crow[..., :-1]).any()):
        bad = "crow_indices must be non-decreasing"
    elif col.numel() and (int(col.min()) < 0 or int(col.max()) >= m):
        bad = f"col_indices must lie in [0, {m})"
    if bad is not None:
        raise InputError(f"{name} is not a valid CSR tensor: {bad}")


def _coo_pattern(A: torch.Tensor, idx: torch.Tensor, name: str) -> Pattern:
    idx = idx.clone()
    meta = is_meta(idx)
    for d in range(0 if meta else idx.shape[0]):
        if idx.shape[1] and (int(idx[d].min()) < 0 or int(idx[d].max()) >= A.shape[d]):
            raise InputError(f"{name} is not a valid COO tensor: indices of dimension {d} must lie "
                             f"in [0, {A.shape[d]})")
    if A.dim() == 3:
        B, n, m = A.shape
        row = idx[0] * n + idx[1]
        col = idx[0] * m + idx[2]
        nrows = B * n
    else:
        B = None
        row, col = idx[0], idx[1]
        nrows = A.shape[0]
    lin = row * A.shape[-1] + col % A.shape[-1]
    if not meta and lin.numel() > 1 and not bool((lin[1:] > lin[:-1]).all()):
        raise InputError(
            f"{name} is flagged coalesced but its indices are not sorted and unique; build it "
            f"without is_coalesced=True (asd.linalg then coalesces it, summing duplicates) or "
            f"call .coalesce() on a tensor that is not flagged")
    crow = crow_of_rows(row, nrows)
    P = Pattern(A.layout, A.shape, crow, col.contiguous(), orig=(idx,), batch=B)
    P._cache["row"] = row.contiguous()
    return P


def position_key(P: Pattern) -> torch.Tensor:
    """Each stored entry's position as one integer, increasing in row-major order: ``row * m +
    column`` within its batch item (the flattened block-diagonal matrix is ``B`` times wider, and
    its ``row * n_cols`` would overflow int64 where ``B^2 n m`` does). Inverse: :func:`key_position`."""
    if P.batch:
        return P.row * P.m + (P.col - torch.div(P.row, P.n, rounding_mode="floor") * P.m)
    return P.row * P.n_cols + P.col


def key_position(P: Pattern, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, col)`` in the flattened (block-diagonal) matrix of the keys of :func:`position_key`."""
    width = P.m if P.batch else P.n_cols
    row = torch.div(key, width, rounding_mode="floor")
    col = key % width
    if P.batch:
        col = col + torch.div(row, P.n, rounding_mode="floor") * P.m
    return row, col


def _check_unique(P: Pattern, name: str, what: str, fix: str) -> None:
    """Reject a pattern storing one position twice (kernels would overwrite instead of summing)."""
    if P.nnz < 2:
        return
    key = position_key(P)
    if bool((key[1:] > key[:-1]).all()):
        return
    skey, _ = torch.sort(key)
    dup = (skey[1:] == skey[:-1]).nonzero()
    if dup.numel():
        r, c = (int(v) for v in key_position(P, skey[int(dup[0, 0])].reshape(1)))
        where = f"row {r % P.n}, column {c % P.m}" + (f" of batch item {r // P.n}" if P.batch else "")
        raise InputError(f"{name} has {what} ({where} is stored twice); {fix}")


def clear_cache() -> None:
    """Drop every cached sparse structure (and the plans derived from it)."""
    _CACHE.clear()


def _cached_pattern(key, current: tuple):
    """A cached pattern whose private index copy still equals ``current`` (the key's buffers may
    have been rewritten or freed and reused), marked most recently used; a stale entry is dropped."""
    P = _CACHE.get(key)
    if P is None:
        return None
    if P.device.type == "cpu" and not all(K.equal(a, b) for a, b in zip(current, P.orig)):
        del _CACHE[key]
        return None
    _CACHE.move_to_end(key)
    return P


def _raw_values(A: torch.Tensor) -> torch.Tensor:
    return A.values() if A.layout == torch.sparse_csr else A._values()


class _Values(torch.autograd.Function):
    """Stored values of ``A`` as a flat dense tensor; the gradient goes back in A's pattern."""

    @staticmethod
    def forward(ctx, A, P):
        ctx.P = P
        return _raw_values(A).detach().reshape(-1)

    @staticmethod
    def backward(ctx, g):
        return _FromValues.apply(g, ctx.P), None


class _FromValues(torch.autograd.Function):
    """Sparse tensor of pattern ``P`` holding ``values``; differentiable to any order."""

    @staticmethod
    def forward(ctx, values, P):
        ctx.P = P
        return P.build(values.detach())

    @staticmethod
    def backward(ctx, g):
        return values_at(g, ctx.P), None


def values_at(G: torch.Tensor, P: Pattern) -> torch.Tensor:
    """Entries of ``G`` (dense or sparse, shaped like the pattern's matrix) at P's positions."""
    if P.on_meta and G.layout != torch.strided:         # no positions to match: shape only
        return G.values().new_empty(P.nnz) if G.layout == torch.sparse_csr else \
            G._values().new_empty(P.nnz)
    if G.layout == torch.strided:
        return G.reshape(-1).index_select(0, P.linear_index)
    if G.layout == P.layout:
        same = False
        if G.layout == torch.sparse_csr and P.orig is not None:
            gc, gr = G.col_indices(), G.crow_indices()
            same = (gc.const_data_ptr() == P.orig[1].const_data_ptr()
                    and gr.const_data_ptr() == P.orig[0].const_data_ptr()) or (
                gc.shape == P.orig[1].shape and gr.shape == P.orig[0].shape
                and torch.equal(gc, P.orig[1]) and torch.equal(gr, P.orig[0]))
        elif G.layout == torch.sparse_coo and P.orig is not None and G.is_coalesced():
            gi = G._indices()
            same = gi.const_data_ptr() == P.orig[0].const_data_ptr() or (
                gi.shape == P.orig[0].shape and torch.equal(gi, P.orig[0]))
        if same:
            return _Values.apply(G, P) if G.requires_grad else _raw_values(G).reshape(-1)
    # general sparse gradient: match by linear position
    Gc = G.to_sparse_coo().coalesce() if G.layout != torch.sparse_coo else G.coalesce()
    gi = Gc.indices()
    if G.dim() == 3:
        lin = gi[0] * (P.n * P.m) + gi[1] * P.m + gi[2]
    else:
        lin = gi[0] * P.m + gi[1]
    gv = Gc.values()
    pos = torch.searchsorted(lin, P.linear_index)
    pos_c = pos.clamp(max=max(lin.numel() - 1, 0))
    hit = (pos < lin.numel()) & (lin[pos_c] == P.linear_index) if lin.numel() else \
        torch.zeros_like(P.linear_index, dtype=torch.bool)
    out = gv[pos_c] if lin.numel() else gv.new_zeros(P.nnz)
    return torch.where(hit, out, torch.zeros_like(out))


def _coalesced(A: torch.Tensor, name: str) -> torch.Tensor:
    """A itself, or its coalesced copy for an uncoalesced COO tensor."""
    if A.layout != torch.sparse_coo or A.is_coalesced():
        return A
    if is_meta(A):
        raise InputError(f"{name} is an uncoalesced COO tensor on meta, whose duplicates cannot be "
                         f"found without index values; build it with is_coalesced=True")
    return A.coalesce()


def values_of(A: torch.Tensor, name: str = "A") -> tuple[Pattern, torch.Tensor]:
    """Validate ``A`` and return its pattern and differentiable flat values."""
    check_sparse(A, name)
    A = _coalesced(A, name)
    P = get_pattern(A, name)
    if A.requires_grad:
        return P, _Values.apply(A, P)
    return P, _raw_values(A).reshape(-1)


def with_values(A: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Sparse tensor with ``A``'s layout and pattern holding ``values``.

    Unlike ``torch.sparse_csr_tensor(...)`` this construction is differentiable to any order, so
    ``torch.autograd.gradgradcheck`` can differentiate twice through the stored values.

    Parameters
    ----------
    A : torch.Tensor
        Sparse COO or CSR template (its values are ignored). An uncoalesced COO template is
        accepted only where its entries already are in coalesced order without repeats (otherwise
        the order of ``values`` would be ambiguous): pass ``A.coalesce()``.
    values : torch.Tensor
        Stored values, shape ``(nnz,)`` or ``(B, nnz)`` for batched CSR, in the template's order.
    """
    check_sparse(A)
    C = _coalesced(A, "A")
    if C is not A and not (C._nnz() == A._nnz() and torch.equal(C._indices(), A._indices())):
        raise InputError("A is an uncoalesced COO template whose entries are not in coalesced order (or "
                         "repeat an index), so the order of values is ambiguous: pass A.coalesce() and "
                         "values in its order")
    A = C
    P = get_pattern(A)
    if values.numel() != P.nnz:
        raise InputError(f"values has {values.numel()} elements, the pattern stores {P.nnz}")
    return _FromValues.apply(values.reshape(-1), P)


def from_pattern(P: Pattern, values: torch.Tensor) -> torch.Tensor:
    """Differentiable sparse tensor of pattern ``P`` holding flat ``values``."""
    return _FromValues.apply(values, P)


def check_dense(x: Any, name: str, P: Pattern, dim_rows: int, *, what: str) -> torch.Tensor:
    """Validate a dense operand whose ``-2`` (matrix) or ``-1`` (vector) axis must be ``dim_rows``."""
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise InputError(f"{name} must be dense here, got layout {x.layout}")
    if x.device != P.device:
        raise InputError(f"{name} is on {x.device} but the sparse matrix is on {P.device}; move "
                         f"both to one device")
    if not x.is_floating_point():
        raise InputError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return x


def to_columns(x: torch.Tensor, P: Pattern, size: int, name: str) -> tuple[torch.Tensor, tuple]:
    """Reshape a dense operand to ``(B*size, k)`` columns; returns it and the output shape info.

    Accepts ``(size,)`` / ``(size, k)`` for unbatched and ``(B, size)`` / ``(B, size, k)`` for batched
    patterns (a 1-D or 2-D operand is broadcast over the batch).
    """
    B = P.batch
    if B is None:
        if x.dim() == 1 and x.shape[0] == size:
            return x.reshape(size, 1), ("vec",)
        if x.dim() == 2 and x.shape[0] == size:
            return x, ("mat",)
        raise InputError(f"{name} has shape {tuple(x.shape)}; expected ({size},) or ({size}, k) to match "
                         f"the sparse matrix of shape {P.shape}")
    if x.dim() == 2 and x.shape == (B, size):
        return x.reshape(B * size, 1), ("bvec",)
    if x.dim() == 3 and x.shape[:2] == (B, size):
        return x.reshape(B * size, x.shape[2]), ("bmat", x.shape[2])
    if x.dim() == 1 and x.shape[0] == size:
        return x.reshape(1, size).expand(B, size).reshape(B * size, 1), ("bvec",)
    if x.dim() == 2 and x.shape[0] == size:
        k = x.shape[1]
        return x.unsqueeze(0).expand(B, size, k).reshape(B * size, k), ("bmat", k)
    raise InputError(f"{name} has shape {tuple(x.shape)}; expected ({B}, {size}) or ({B}, {size}, k) "
                     f"to match the batched sparse matrix of shape {P.shape}")


def from_columns(y: torch.Tensor, info: tuple, P: Pattern, size: int) -> torch.Tensor:
    kind = info[0]
    if kind == "vec":
        return y.reshape(size)
    if kind == "mat":
        return y
    if kind == "bvec":
        return y.reshape(P.batch, size)
    return y.reshape(P.batch, size, info[1])


def check_dtypes(vals: torch.Tensor, *others: torch.Tensor) -> None:
    for o in others:
        if o.dtype != vals.dtype:
            raise InputError(f"dtype mismatch: sparse matrix is {vals.dtype}, operand is {o.dtype}; "
                             f"cast one of them")
