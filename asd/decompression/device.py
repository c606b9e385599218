"""Decompression on torch tensors, on any device.

:class:`Decompressor` turns the flat compressed product into the values of the stored entries
(CSR order) and into a ``torch.sparse_csr`` tensor:

* :class:`~asd.decompression.plans.DirectPlan`: one ``index_select`` (keeps autograd).
* :class:`~asd.decompression.plans.SubstitutionPlan`: on a CPU tensor that needs no gradient,
  the Numba kernel; otherwise level by level (one gather from ``B``, one ``index_add`` of the
  already solved dependencies and two scatters per level; differentiable, any device).

The plan's index tensors are prepared once per (plan, device) in one cache, :func:`prepared`;
plans are immutable, so an entry can never go stale (it dies with its plan).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from functools import cached_property, singledispatch

import numpy as np
import torch

from .._fork import fork_safe
from ..errors import DecompressionError
from .plans import DirectPlan, SubstitutionPlan

__all__ = ["Decompressor", "substitute", "prepared", "clear_prepared"]


def _has_tangent(t: torch.Tensor) -> bool:
    """Whether ``t`` is a forward-mode dual tensor with a tangent at the current level."""
    return torch.autograd.forward_ad._current_level >= 0 and torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def _carries_derivatives(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``torch.func`` transform's wrapped tensor or a forward-mode dual tensor:
    its values are solved by torch's differentiable substitution, not by the Numba walk (which
    would drop the tangent, the batch, the gradient)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t) or _has_tangent(t)


def handed_out(t: torch.Tensor) -> torch.Tensor:
    """An index tensor of the decompressor's for a result the caller owns: a copy-on-write clone
    (``torch._lazy_clone``: no copy until someone writes into either), so that a caller who edits
    a returned CSR's indices, through PyTorch or numpy, edits their own and never a later result's.
    Where PyTorch cannot make one (memory it did not allocate), a copy."""
    try:
        return torch._lazy_clone(t)
    except (AttributeError, RuntimeError, NotImplementedError):
        return t.clone()


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` read the same memory, without materializing a copy-on-write clone
    (``data_ptr()`` is a write access: it would copy)."""
    return a.const_data_ptr() == b.const_data_ptr()


def _t(a, device) -> torch.Tensor:
    # in memory PyTorch allocated (torch.tensor copies, once): numpy's cannot be cloned copy-on-write
    return torch.tensor(a, dtype=torch.int64, device=device)


@dataclass(frozen=True, eq=False)
class PreparedGather:
    """A direct plan's gather index on one device."""

    index: torch.Tensor
    size: int


@dataclass(frozen=True, eq=False)
class PreparedSubstitution:
    """A substitution plan's index tensors on one device, split by level (not the plan itself: the
    cache of :func:`prepared` is weak on the plan, and a value holding its key would never die)."""

    levels: tuple
    size: int
    nnz: int


@singledispatch
def _prepare(plan, device):
    raise TypeError(f"no device decompression for {type(plan).__name__}")


@_prepare.register
def _(plan: DirectPlan, device) -> PreparedGather:
    return PreparedGather(_t(plan.gather, device), plan.compressed_size)


@_prepare.register
def _(plan: SubstitutionPlan, device) -> PreparedSubstitution:
    leveled = plan.leveled
    lp = [int(v) for v in leveled.level_ptr]
    dp = leveled.dep_ptr
    pos, pos_t, src = _t(leveled.step_pos, device), _t(leveled.step_pos_t, device), _t(leveled.step_src, device)
    dep_pos, dep_step = _t(leveled.dep_pos, device), _t(leveled.dep_step, device)
    levels = []
    for lvl in range(len(lp) - 1):
        a, b = lp[lvl], lp[lvl + 1]
        da, db = int(dp[a]), int(dp[b])
        deps = (dep_pos[da:db], dep_step[da:db] - a) if db > da else None
        levels.append((pos[a:b], pos_t[a:b], src[a:b], deps))
    return PreparedSubstitution(tuple(levels), plan.compressed_size, plan.nnz)


_PREPARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = fork_safe(threading.Lock())


def prepared(plan, device):
    """The plan's index tensors on ``device``: built once per (plan, device), kept while the plan lives."""
    key = str(torch.device(device))
    with _LOCK:
        per_plan = _PREPARED.setdefault(plan, {})
        prep = per_plan.get(key)
    if prep is None:
        prep = _prepare(plan, torch.device(device))
        with _LOCK:
            prep = per_plan.setdefault(key, prep)
    return prep


def clear_prepared() -> None:
    """Drop every prepared plan (they are rebuilt on the next use)."""
    with _LOCK:
        _PREPARED.clear()


def _levelwise(prep: PreparedSubstitution, flat: torch.Tensor) -> torch.Tensor:
    out = flat.new_zeros(prep.nnz)
    for pos, pos_t, src, deps in prep.levels:
        v = flat.index_select(0, src)
        if deps is not None:
            dep_pos, dep_local = deps
            v = v.index_add(0, dep_local, out.index_select(0, dep_pos), alpha=-1)
        out = out.index_copy(0, pos, v).index_copy(0, pos_t, v)
    return out


def _check_size(flat: torch.Tensor, size: int) -> None:
    if flat.numel() != size:
        raise DecompressionError(f"compressed buffer has {flat.numel()} elements, the plan expects {size} "
                                 "(batch-first layout)")


def substitute(plan: SubstitutionPlan, compressed, *, fast: bool | None = None) -> torch.Tensor:
    """Values (CSR order, ``compressed``'s dtype and device) of a substitution plan.

    ``fast``: use the Numba CPU kernel (``None``: on the CPU when no gradient is required).
    """
    if not isinstance(compressed, torch.Tensor):
        compressed = torch.as_tensor(compressed)
    flat = compressed.reshape(-1)
    _check_size(flat, plan.compressed_size)
    if not flat.is_floating_point():
        flat = flat.to(torch.get_default_dtype())
    if fast is None:
        fast = (flat.device.type == "cpu" and not (flat.requires_grad and torch.is_grad_enabled())
                and not _carries_derivatives(flat))
    if fast and flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64):
        from ._substitution_kernels import substitute_numba

        return torch.from_numpy(substitute_numba(flat.detach().contiguous().numpy(), plan))
    return _levelwise(prepared(plan, flat.device), flat)


class Decompressor:
    """A coloring's decompression plan and CSR structure as index tensors on one device.

    Parameters
    ----------
    coloring
        An :class:`asd.coloring.Coloring` (its ``plan`` and ``pattern`` are used).
    device
        Where the compressed products will live.
    bounds
        Whether the CPU substitution also bounds its rounding (:meth:`excess`); an operator that
        screens no call (``check=False``) leaves it out.
    """

    def __init__(self, coloring, device: torch.device | str, *, bounds: bool = True,
                 arithmetic: torch.dtype | None = None):
        self.device = torch.device(device)
        self.shape = tuple(coloring.shape)
        self.plan = coloring.plan
        self.size = int(self.plan.compressed_size)
        self.crow = _t(coloring.indptr, self.device)
        self.col = _t(coloring.indices, self.device)
        self._pattern = coloring.pattern
        # a direct plan's gather index now; a substitution plan's level-wise tensors only if the
        # level-wise path runs (off the CPU): on the CPU the Numba kernel reads the plan itself, and
        # a long elimination tree has tens of thousands of levels
        self.index = prepared(self.plan, self.device).index if isinstance(self.plan, DirectPlan) else None
        self.bounds = bounds
        #: the least precise dtype the products were computed in, where coarser than the values'
        #: (``f`` computing in float32 on a float64 input): substitution's rounding is bounded at its eps
        self.arithmetic = arithmetic
        self._excess_args: dict = {}
        self._judged: tuple | None = None

    @cached_property
    def rows(self) -> torch.Tensor:
        """The row of every stored entry (CSR order), on the device: built on first use (the probe
        reads it, evaluation does not)."""
        return _t(self._pattern.rows, self.device)

    def values(self, compressed: torch.Tensor) -> torch.Tensor:
        """Values of the stored entries, in CSR order, from the flat compressed buffer."""
        flat = compressed.reshape(-1)
        _check_size(flat, self.size)
        if self.index is not None:
            return flat.index_select(0, self.index)
        if (self.bounds and flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64)
                and not (flat.requires_grad and torch.is_grad_enabled()) and not _carries_derivatives(flat)):
            from ._substitution_kernels import substitute_screened
            from .precision import excess_arguments

            args = self._excess_args.get(flat.dtype)
            if args is None:
                args = self._excess_args[flat.dtype] = excess_arguments(self._pattern, flat.dtype, self.arithmetic)
            out, excess = substitute_screened(flat.detach().numpy(), self.plan, *args)
            vals = torch.from_numpy(out)
            # the bound of the walk that solved these values: theirs while they are this very tensor,
            # unwritten since (its version counter)
            self._judged = (weakref.ref(vals), vals._version, float(excess))
            return vals
        return substitute(self.plan, flat).to(compressed.dtype)

    def excess(self, values: torch.Tensor) -> float:
        """Substitution's rounding in ``values``
        (:func:`asd.decompression.precision.substitution_excess`): the bound of the walk that
        solved them, where they are the latest values this decompressor returned and nothing has
        written into them since, otherwise bounded anew."""
        from .precision import substitution_excess

        judged = self._judged
        if judged is not None and judged[0]() is values and values._version == judged[1]:
            return judged[2]
        return substitution_excess(self.plan, self._pattern, values, self.arithmetic)

    def csr(self, values: torch.Tensor) -> torch.Tensor:
        """A ``torch.sparse_csr`` tensor with this pattern and ``values``."""
        if _has_tangent(values):
            from ..errors import InputError

            raise InputError("a torch.sparse_csr tensor cannot carry forward-mode tangents (PyTorch has no forward AD for "
                             "sparse compressed tensors): call the operator's .values(x), whose tangent is the values' "
                             "derivative along x's tangent, and build the matrix from op.pattern")
        crow, col = handed_out(self.crow), handed_out(self.col)
        if values.device == self.crow.device:  # dtype= and device= would cost a third of the call
            return torch.sparse_csr_tensor(crow, col, values, size=self.shape, check_invariants=False)
        return torch.sparse_csr_tensor(crow, col, values, size=self.shape, dtype=values.dtype,
                                       device=values.device, check_invariants=False)

    def __call__(self, compressed: torch.Tensor) -> torch.Tensor:
        return self.csr(self.values(compressed))
