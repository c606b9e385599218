"""Sparsity-preserving products: SpMV / SpMM, SpSpMM and sampled dense products (SDDMM).

Two primitives, each the other's derivative, carry everything:

* ``_SpMM``: ``Y = op(A) X`` with ``op`` the identity or the transpose;
* ``_SDDMM``: ``s_p = U[row_p] . V[col_p]`` on the stored entries ``p`` of a pattern.

``d(AX)/dA = (G X^T) masked to A`` is an SDDMM and ``d(AX)/dX = A^T G`` is an SpMM, and
conversely, so backward passes built from these Functions are differentiable again (double
backward for free).
"""

from __future__ import annotations


import torch

from asd.errors import InputError
from asd.linalg import _kernels as K
from asd.linalg._sparse import (Pattern, check_dense, check_dtypes, check_sparse, from_columns,
                                from_pattern, get_pattern, pattern_from_csr, to_columns, values_of)

__all__ = ["matmul", "sampled_matmul", "spmm_values", "sddmm_values"]


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, vals, X, P, trans):
        ctx.P, ctx.trans = P, trans
        ctx.save_for_backward(vals, X)
        return K.spmm(P, vals, X, trans)

    @staticmethod
    def backward(ctx, G):
        vals, X = ctx.saved_tensors
        P, trans = ctx.P, ctx.trans
        gv = gX = None
        graph = torch.is_grad_enabled()
        if ctx.needs_input_grad[1]:
            gX = _SpMM.apply(vals, G, P, not trans) if graph else K.spmm(P, vals, G, not trans)
        if ctx.needs_input_grad[0]:
            U, V = (G, X) if not trans else (X, G)
            gv = _SDDMM.apply(U, V, P) if graph else K.sddmm(P, U, V)
        return gv, gX, None, None


class _SDDMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, U, V, P):
        ctx.P = P
        ctx.save_for_backward(U, V)
        return K.sddmm(P, U, V)

    @staticmethod
    def backward(ctx, g):
        U, V = ctx.saved_tensors
        P = ctx.P
        gU = gV = None
        graph = torch.is_grad_enabled()
        if ctx.needs_input_grad[0]:
            gU = _SpMM.apply(g, V, P, False) if graph else K.spmm(P, g, V, False)
        if ctx.needs_input_grad[1]:
            gV = _SpMM.apply(g, U, P, True) if graph else K.spmm(P, g, U, True)
        return gU, gV, None


def spmm_values(P: Pattern, vals: torch.Tensor, X: torch.Tensor, trans: bool = False) -> torch.Tensor:
    """Differentiable ``op(A) X`` on flat values (``X`` of shape ``(rows, k)``)."""
    return _SpMM.apply(vals, X, P, trans)


def sddmm_values(P: Pattern, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Differentiable sampled product ``U[row] . V[col]`` on the stored entries of ``P``."""
    return _SDDMM.apply(U, V, P)


# ---- sparse x sparse ------------------------------------------------------------------------
def _product_plan(PA: Pattern, PB: Pattern):
    key = ("product", id(PB))
    hit = PA._cache.get(key)
    if hit is not None and hit[0] is PB:
        return hit[1]
    crow, col, ka, kb, kc = K.product_pattern(PA, PB)
    dev = PA.device
    shape = PA.shape[:-2] + (PA.n, PB.m)
    PC = pattern_from_csr(PA.layout, shape, crow.to(dev), col.to(dev), PA.batch)
    plan = (PC, ka.to(dev), kb.to(dev), kc.to(dev))
    PA._cache[key] = (PB, plan)
    return plan


def _spspmm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    PA, va = values_of(A, "A")
    PB, vb = values_of(B, "B")
    if PA.batch != PB.batch or PA.m != PB.n:
        raise InputError(f"shape mismatch in sparse @ sparse: {tuple(A.shape)} @ {tuple(B.shape)}")
    if va.device != vb.device:
        raise InputError(f"A is on {va.device} but B is on {vb.device}")
    check_dtypes(va, vb)
    if PA.on_meta:
        raise InputError("sparse @ sparse on meta: the product pattern's size depends on the index "
                         "values, which meta tensors do not have; run it on a real device")
    PC, ka, kb, kc = _product_plan(PA, PB)
    vc = torch.zeros(PC.nnz, dtype=va.dtype, device=va.device).index_add(0, kc, va.index_select(0, ka) * vb.index_select(0, kb))
    return from_pattern(PC, vc)


# ---- public API -----------------------------------------------------------------------------
def matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Product with a sparse operand whose gradient keeps the sparse operand's pattern.

    Parameters
    ----------
    A, B : torch.Tensor
        At least one is a sparse COO or CSR tensor whose values may require grad.

        * sparse ``A`` (n, m) times dense ``B`` (m,) or (m, k): SpMV / SpMM, dense result;
        * dense ``A`` (..., m) or (k, n) times sparse ``B`` (n, m): dense result;
        * sparse times sparse: SpSpMM, sparse result in ``A``'s layout with the structural
          product pattern;
        * batched: sparse (Bt, n, m) with dense (Bt, m) / (Bt, m, k), or with another batched
          sparse tensor.

    Returns
    -------
    torch.Tensor
        The product.  Gradients with respect to a sparse operand are sparse tensors in that
        operand's layout with exactly its stored entries, ``(G B^T) ⊙ mask(A)``; gradients with
        respect to dense operands are dense.

    Raises
    ------
    InputError
        Shape, dtype or device mismatch; sparse @ sparse on ``meta`` (the size of the product
        pattern depends on index values).  Off the CPU the symbolic phase of sparse @ sparse
        runs on the host, once per pair of patterns, with a
        :class:`~asd.errors.HostFallbackWarning`; everything else stays on the device.
    """
    a_sp = isinstance(A, torch.Tensor) and A.layout != torch.strided
    b_sp = isinstance(B, torch.Tensor) and B.layout != torch.strided
    if a_sp and b_sp:
        return _spspmm(A, B)
    if a_sp:
        P, vals = values_of(A, "A")
        check_dense(B, "B", P, P.m, what="rhs")
        check_dtypes(vals, B)
        X, info = to_columns(B, P, P.m, "B")
        Y = _SpMM.apply(vals, X, P, False)
        return from_columns(Y, info, P, P.n)
    if b_sp:
        # X @ S = (S^T X^T)^T
        P, vals = values_of(B, "B")
        check_dense(A, "A", P, P.n, what="lhs")
        check_dtypes(vals, A)
        if P.batch is None and A.dim() == 1:
            Y = _SpMM.apply(vals, A.reshape(-1, 1), P, True)
            return Y.reshape(P.m)
        if P.batch is None and A.dim() == 2 and A.shape[1] == P.n:
            return _SpMM.apply(vals, A.t(), P, True).t()
        if P.batch is not None and A.dim() == 3 and A.shape[0] == P.batch and A.shape[2] == P.n:
            Xt = A.transpose(1, 2).reshape(P.batch * P.n, A.shape[1])
            Y = _SpMM.apply(vals, Xt, P, True).reshape(P.batch, P.m, A.shape[1])
            return Y.transpose(1, 2)
        raise InputError(f"shape mismatch: dense {tuple(A.shape)} @ sparse {tuple(B.shape)}")
    raise InputError("matmul: at least one operand must be a sparse COO or CSR tensor; use "
                     "torch.matmul for dense products")


def sampled_matmul(U: torch.Tensor, V: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """Dense product ``U @ V`` evaluated only on the stored entries of ``pattern`` (SDDMM).

    Parameters
    ----------
    U : torch.Tensor
        Dense (n, k) or batched (B, n, k).
    V : torch.Tensor
        Dense (k, m) or batched (B, k, m).
    pattern : torch.Tensor
        Sparse COO or CSR (n, m) / (B, n, m); only its structure is used.

    Returns
    -------
    torch.Tensor
        Sparse tensor in ``pattern``'s layout and pattern holding ``(U @ V) ⊙ mask(pattern)``,
        differentiable with respect to ``U`` and ``V`` (dense gradients).
    """
    check_sparse(pattern, "pattern")
    if pattern.layout == torch.sparse_coo and not pattern.is_coalesced():
        pattern = pattern.coalesce()
    P = get_pattern(pattern, "pattern")
    check_dense(U, "U", P, P.n, what="lhs")
    check_dense(V, "V", P, P.m, what="rhs")
    if U.dtype != V.dtype:
        raise InputError(f"dtype mismatch: U is {U.dtype}, V is {V.dtype}")
    if P.batch is None:
        if U.dim() != 2 or V.dim() != 2 or U.shape[0] != P.n or V.shape[1] != P.m or U.shape[1] != V.shape[0]:
            raise InputError(f"shape mismatch: {tuple(U.shape)} @ {tuple(V.shape)} sampled on "
                             f"{tuple(P.shape)}")
        Uc, Vc = U, V.t()
    else:
        if (U.dim() != 3 or V.dim() != 3 or U.shape[:2] != (P.batch, P.n)
                or V.shape[0] != P.batch or V.shape[2] != P.m or U.shape[2] != V.shape[1]):
            raise InputError(f"shape mismatch: {tuple(U.shape)} @ {tuple(V.shape)} sampled on "
                             f"{tuple(P.shape)}")
        Uc = U.reshape(P.batch * P.n, U.shape[2])
        Vc = V.transpose(1, 2).reshape(P.batch * P.m, V.shape[1])
    vals = _SDDMM.apply(Uc, Vc, P)
    return from_pattern(P, vals)


