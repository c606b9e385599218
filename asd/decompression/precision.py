"""How much rounding substitution may have put into the values it solved for.

Substitution (acyclic colorings) solves each entry as a compressed product minus entries solved
before it, so an entry inherits the rounding of every entry it was solved from: where one large
entry feeds a chain of small ones, the small ones lose the digits of the ratio (direct
decompression reads each entry from one product and keeps them all). The bound of
:func:`~asd.decompression._substitution_kernels.rounding_excess` (linear in the chain, so
pessimistic on long chains of alike entries) is judged per entry against the scale of the smaller
of its two rows, as the probe judges a row (:mod:`asd.checks`): an entry is also its mirror in the
small row, which direct decompression would have kept to that row's digits. A row far below the
largest (``eps ** 0.6``) counts at that floor. Operators judge every call's values: the rounding
follows the values, and a point where a large entry feeds small ones may come at any call.
"""

from __future__ import annotations

from typing import Callable

import warnings

import numpy as np
import torch

from .plans import SubstitutionPlan

__all__ = ["excess_arguments", "substitution_excess", "warn_lost_precision", "judge_substitution"]


def excess_arguments(pattern, dtype: torch.dtype, arithmetic: torch.dtype | float | None = None) -> tuple:
    """What :func:`~asd.decompression._substitution_kernels.rounding_excess` reads beside the plan
    and the values: the pattern's row pointers, column indices and the row of every entry (int64),
    ``eps`` of ``dtype``, the tolerance of a row at that ``eps`` and the power of the floor of a
    row's scale (``eps ** power`` of the largest).

    ``arithmetic``: the least precise dtype ``f`` computes in (or its eps), where coarser than ``dtype``. The
    products then carry its rounding, and so do the entries of a direct decompression: the bound
    and the tolerance are taken at its ``eps``, as good as ``f`` allows. The floor stays that of
    ``dtype``: a row far below the largest keeps its own digits in a direct decompression, where
    substitution may feed it the rounding of a large row."""
    from ..checks import ROW_FLOOR_POWER, tolerance_of

    eps = float(torch.finfo(dtype).eps)
    power = ROW_FLOOR_POWER
    coarse = (eps if arithmetic is None else float(arithmetic) if isinstance(arithmetic, float)
              else float(torch.finfo(arithmetic).eps))
    if coarse > eps:
        power = ROW_FLOOR_POWER * np.log(eps) / np.log(coarse)  # coarse ** power == eps ** ROW_FLOOR_POWER
        eps = coarse
    return (np.asarray(pattern.indptr, dtype=np.int64), np.asarray(pattern.indices, dtype=np.int64),
            np.asarray(pattern.rows, dtype=np.int64), eps, tolerance_of(eps), float(power))


def substitution_excess(plan: SubstitutionPlan, pattern, values: torch.Tensor,
                        arithmetic: torch.dtype | float | None = None) -> float:
    """The largest ratio, over the stored entries, of substitution's rounding bound to the error
    the probe accepts in the entry's rows (``10 sqrt(eps)`` of their scale, ``eps`` that of the
    values' dtype or of the coarser ``arithmetic`` of ``f``): above 1, some entries may be wrong
    beyond what a check tolerates (at most 1 where none may be; entries that are not finite are the
    probe's)."""
    from ._substitution_kernels import rounding_excess

    if not values.is_floating_point() or values.numel() == 0 or values.device.type == "meta":
        return 0.0  # no values to judge (the meta device checks shapes only)
    indptr, indices, rows, eps, tol, power = excess_arguments(pattern, values.dtype, arithmetic)
    worst = 0.0
    for v in primal_rows(values, len(indices)):
        v = np.ascontiguousarray(v.to("cpu", torch.float64).numpy())
        worst = max(worst, float(rounding_excess(v, indptr, indices, rows, plan.step_pos, plan.step_pos_t,
                                                 plan.dep_ptr, plan.dep_pos, eps, tol, power)))
    return worst


def primal_rows(values: torch.Tensor, nnz: int) -> torch.Tensor:
    """The plain values under ``values`` as rows of ``nnz`` (one row, or one per element of a
    ``vmap`` batch): a value inside ``vmap`` is unwrapped, a forward-mode dual tensor gives its
    primal and its tangent (solved by the same substitution). Raises :class:`asd.InputError` where the values cannot be read (inside ``jacrev``,
    ``grad`` or ``jacfwd``, whose layers hold no storage, or batched by nested ``vmap``)."""
    import torch.autograd.forward_ad as fwAD

    from ..errors import InputError

    functorch = torch._C._functorch
    t, bdims = values, []
    while functorch.is_functorch_wrapped_tensor(t):  # (a live wrapper: its batch dimension is known)
        if functorch.is_batchedtensor(t):
            bdims.append(functorch.maybe_get_bdim(t))
        t = functorch.get_unwrapped(t)
    parts = [t]
    if torch.autograd.forward_ad._current_level >= 0:
        # the tangent goes through the same substitution: its rounding is bounded as the values' is
        primal, tangent = fwAD.unpack_dual(t)
        parts = [primal] if tangent is None else [primal, tangent]
    parts = [p.detach() for p in parts]
    if not any(_storage_less(p) for p in parts):
        if not bdims and all(p.numel() == nnz for p in parts):
            return torch.cat([p.reshape(1, nnz) for p in parts])
        if len(bdims) == 1 and all(p.dim() == 2 and p.shape[1 - bdims[0]] == nnz for p in parts):
            return torch.cat([p.movedim(bdims[0], 0) for p in parts])
    raise InputError("the rounding of substitution (coloring='acyclic') cannot be bounded for values computed "
                     "inside this torch.func transform (jacrev, grad, jacfwd or nested vmap keep the values where "
                     "they cannot be read): prepare the Hessian with coloring='star', whose entries are read directly")


def _storage_less(t: torch.Tensor) -> bool:
    try:
        t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return True
    return False


def warn_lost_precision(excess: float, *, switched: tuple[int, int] | None = None, stacklevel: int = 2,
                        nonfinite: bool = False) -> None:
    """An :class:`asd.PrecisionWarning` for a :func:`substitution_excess` above 1: the operator
    decompresses with a star coloring from now on (``switched``: its number of colors and the
    acyclic one's), or it keeps the acyclic coloring it was given."""
    from ..errors import PrecisionWarning

    if nonfinite:
        said = ("asd: some Hessian entries at this x are NaN or infinite, and substitution (the acyclic coloring) "
                "carries each into the entries solved from it, which may be finite; ")
    else:
        said = (f"asd: substitution (the acyclic coloring) may have put rounding up to {excess:.3g} times what a "
                "check tolerates into some Hessian entries at this x (a large entry feeds a chain of small ones); ")
    if switched is None:
        said += "coloring='star' decompresses each entry directly"
    else:
        said += f"the operator now decompresses directly with a star coloring ({switched[0]} colors instead of {switched[1]})"
    warnings.warn(said, PrecisionWarning, stacklevel=stacklevel + 1)


def judge_substitution(plan: SubstitutionPlan, pattern, values: torch.Tensor, ncolors: int,
                       recolor: Callable[[], int] | None = None, *, stacklevel: int = 2,
                       excess: float | None = None, arithmetic: torch.dtype | float | None = None) -> bool:
    """Judge substitution's rounding of ``values`` (:func:`substitution_excess`, with the coarser
    ``arithmetic`` of ``f`` where it has one, or ``excess`` where the decompression has bounded it
    already): beyond what a check tolerates, warn (:func:`warn_lost_precision`) and, where the
    operator may color again, call ``recolor`` (it sets up a star coloring and returns its number
    of colors). ``True`` where it did: the values at hand come from the old coloring."""
    if excess is None:
        excess = substitution_excess(plan, pattern, values, arithmetic)
    # a NaN or infinite entry (a NaN derivative at x) is spread by substitution into the entries solved
    # from it, which direct decompression keeps finite (entry by entry: a sum of finite values may overflow)
    nonfinite = (values.is_floating_point() and values.numel() > 0 and values.device.type != "meta"
                 and not bool(torch.isfinite(primal_rows(values, len(pattern.indices))).all()))
    if excess <= 1.0 and not nonfinite:
        return False
    if recolor is None:
        warn_lost_precision(excess, stacklevel=stacklevel + 1, nonfinite=nonfinite)
        return False
    warn_lost_precision(excess, switched=(recolor(), ncolors), stacklevel=stacklevel + 1, nonfinite=nonfinite)
    return True
