"""The rule table: one propagation rule per ATen operator overload.

Rules are registered by op family (see ``asd/detection/rules``). ``register_rule`` accepts an
overload (``aten.mul.Tensor``) or a whole packet (``aten.mul``, expanded to all overloads) and
refuses a second rule for the same overload.

A rule is a function ``rule(call) -> list`` that returns, for each tensor output of the op (in
flattened output order), its index-set matrix (``scipy.sparse.csr_matrix``, one row per output
element) or ``None`` for an output that depends on no input. Integer and boolean outputs are
given empty sets by the tracer whatever the rule says.

Every rule also carries a second-order class used by Hessian tracing:

``"zero"``      the derivative is zero almost everywhere (comparisons, sign, rounding, indices)
``"linear"``    linear in every differentiable operand (movement, sums, adds, convolutions with a
                constant filter): no second-order terms
``"bilinear"``  linear in each operand separately (mul, mm, conv of two traced tensors): cross
                terms between operands, no squares
``"nonlinear"`` anything else: every pair of dependencies of an output may interact
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

OpLike = "torch._ops.OpOverload | torch._ops.OpOverloadPacket"

SECOND_ORDER = ("zero", "linear", "bilinear", "nonlinear")


@dataclass(frozen=True)
class Rule:
    """A registered propagation rule."""

    op: torch._ops.OpOverload
    fn: Callable
    second_order: str
    family: str


RULES: dict[torch._ops.OpOverload, Rule] = {}


def _overloads(op) -> list[torch._ops.OpOverload]:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    raise TypeError(f"expected an ATen OpOverload or OpOverloadPacket, got {op!r}")


def register_rule(
    ops: Iterable | object,
    fn: Callable,
    *,
    second_order: str = "nonlinear",
    family: str = "",
    replace: bool = False,
) -> None:
    """Register ``fn`` as the rule of every overload of ``ops``.

    Parameters
    ----------
    ops
        An op, a packet, or an iterable of them. Missing ops (``None``) are skipped, so that
        families can list ops that only exist in some torch versions.
    fn
        The rule, ``fn(call) -> list[csr_matrix | None]``.
    second_order
        One of ``"zero"``, ``"linear"``, ``"bilinear"``, ``"nonlinear"``.
    family
        Name of the family (module) registering the rule, for coverage reports.
    replace
        Allow overriding an existing rule (for users patching a rule; never used internally).
    """
    if second_order not in SECOND_ORDER:
        raise ValueError(f"second_order must be one of {SECOND_ORDER}, got {second_order!r}")
    if isinstance(ops, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ops = [ops]
    for op in ops:
        if op is None:
            continue
        for overload in _overloads(op):
            if overload in RULES and not replace:
                raise ValueError(f"a rule for {overload} is already registered ({RULES[overload].family})")
            RULES[overload] = Rule(overload, fn, second_order, family)


def aten_ops(*names: str) -> list:
    """``aten.<name>`` packets for the names that exist in this torch build."""
    out = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            out.append(packet)
    return out


def lookup(op: torch._ops.OpOverload) -> Rule | None:
    """The rule registered for ``op``, or ``None``."""
    _ensure_loaded()
    return RULES.get(op)


_LOADED = False


def _ensure_loaded() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        from . import rules  # noqa: F401  (registers every family)
