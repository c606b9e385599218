"""How much rounding substitution may have put into the values it solved for.

Substitution (acyclic colorings) solves each entry as a compressed product minus entries solved
before it, so an entry inherits the rounding of every entry it was solved from: where one large
entry feeds a chain of small ones, the small ones lose the digits of the ratio (direct
decompression reads each entry from one product and keeps them all). The bound of
:func:`~asd.decompression._substitution_kernels.rounding_excess` (linear in the chain, so
pessimistic on long chains of alike entries) is judged per entry against the scale of its rows,
as the probe judges a product (:mod:`asd.checks`): a row far below the largest (``eps ** 0.6``)
counts at that floor.
"""

from __future__ import annotations

from typing import Callable

import warnings

import numpy as np
import torch

from .plans import SubstitutionPlan

__all__ = ["substitution_excess", "warn_lost_precision", "judge_substitution"]


def substitution_excess(plan: SubstitutionPlan, pattern, values: torch.Tensor) -> float:
    """The largest ratio, over the stored entries, of substitution's rounding bound to the error
    the probe accepts in the entry's rows (``10 sqrt(eps)`` of their scale): above 1, some entries
    may be wrong beyond what a check tolerates. 0 for values that are not finite (the probe's)."""
    from ..checks import ROW_FLOOR_POWER, tolerance_of
    from ._substitution_kernels import rounding_excess

    if not values.is_floating_point() or values.numel() == 0 or values.device.type == "meta":
        return 0.0  # no values to judge (the meta device checks shapes only)
    v = values.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(v).all():
        return 0.0
    eps = float(torch.finfo(values.dtype).eps)
    return float(rounding_excess(v, np.asarray(pattern.indptr, dtype=np.int64),
                                 np.asarray(pattern.indices, dtype=np.int64), plan.step_pos, plan.step_pos_t,
                                 plan.dep_ptr, plan.dep_pos, eps, tolerance_of(eps), ROW_FLOOR_POWER))


def warn_lost_precision(excess: float, *, switched: tuple[int, int] | None = None, stacklevel: int = 2) -> None:
    """An :class:`asd.PrecisionWarning` for a :func:`substitution_excess` above 1: the operator
    decompresses with a star coloring from now on (``switched``: its number of colors and the
    acyclic one's), or it keeps the acyclic coloring it was given."""
    from ..errors import PrecisionWarning

    said = (f"asd: substitution (the acyclic coloring) may have put rounding up to {excess:.3g} times what a check "
            "tolerates into some Hessian entries at this x (a large entry feeds a chain of small ones); ")
    if switched is None:
        said += "coloring='star' decompresses each entry directly"
    else:
        said += f"the operator now decompresses directly with a star coloring ({switched[0]} colors instead of {switched[1]})"
    warnings.warn(said, PrecisionWarning, stacklevel=stacklevel + 1)


def judge_substitution(plan: SubstitutionPlan, pattern, values: torch.Tensor, ncolors: int,
                       recolor: Callable[[], int] | None = None, *, stacklevel: int = 2) -> bool:
    """Judge substitution's rounding of ``values`` (:func:`substitution_excess`): beyond what a check
    tolerates, warn (:func:`warn_lost_precision`) and, where the operator may color again, call
    ``recolor`` (it sets up a star coloring and returns its number of colors). ``True`` where it
    did: the values at hand come from the old coloring."""
    excess = substitution_excess(plan, pattern, values)
    if excess <= 1.0:
        return False
    if recolor is None:
        warn_lost_precision(excess, stacklevel=stacklevel + 1)
        return False
    warn_lost_precision(excess, switched=(recolor(), ncolors), stacklevel=stacklevel + 1)
    return True
