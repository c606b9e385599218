"""Substitution decompression (acyclic colorings) on torch tensors.

``substitute(plan, compressed)`` returns the values of the stored entries in CSR order from
the compressed product ``B`` (any shape whose flattening is the plan's batch-first buffer).

* Generic path (any device, float32/float64, differentiable): level by level - every level is
  one gather from ``B``, one ``index_add`` of the already solved dependencies, and two
  scatters (both triangles).  The plan's index tensors are cached per device.
* CPU fast path (``fast=None`` picks it on CPU tensors that need no grad): the Numba kernel of
  :mod:`asd.coloring` (imported lazily; this module never imports numba itself).

Plan arrays (see :class:`asd.coloring.DecompressionPlan`): ``step_pos``, ``step_pos_t``,
``step_src`` (per step), ``dep_ptr``/``dep_pos``/``dep_step`` (dependencies, CSR-like by step),
``level_ptr`` (steps of level ``l`` are ``level_ptr[l]:level_ptr[l+1]``).
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["substitute", "prepare_substitution", "PreparedSubstitution"]


class PreparedSubstitution:
    """Index tensors of a substitution plan on one device, split by level."""

    def __init__(self, plan, device):
        if plan.kind != "substitution":
            raise ValueError(f"plan kind {plan.kind!r} is not 'substitution'")
        dev = torch.device(device)
        self.device = dev
        self.nnz = int(plan.nnz)
        self.size = int(plan.compressed_size)
        lp = [int(x) for x in plan.level_ptr]
        dp = plan.dep_ptr

        def t(a):
            return torch.as_tensor(a, dtype=torch.int64).to(dev)

        pos, pos_t, src = t(plan.step_pos), t(plan.step_pos_t), t(plan.step_src)
        dep_pos, dep_step = t(plan.dep_pos), t(plan.dep_step)
        self.levels = []
        for lvl in range(len(lp) - 1):
            a, b = lp[lvl], lp[lvl + 1]
            da, db = int(dp[a]), int(dp[b])
            deps = None
            if db > da:
                deps = (dep_pos[da:db], dep_step[da:db] - a)
            self.levels.append((pos[a:b], pos_t[a:b], src[a:b], deps))


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def prepare_substitution(plan, device="cpu") -> PreparedSubstitution:
    """Plan index tensors on ``device`` (cached per plan and device)."""
    per_plan = _CACHE.setdefault(plan, {})
    key = str(torch.device(device))
    prep = per_plan.get(key)
    if prep is None:
        prep = per_plan[key] = PreparedSubstitution(plan, device)
    return prep


def _levelwise(prep: PreparedSubstitution, flat: torch.Tensor) -> torch.Tensor:
    out = flat.new_zeros(prep.nnz)
    for pos, pos_t, src, deps in prep.levels:
        v = flat.index_select(0, src)
        if deps is not None:
            dep_pos, dep_local = deps
            v = v.index_add(0, dep_local, out.index_select(0, dep_pos), alpha=-1)
        out = out.index_copy(0, pos, v).index_copy(0, pos_t, v)
    return out


def substitute(plan, compressed: torch.Tensor, *, fast: bool | None = None) -> torch.Tensor:
    """Values (CSR order, same dtype/device as ``compressed``) from the compressed product.

    ``plan``: a substitution :class:`~asd.coloring.DecompressionPlan` or a
    :class:`PreparedSubstitution`.  ``fast``: use the Numba CPU kernel (``None``: on CPU when
    no gradient is required).
    """
    if not isinstance(compressed, torch.Tensor):
        compressed = torch.as_tensor(compressed)
    flat = compressed.reshape(-1)
    prep = plan if isinstance(plan, PreparedSubstitution) else None
    raw = None if prep is not None else plan
    size = prep.size if prep is not None else int(raw.compressed_size)
    if flat.numel() != size:
        from asd.errors import DecompressionError

        raise DecompressionError(
            f"compressed buffer has {flat.numel()} elements, the plan expects {size} (batch-first layout)"
        )
    if not flat.is_floating_point():
        flat = flat.to(torch.get_default_dtype())
    if fast is None:
        fast = flat.device.type == "cpu" and not (flat.requires_grad and torch.is_grad_enabled()) and raw is not None
    if fast and raw is not None and flat.device.type == "cpu":
        from asd.coloring._substitution_kernels import substitute_numba

        vals = substitute_numba(
            flat.detach().contiguous().numpy(), raw.step_pos, raw.step_pos_t, raw.step_src,
            raw.dep_ptr, raw.dep_pos, raw.nnz,
        )
        return torch.from_numpy(vals)
    if prep is None:
        prep = prepare_substitution(raw, flat.device)
    elif prep.device != flat.device:
        raise ValueError(f"prepared plan lives on {prep.device}, compressed tensor on {flat.device}")
    return _levelwise(prep, flat)
