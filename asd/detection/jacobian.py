"""Jacobian sparsity patterns from index-set tracing."""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch
from torch.utils._pytree import tree_flatten

from ..errors import InputError
from ..patterns import SparsityPattern
from . import sets as S
from ._core import TracedTensor
from .torch_tracer import TraceInfo, Tracer, traced_call

__all__ = ["TraceInfo", "check_input", "jacobian_pattern", "jacobian_sparsity", "output_sets", "pattern_of_sets",
           "traced_sets"]


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


def traced_sets(t: torch.Tensor, tracer: Tracer) -> sp.csr_matrix:
    """Index sets of a traced result of ``f`` as reverse mode sees it (none if autograd does not
    track it: computed under ``no_grad`` or detached)."""
    if isinstance(t, TracedTensor):
        if t.requires_grad:  # f ran with gradients recorded: a tracked result requires grad
            return t.sets
        if t.sets.nnz:
            tracer.no_grad_cut = True
    return S.empty(t.numel(), tracer.n)


def output_sets(y, tracer: Tracer) -> sp.csr_matrix:
    """Index sets of the traced output ``y`` (a tensor or a pytree of tensors), one row per element.

    Pytree outputs are flattened with ``torch.utils._pytree.tree_flatten``; the rows of all tensor
    leaves are concatenated in that order (each leaf row-major). Non-tensor leaves are ignored."""
    if isinstance(y, torch.Tensor):
        leaves = [y]
    else:
        leaves = [t for t in tree_flatten(y)[0] if isinstance(t, torch.Tensor)]
        if not leaves:
            raise InputError(
                f"the function returned {type(y).__name__} without any tensor; it must return a tensor "
                "or a pytree (tuple, list, dict) of tensors"
            )
    mats = []
    for i, t in enumerate(leaves):
        where = "" if len(leaves) == 1 and isinstance(y, torch.Tensor) else f" (output leaf {i})"
        if t.is_complex() or not t.is_floating_point():
            raise InputError(f"the function returned a tensor of dtype {t.dtype}{where}; its Jacobian needs "
                             "a real floating-point output (integer and boolean outputs have zero "
                             "derivative: leave them out, or convert with .double())")
        mats.append(traced_sets(t, tracer))
    return S.vstack(mats) if len(mats) > 1 else mats[0]


def pattern_of_sets(sets: sp.csr_matrix, input_shape=None, output_shape=None) -> SparsityPattern:
    """The frozen pattern of a finished trace's set matrix. Its index arrays are handed over (made
    read-only, not copied): nothing may write to ``sets`` afterwards."""
    if not sets.has_canonical_format:  # a user rule may return unsorted or repeated indices
        sets = sets.tocsr(copy=True)
        sets.sum_duplicates()
    arrays = []
    for a in (sets.indptr, sets.indices):
        a = np.ascontiguousarray(a, dtype=np.int64)
        a.setflags(write=False)
        arrays.append(a)
    return SparsityPattern(sets.shape, arrays[0], arrays[1], input_shape, output_shape, _trusted=True)


def _column_block(rows: int, offset: int, n: int) -> sp.csr_matrix:
    return S._csr(np.arange(rows + 1, dtype=S.INDEX), np.arange(offset, offset + rows, dtype=S.INDEX), (rows, n))


def trace_inputs(f: Callable, xs: tuple, selected: tuple[int, ...], *, local: bool, strict: bool,
                 tracer_cls=Tracer):
    """Trace ``f(*xs)`` with the inputs at ``selected`` traced (their elements numbered
    consecutively, in order) and the others passed as constants. Returns (output, tracer, offsets)."""
    sizes = [xs[i].numel() for i in selected]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    n = int(offsets[-1])
    device = xs[selected[0]].device if selected else None

    def run(tracer):
        args = list(xs)
        for k, i in enumerate(selected):
            args[i] = tracer.input(xs[i], _column_block(xs[i].numel(), int(offsets[k]), n))
        return f(*args)

    out, tracer = traced_call(lambda: tracer_cls(n, local=local, strict=strict, device=device), run)
    return out, tracer, offsets


def _is_index(i) -> bool:
    return isinstance(i, int) and not isinstance(i, bool)


def _check_argnums(argnums) -> None:
    if argnums is None or _is_index(argnums):
        return
    if not isinstance(argnums, (tuple, list)) or not all(_is_index(i) for i in argnums):
        raise TypeError(f"argnums must be None, an int or a tuple of ints (positions in the tuple x), got "
                        f"{argnums!r}")
    if not argnums:
        raise InputError("argnums is an empty tuple; name at least one input to differentiate, or pass None")


def _normalize(x, argnums):
    """(inputs tuple, selected indices, whether to return a tuple)."""
    _check_argnums(argnums)
    if isinstance(x, torch.Tensor) or not isinstance(x, (tuple, list)):
        if argnums not in (None, 0, (0,), [0]):
            raise InputError(f"argnums={argnums!r} needs x to be a tuple of tensors (a single tensor is "
                             "input 0)")
        check_input(x)
        return (x,), (0,), False
    xs = tuple(x)
    if not xs:
        raise InputError("x is an empty tuple; pass at least one tensor")
    if argnums is None:
        selected, as_tuple = tuple(range(len(xs))), True
    elif _is_index(argnums):
        selected, as_tuple = (argnums,), False
    else:
        selected, as_tuple = tuple(argnums), True
    for i in selected:
        if not -len(xs) <= i < len(xs):
            raise InputError(f"argnums entry {i} is out of range for {len(xs)} inputs (valid: "
                             f"{-len(xs)} to {len(xs) - 1})")
    normalized = tuple(i % len(xs) for i in selected)
    if len(set(normalized)) != len(normalized):
        raise InputError(f"argnums={argnums!r} names an input twice; list each input once")
    selected = normalized
    for i in selected:
        try:
            check_input(xs[i])
        except InputError as exc:
            raise InputError(f"input {i}: {exc}") from None
    return xs, selected, as_tuple


def jacobian_pattern(f: Callable, x, *, argnums=None, local: bool = False, strict: bool = False,
                     return_info: bool = False):
    """The Jacobian sparsity pattern of ``f`` as a frozen :class:`asd.patterns.SparsityPattern`.

    Arguments as for :func:`jacobian_sparsity`, which returns the same structure as scipy arrays.
    The pattern's ``input_shape`` is the shape of the input its columns number, its
    ``output_shape`` the shape of ``f``'s output (``(m,)`` for a pytree of outputs). For a tuple
    ``x`` the result is a tuple of patterns, one per selected input (a single pattern for an int
    ``argnums``). With ``return_info=True`` the result is ``(pattern, info)``, ``info`` a
    :class:`asd.detection.torch_tracer.TraceInfo` (ops seen, writes into the input, no-grad cuts,
    autograd calls).
    """
    xs, selected, as_tuple = _normalize(x, argnums)
    y, tracer, offsets = trace_inputs(f, xs, selected, local=local, strict=strict)
    sets = output_sets(y, tracer)
    out_shape = tuple(y.shape) if isinstance(y, torch.Tensor) else None
    if len(selected) == 1 and not as_tuple:
        result = pattern_of_sets(sets, tuple(xs[selected[0]].shape), out_shape)
    else:
        sets = sets.tocsc()
        blocks = tuple(pattern_of_sets(S._canonical(sets[:, int(offsets[k]):int(offsets[k + 1])]),
                                       tuple(xs[i].shape), out_shape)
                       for k, i in enumerate(selected))
        result = blocks if as_tuple else blocks[0]
    return (result, tracer.info()) if return_info else result


def jacobian_sparsity(f: Callable, x, *, argnums=None, local: bool = False, strict: bool = False):
    """Sparsity pattern of the Jacobian of ``f`` at (``local=True``) or around (global) ``x``.

    Parameters
    ----------
    f
        A function of one tensor (or of several: ``f(*x)`` when ``x`` is a tuple) returning a
        tensor or a pytree of tensors. Pytree outputs are flattened with ``tree_flatten`` and the
        rows of their tensor leaves concatenated in that order, each leaf row-major.
    x
        The input tensor, or a tuple of input tensors. Only shapes, dtypes and devices matter under
        global tracing. Parameters of a ``torch.nn.Module`` called inside ``f`` are constants.
    argnums
        With a tuple ``x``: which inputs to differentiate with respect to (an int gives one pattern,
        a tuple a tuple of patterns; default: all, as a tuple). The other inputs are constants.
    local
        Trace with ``x``'s values: value-dependent ops (``relu``, ``max``, ``where`` with a computed
        mask, ``sort``, max pooling) then give the pattern at this point, which can be sparser than
        the global one.
    strict
        Raise :class:`asd.errors.UnsupportedOpError` on an op without a rule instead of warning.

    Returns
    -------
    scipy.sparse.csr_array or tuple of them
        Boolean pattern of shape ``(number of output elements, x.numel())`` in row-major
        flattening; for a tuple ``x``, one pattern per selected input (its columns are that input's
        elements).

    Raises
    ------
    asd.TracingError
        When ``f`` needs values under global tracing (control flow on the input, ``.item()``,
        ``.tolist()``, numpy conversion, data-dependent shapes); the message says to pass
        ``local=True``.
    asd.errors.InputError
        For integer, complex or sparse inputs, or an output that is not a floating-point tensor.
    """
    P = jacobian_pattern(f, x, argnums=argnums, local=local, strict=strict)
    return tuple(p.to_scipy() for p in P) if isinstance(P, tuple) else P.to_scipy()
