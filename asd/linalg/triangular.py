"""Sparse triangular solves with sparsity-preserving gradients.

Backward (seed 004, section 3.5): ``gb = op(T)^{-T} g`` by one transposed triangular solve, and the
gradient of ``T`` is the masked outer product ``-(gb x^T) ⊙ mask(T)``, which reuses ``gb``.
"""

from __future__ import annotations

import torch

from asd.errors import InputError
from asd.linalg import _kernels as K
from asd.linalg._sparse import (Pattern, check_dense, check_dtypes, from_columns, to_columns,
                                values_of)
from asd.linalg.base import check_finite_matrix, check_finite_rhs
from asd.linalg.products import _SDDMM

__all__ = ["triangular_solve", "trisolve_values"]


class _TriSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, vals, Bm, P, lower, trans, unit):
        X = K.trsv(P, vals, Bm, lower, trans, unit)
        ctx.P, ctx.flags = P, (lower, trans, unit)
        ctx.save_for_backward(vals, X)
        return X

    @staticmethod
    def backward(ctx, G):
        vals, X = ctx.saved_tensors
        P, (lower, trans, unit) = ctx.P, ctx.flags
        graph = torch.is_grad_enabled()
        gB = (_TriSolve.apply(vals, G, P, lower, not trans, unit) if graph
              else K.trsv(P, vals, G, lower, not trans, unit))
        gv = None
        if ctx.needs_input_grad[0]:
            U, V = (gB, X) if not trans else (X, gB)
            gv = -(_SDDMM.apply(U, V, P) if graph else K.sddmm(P, U, V))
            if unit:
                gv = gv.masked_fill(P.diag_mask, 0.0)
        return gv, (gB if ctx.needs_input_grad[1] else None), None, None, None, None


def trisolve_values(P: Pattern, vals: torch.Tensor, Bm: torch.Tensor, *, lower: bool = True,
                    trans: bool = False, unit: bool = False) -> torch.Tensor:
    """Differentiable ``op(T)^{-1} B`` on flat values (``B`` of shape ``(n, k)``)."""
    return _TriSolve.apply(vals, Bm, P, lower, trans, unit)


def check_triangular(P: Pattern, upper: bool, name: str = "L") -> None:
    if P.n != P.m:
        raise InputError(f"{name} must be square for a triangular solve, got shape {P.shape}")
    if P.on_meta:                                     # no index values to check
        return
    below, above = P.triangle
    if upper and below:
        raise InputError(f"{name} has stored entries below the diagonal but upper=True; pass the "
                         f"upper triangle only (e.g. torch.triu(...).to_sparse_csr())")
    if not upper and above:
        raise InputError(f"{name} has stored entries above the diagonal but upper=False; pass the "
                         f"lower triangle only (e.g. torch.tril(...).to_sparse_csr()) or set upper=True")


def triangular_solve(L: torch.Tensor, b: torch.Tensor, upper: bool = False,
                     unit_diagonal: bool = False, transpose: bool = False) -> torch.Tensor:
    """Solve ``L x = b`` (or ``L^T x = b``) for a sparse triangular ``L``.

    Parameters
    ----------
    L : torch.Tensor
        Sparse COO or CSR, lower (or upper, with ``upper=True``) triangular, shape ``(n, n)`` or
        ``(B, n, n)``.  Entries in the other triangle are an error.
    b : torch.Tensor
        Dense right-hand side(s): ``(n,)``, ``(n, k)``, ``(B, n)`` or ``(B, n, k)``.
    upper : bool
        ``L`` is upper triangular.
    unit_diagonal : bool
        Treat the diagonal as ones: stored diagonal entries (if any) are ignored and get zero
        gradient, so a unit factor may be stored without its diagonal.
    transpose : bool
        Solve with ``L^T`` instead of ``L``.

    Returns
    -------
    torch.Tensor
        ``x`` shaped like ``b``.  The gradient with respect to ``L`` is ``-(L^{-T} g) x^T`` masked
        to ``L``'s stored entries, in ``L``'s layout.

    Raises
    ------
    InputError
        Non-square or non-triangular ``L``, a zero or missing diagonal entry (singular), NaN or
        inf in ``L``'s stored values or in ``b`` (as :func:`asd.linalg.solve`), shape, dtype or
        device mismatch.  On CUDA (cuSPARSE) a zero or missing diagonal entry is not detected:
        the result is non-finite instead.
    """
    P, vals = values_of(L, "L")
    check_triangular(P, upper)
    check_dense(b, "b", P, P.n, what="rhs")
    check_dtypes(vals, b)
    check_finite_matrix(vals, "L")
    check_finite_rhs(b)
    Bm, info = to_columns(b, P, P.n, "b")
    X = _TriSolve.apply(vals, Bm, P, not upper, transpose, unit_diagonal)
    return from_columns(X, info, P, P.n)
