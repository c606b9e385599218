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

Two optional refinements make the second-order class precise where an op is linear in some of its
operands or only some operand elements interact (both are data on the rule, read by
:mod:`asd.detection.hessian`):

``pairs``        the argument names ``(a, b)`` whose second derivative block can be nonzero: ``(a, a)``
                 for a nonzero second derivative in ``a``, ``(a, b)`` for a nonzero cross derivative.
                 ``x / y`` is ``(("self", "other"), ("other", "other"))``: linear in ``x``. When not
                 given it follows ``second_order``: none for ``"zero"``/``"linear"``, every pair of
                 distinct tensor arguments for ``"bilinear"``, every pair for ``"nonlinear"``.
``interaction``  which operand *elements* interact: ``"output"`` (default, always sound): elements
                 feeding the same output element; ``"contraction"`` (matrix products, given with
                 ``pairs=((A, B),)``): only ``A[b, i, l]`` with ``B[b, l, j]``, the pairs that are
                 multiplied; ``"multilinear"`` (``prod``): distinct elements of one output, never an
                 element with itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

OpLike = "torch._ops.OpOverload | torch._ops.OpOverloadPacket"

SECOND_ORDER = ("zero", "linear", "bilinear", "nonlinear")
INTERACTIONS = ("output", "contraction", "multilinear")


@dataclass(frozen=True)
class Rule:
    """A registered propagation rule."""

    op: torch._ops.OpOverload
    fn: Callable
    second_order: str
    family: str
    pairs: tuple[tuple[str, str], ...] | None = None
    interaction: str = "output"

    def hessian_pairs(self, names: Iterable[str]) -> tuple[tuple[str, str], ...] | None:
        """Argument pairs with a possibly nonzero second-derivative block; ``None`` means all of
        them (a general nonlinear op). ``names`` are the op's tensor-argument names in order."""
        if self.pairs is not None:
            return self.pairs
        if self.second_order in ("zero", "linear"):
            return ()
        if self.second_order == "bilinear":
            names = list(names)
            return tuple((a, b) for i, a in enumerate(names) for b in names[i + 1:])
        return None


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
    pairs: Iterable[tuple[str, str]] | None = None,
    interaction: str = "output",
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
    pairs, interaction
        Second-order refinements (see the module docstring); by default derived from
        ``second_order``.
    """
    _check_second_order(second_order, interaction)
    pairs = None if pairs is None else tuple(tuple(p) for p in pairs)
    if isinstance(ops, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ops = [ops]
    for op in ops:
        if op is None:
            continue
        for overload in _overloads(op):
            if overload in RULES and not replace:
                raise ValueError(f"a rule for {overload} is already registered ({RULES[overload].family})")
            _check_pairs(overload, pairs)
            RULES[overload] = Rule(overload, fn, second_order, family, pairs, interaction)


def refine_second_order(ops, *, second_order: str | None = None, pairs=None,
                        interaction: str = "output") -> None:
    """Set the second-order class of already registered rules (ops without a rule are skipped)."""
    if isinstance(ops, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ops = [ops]
    pairs = None if pairs is None else tuple(tuple(p) for p in pairs)
    for op in ops:
        if op is None:
            continue
        for overload in _overloads(op):
            rule = RULES.get(overload)
            if rule is None:
                continue
            so = second_order or rule.second_order
            _check_second_order(so, interaction)
            _check_pairs(overload, pairs)
            RULES[overload] = Rule(overload, rule.fn, so, rule.family, pairs, interaction)


def _check_second_order(second_order: str, interaction: str) -> None:
    if second_order not in SECOND_ORDER:
        raise ValueError(f"second_order must be one of {SECOND_ORDER}, got {second_order!r}")
    if interaction not in INTERACTIONS:
        raise ValueError(f"interaction must be one of {INTERACTIONS}, got {interaction!r}")


def _check_pairs(overload, pairs) -> None:
    """Pair names must be arguments of every overload that takes tensors (a typo would be unsound)."""
    if not pairs:
        return
    args = overload._schema.arguments
    if not any(str(a.type).startswith("Tensor") for a in args):
        return
    names = {a.name for a in args}
    for p in pairs:
        if len(p) != 2 or any(q not in names for q in p):
            raise ValueError(f"second-order pair {p} names an argument that {overload} does not have "
                             f"({sorted(names)})")


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
        _refine_all()


# Second-order refinements of rules registered by the family modules, kept here as one table so
# that the classification of every op can be read in one place. A family module may instead pass
# ``pairs=``/``interaction=`` to ``register_rule``; an entry here wins.
_DIV_LIKE = (("self", "other"), ("other", "other"))   # linear in self, nonlinear in other
SECOND_ORDER_TABLE: list[tuple[list, dict]] = [
    (aten_ops("mul", "mul_"), dict(second_order="bilinear", pairs=(("self", "other"),))),
    (aten_ops("addcmul", "addcmul_"), dict(second_order="bilinear", pairs=(("tensor1", "tensor2"),))),
    (aten_ops("prelu", "_prelu_kernel"), dict(second_order="bilinear", pairs=(("self", "weight"),))),
    (aten_ops("lerp", "lerp_"), dict(second_order="bilinear", pairs=(("weight", "self"), ("weight", "end")))),
    (aten_ops("div", "div_", "true_divide", "true_divide_", "xlogy", "xlogy_", "special_xlogy",
              "special_xlog1py"), dict(second_order="nonlinear", pairs=_DIV_LIKE)),
    (aten_ops("addcdiv", "addcdiv_"),
     dict(second_order="nonlinear", pairs=(("tensor1", "tensor2"), ("tensor2", "tensor2")))),
    (aten_ops("nan_to_num", "nan_to_num_"), dict(second_order="linear")),
    (aten_ops("mm", "bmm"), dict(second_order="bilinear", pairs=(("self", "mat2"),), interaction="contraction")),
    (aten_ops("addmm", "addmm_"),
     dict(second_order="bilinear", pairs=(("mat1", "mat2"),), interaction="contraction")),
    (aten_ops("baddbmm", "baddbmm_", "addbmm", "addbmm_"),
     dict(second_order="bilinear", pairs=(("batch1", "batch2"),), interaction="contraction")),
    (aten_ops("mv"), dict(second_order="bilinear", pairs=(("self", "vec"),), interaction="contraction")),
    (aten_ops("addmv", "addmv_"),
     dict(second_order="bilinear", pairs=(("mat", "vec"),), interaction="contraction")),
    (aten_ops("dot"), dict(second_order="bilinear", pairs=(("self", "tensor"),), interaction="contraction")),
    (aten_ops("vdot"), dict(second_order="bilinear", pairs=(("self", "other"),), interaction="contraction")),
    (aten_ops("_addmm_activation"), dict(second_order="nonlinear")),  # gelu epilogue
    (aten_ops("convolution", "_convolution"), dict(second_order="bilinear", pairs=(("input", "weight"),))),
    (aten_ops("prod"), dict(second_order="nonlinear", interaction="multilinear")),
    # reductions whose mode may multiply (prod) are general; the sum/mean/max modes would be linear
    (aten_ops("scatter_reduce", "scatter_reduce_", "index_reduce", "index_reduce_"),
     dict(second_order="nonlinear")),
    ([getattr(p, o) for p in aten_ops("scatter", "scatter_") for o in ("reduce", "value_reduce")
      if o in p.overloads()], dict(second_order="nonlinear")),
]


def _refine_all() -> None:
    for ops, kw in SECOND_ORDER_TABLE:
        refine_second_order(ops, **kw)
