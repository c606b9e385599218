"""Sparse plus sparse on the union pattern, ``alpha A + beta B``."""

from __future__ import annotations

from typing import Union

import numpy as np
import torch

from asd.errors import InputError
from asd.linalg import _kernels as K
from asd.linalg._sparse import (Pattern, check_dtypes, crow_of_rows, from_pattern, key_position, position_key,
                                pattern_from_csr, values_of)

__all__ = ["add"]

Scalar = Union[float, int, torch.Tensor]


def _union_plan(PA: Pattern, PB: Pattern):
    key = ("union", id(PB))
    hit = PA._cache.get(key)
    if hit is not None and hit[0] is PB:
        return hit[1]
    ka = position_key(PA)
    kb = position_key(PB)
    keys = torch.unique(torch.cat([ka, kb]))                  # sorted: row-major CSR order
    ia = torch.searchsorted(keys, ka)
    ib = torch.searchsorted(keys, kb)
    row, col = key_position(PA, keys)
    crow = crow_of_rows(row, PA.n_rows)
    PC = pattern_from_csr(PA.layout, PA.shape, crow, col.contiguous(), PA.batch)
    PC._cache["row"] = row
    plan = (PC, ia, ib)
    PA._cache[key] = (PB, plan)
    return plan


def add(A: torch.Tensor, B: torch.Tensor, alpha: Scalar = 1, beta: Scalar = 1) -> torch.Tensor:
    """``alpha * A + beta * B`` for sparse ``A`` and ``B`` with the union pattern.

    Parameters
    ----------
    A, B : torch.Tensor
        Sparse COO or CSR tensors of one shape ``(n, m)`` or ``(Bt, n, m)`` (layouts may differ).
    alpha, beta : float or torch.Tensor
        Scalars; 0-d tensors that require grad are differentiated too.

    Returns
    -------
    torch.Tensor
        Sparse tensor in ``A``'s layout whose pattern is the union of both patterns (an entry
        stored in either is stored, even if its value cancels).  The gradient with respect to
        ``A`` is ``alpha * G ⊙ mask(A)`` in ``A``'s layout, likewise for ``B``.

    Raises
    ------
    InputError
        Shape, dtype or device mismatch; operands on ``meta`` (the size of the union pattern
        depends on index values).  On CUDA the union is computed on the device, reading back
        only its size, once per pair of patterns.
    """
    PA, va = values_of(A, "A")
    PB, vb = values_of(B, "B")
    if PA.shape != PB.shape:
        raise InputError(f"shape mismatch in add: {PA.shape} and {PB.shape}")
    if va.device != vb.device:
        raise InputError(f"A is on {va.device} but B is on {vb.device}; move both to one device")
    check_dtypes(va, vb)
    if PA.on_meta:
        raise InputError("add of sparse tensors on meta: the union pattern's size depends on the "
                         "index values, which meta tensors do not have; run it on a real device")
    PC, ia, ib = _union_plan(PA, PB)
    if torch.is_tensor(alpha) or torch.is_tensor(beta):     # differentiable scalars: plain torch
        vc = torch.zeros(PC.nnz, dtype=va.dtype, device=va.device)
        vc = vc.index_add(0, ia, alpha * va).index_add(0, ib, beta * vb)
    else:
        vc = _UnionAdd.apply(va, vb, PC, ia, ib, float(alpha), float(beta))
    return from_pattern(PC, vc)


class _UnionAdd(torch.autograd.Function):
    """``c[ia] = alpha a; c[ib] += beta b`` (indices unique per operand); backward is a gather."""

    @staticmethod
    def forward(ctx, va, vb, PC, ia, ib, alpha, beta):
        ctx.save_for_backward(ia, ib)
        ctx.ab = (alpha, beta)
        if K._use_numba(va):
            out = K._empty((PC.nnz,), va.dtype)
            K._numba().union_add(PC_np(ia, PC, "ia"), va.detach().contiguous().numpy(), alpha,
                                 PC_np(ib, PC, "ib"), vb.detach().contiguous().numpy(), beta,
                                 out.numpy())
            return out
        out = torch.zeros(PC.nnz, dtype=va.dtype, device=va.device)
        return out.index_add_(0, ia, va.detach(), alpha=alpha).index_add_(0, ib, vb.detach(), alpha=beta)

    @staticmethod
    def backward(ctx, g):
        ia, ib = ctx.saved_tensors
        alpha, beta = ctx.ab
        ga = g.index_select(0, ia) * alpha if ctx.needs_input_grad[0] else None
        gb = g.index_select(0, ib) * beta if ctx.needs_input_grad[1] else None
        return ga, gb, None, None, None, None, None


def PC_np(idx: torch.Tensor, PC: Pattern, name: str):
    """Cached unsigned numpy view of a union map (kept on the result pattern)."""
    key = "np_" + name
    a = PC._cache.get(key)
    if a is None:
        a = idx.cpu().numpy().view(np.uint64)
        PC._cache[key] = a
    return a
