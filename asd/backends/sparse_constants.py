"""Constant torch sparse matrices inside functions evaluated under ``torch.func`` transforms.

``torch.func.vmap`` has no batching rules for sparse tensors, so ``A @ u`` with a constant CSR or
COO ``A`` fails inside a batched JVP/VJP/HVP. While :class:`SparseConstantMode` is active, such
products are routed through :class:`SparseMatmul`, an ``autograd.Function`` with a JVP, a
backward (itself a sparse product, so it is differentiable again) and a vmap rule that turns the
batch of vectors into one sparse-times-dense-matrix product.
"""

from __future__ import annotations

import weakref

import torch
from torch.overrides import TorchFunctionMode

_SPARSE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
# id(A) -> (weak reference to A, copy of A's index arrays, structure of A^T). Only the structure is
# cached, and a hit is validated against A's current index arrays (they can be rewritten in place,
# even through numpy, without any version bump); the values are gathered from A on every use.
_TRANSPOSES: dict[int, tuple] = {}


def clear_transposes() -> None:
    """Forget every cached transpose structure."""
    _TRANSPOSES.clear()


def _index_arrays(A: torch.Tensor) -> tuple:
    if A.layout == torch.sparse_coo:
        return (A._indices(),)
    return (A.crow_indices(), A.col_indices())


def _same_structure(saved: tuple, A: torch.Tensor) -> bool:
    now = _index_arrays(A)
    return len(saved) == len(now) and all(s.shape == t.shape and torch.equal(s, t) for s, t in zip(saved, now))


def is_sparse(t) -> bool:
    return isinstance(t, torch.Tensor) and t.layout in _SPARSE


def _transpose_structure(A: torch.Tensor):
    """(perm, crow, col) of A^T in CSR: ``A^T.values = A.values[perm]`` (A in CSR or COO)."""
    m, n = A.shape
    if A.layout == torch.sparse_coo:
        A = A.coalesce()
        rows, cols = A.indices()
    else:
        crow, cols = A.crow_indices(), A.col_indices()
        rows = torch.repeat_interleave(torch.arange(m, device=crow.device), crow.diff())
    perm = torch.argsort(cols * m + rows)
    counts = torch.bincount(cols, minlength=n)
    crow_t = torch.zeros(n + 1, dtype=torch.int64, device=cols.device)
    crow_t[1:] = torch.cumsum(counts, 0)
    return perm, crow_t, rows[perm].to(torch.int64)


def _transpose(A: torch.Tensor) -> torch.Tensor:
    """``A^T`` as CSR with ``A``'s current values; its structure is computed once per matrix."""
    # a constant: computed outside any torch.func transform that may be active around this call
    with torch._C._DisableFuncTorch(), torch.no_grad():
        hit = _TRANSPOSES.get(id(A))
        if hit is None or hit[0]() is not A or not _same_structure(hit[1], A):
            key = id(A)
            hit = (weakref.ref(A), tuple(t.clone() for t in _index_arrays(A)), _transpose_structure(A))
            _TRANSPOSES[key] = hit
            weakref.finalize(A, _TRANSPOSES.pop, key, None)
        perm, crow_t, col_t = hit[2]
        values = (A.coalesce() if A.layout == torch.sparse_coo else A).values()[perm]
        return torch.sparse_csr_tensor(crow_t, col_t, values, size=(A.shape[1], A.shape[0]), check_invariants=False)


def _product(A: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    if u.dim() == 1:
        return torch.mv(A, u)
    return torch.mm(A, u)


class Constant:
    """Holds a sparse matrix so that ``torch.func`` transforms do not try to wrap it."""

    __slots__ = ("A",)

    def __init__(self, A: torch.Tensor):
        self.A = A

    @property
    def T(self) -> "Constant":
        return Constant(_transpose(self.A))


class SparseMatmul(torch.autograd.Function):
    """``A @ u`` for a constant sparse 2-D ``A`` (held by a :class:`Constant`) and a dense ``u``."""

    @staticmethod
    def forward(c: Constant, u):
        return _product(c.A, u)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.c = inputs[0]

    @staticmethod
    def backward(ctx, grad):
        return None, SparseMatmul.apply(ctx.c.T, grad)

    @staticmethod
    def jvp(ctx, c_t, u_t):
        return SparseMatmul.apply(ctx.c, u_t)

    @staticmethod
    def vmap(info, in_dims, c, u):
        u_dim = in_dims[1]
        if u_dim is None:
            return SparseMatmul.apply(c, u), None
        u = u.movedim(u_dim, -1)  # (k, [p,] B)
        shape = u.shape
        out = SparseMatmul.apply(c, u.reshape(shape[0], -1))
        return out.reshape((c.A.shape[0],) + tuple(shape[1:])), len(shape) - 1


def sparse_matmul(A: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``A @ u`` for a constant sparse ``A``, usable under ``vmap``/``jvp``/``grad``."""
    return SparseMatmul.apply(Constant(A), u)


_MATMUL_NAMES = {"matmul", "__matmul__", "mm", "mv", "smm", "spmm", "_sparse_mm"}
_ADDMM_NAMES = {"addmm", "_sparse_addmm"}


class SparseConstantMode(TorchFunctionMode):
    """Routes ``A @ u`` with a constant sparse ``A`` through :class:`SparseMatmul`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if len(args) == 2 and not kwargs:
            a, b = args
            if name in _MATMUL_NAMES and is_sparse(a) and a.dim() == 2 and not is_sparse(b) and b.dim() in (1, 2):
                return sparse_matmul(a, b)
            if name in ("matmul", "__matmul__") and is_sparse(b) and b.dim() == 2 \
                    and not is_sparse(a) and a.dim() in (1, 2):
                # u @ A = (A^T @ u^T)^T
                if a.dim() == 1:
                    return sparse_matmul(_transpose(b), a)
                return sparse_matmul(_transpose(b), a.mT).mT
        if name in _ADDMM_NAMES and len(args) == 3 and is_sparse(args[1]) and not is_sparse(args[2]) \
                and set(kwargs) <= {"beta", "alpha"}:
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            return beta * args[0] + alpha * sparse_matmul(args[1], args[2])
        return func(*args, **kwargs)
