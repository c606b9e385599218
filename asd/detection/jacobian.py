"""Jacobian sparsity patterns from index-set tracing."""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from ..errors import InputError
from . import sets as S
from .tracer import TracedTensor, trace


def check_input(x) -> None:
    """Raise :class:`InputError` unless ``x`` is a real floating-point tensor."""
    if not isinstance(x, torch.Tensor):
        raise InputError(f"x must be a torch.Tensor, got {type(x).__name__}; wrap it with torch.as_tensor")
    if x.is_complex():
        raise InputError(f"x has complex dtype {x.dtype}; asd differentiates real functions: split the "
                         "input into real and imaginary parts (torch.view_as_real)")
    if not x.is_floating_point():
        raise InputError(f"x has dtype {x.dtype}; derivatives need a floating-point input: pass x.double() "
                         "or x.float()")
    if x.layout != torch.strided:
        raise InputError(f"x has layout {x.layout}; pass a dense tensor (x.to_dense())")


def output_sets(y, n: int) -> sp.csr_matrix:
    """Index sets of the traced output ``y`` (a tensor), as a bool CSR of shape (y.numel(), n)."""
    if not isinstance(y, torch.Tensor):
        raise InputError(
            f"the function returned {type(y).__name__}; it must return a tensor (stack or "
            "concatenate several outputs into one)"
        )
    if y.is_complex() or not y.is_floating_point():
        raise InputError(f"the function returned a tensor of dtype {y.dtype}; its Jacobian needs a "
                         "real floating-point output (integer and boolean outputs have zero derivative)")
    if isinstance(y, TracedTensor):
        return y.sets
    return S.empty(y.numel(), n)


def jacobian_sparsity(f: Callable, x: torch.Tensor, *, local: bool = False, strict: bool = False) -> sp.csr_array:
    """Sparsity pattern of the Jacobian of ``f`` at (``local=True``) or around (global) ``x``.

    Parameters
    ----------
    f
        A function of one tensor returning one tensor.
    x
        The input; only its shape, dtype and device matter under global tracing.
    local
        Trace with ``x``'s values: value-dependent ops (``relu``, ``max``, ``where`` with a computed
        mask) then give the pattern at this point, which can be sparser than the global one.
    strict
        Raise :class:`asd.errors.UnsupportedOpError` on an op without a rule instead of warning.

    Returns
    -------
    scipy.sparse.csr_array
        Boolean pattern of shape ``(f(x).numel(), x.numel())`` in row-major flattening.

    Raises
    ------
    asd.TracingError
        When ``f`` needs values under global tracing (control flow on the input, ``.item()``,
        data-dependent shapes); the message says to pass ``local=True``.
    """
    check_input(x)
    y, tracer = trace(f, x, local=local, strict=strict)
    sets = output_sets(y, x.numel())
    out = sp.csr_array((np.ones(sets.nnz, dtype=bool), sets.indices.copy(), sets.indptr.copy()), shape=sets.shape)
    return out
