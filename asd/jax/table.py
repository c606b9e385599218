"""The JAX rule table: one propagation rule per primitive, keyed by the primitive's name.

Rule families (:mod:`asd.jax.rules`) register into :data:`RULES` with :func:`register`, which
refuses a second rule for the same name. A rule is a function ``rule(ctx) -> list`` that returns,
for every output of the equation, its index-set matrix (one row per output element, see
:mod:`asd.detection.sets`) or ``None`` for an output that depends on no input.

Every rule states its second-order class, read by Hessian detection (the same semantics as the
PyTorch tracer's, :mod:`asd.detection.hessian`):

:class:`Zero`, :class:`Linear`  no second-order terms (comparisons, movement, sums, ``max``);
:class:`Nonlinear`              every pair of dependencies of one output element may interact;
:class:`Bilinear`               ``x * y``: cross terms between the operands' sets only (``x * x``:
                                its square);
:class:`Quotient`               ``x / y``: cross terms and the square of ``y``'s sets;
:class:`LinearOnReal`           linear on real operands, nonlinear on complex ones (``abs``);
:class:`Custom`                 the rule adds its own terms (matrix products: only the operand
                                elements that are multiplied together interact; control flow:
                                the inner equations add theirs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class SecondOrder:
    """Base of the second-order classes."""


class Zero(SecondOrder):
    """Derivative zero almost everywhere."""


class Linear(SecondOrder):
    """Linear (or piecewise linear) in every operand."""


class Nonlinear(SecondOrder):
    """A general nonlinear op."""


class Bilinear(SecondOrder):
    """Linear in each of two operands separately."""


class Quotient(SecondOrder):
    """``x / y``: linear in ``x``, nonlinear in ``y``."""


class LinearOnReal(SecondOrder):
    """Piecewise linear on real operands, nonlinear on complex ones (``abs``: ``sqrt(re^2 + im^2)``)."""


class Custom(SecondOrder):
    """The rule records its own second-order terms."""


ZERO, LINEAR, NONLINEAR, BILINEAR, QUOTIENT, CUSTOM = Zero(), Linear(), Nonlinear(), Bilinear(), Quotient(), Custom()
LINEAR_ON_REAL = LinearOnReal()


@dataclass(frozen=True)
class Rule:
    """A registered propagation rule."""

    name: str
    fn: Callable
    second_order: SecondOrder
    family: str


RULES: dict[str, Rule] = {}


def register(names, fn: Callable, second_order: SecondOrder, family: str) -> None:
    """Register ``fn`` for the primitives called ``names`` (one name or several)."""
    if not isinstance(second_order, SecondOrder):
        raise TypeError(f"second_order must be a SecondOrder instance, got {second_order!r}")
    for name in (names,) if isinstance(names, str) else names:
        if name in RULES:
            raise ValueError(f"a rule for the JAX primitive {name!r} is already registered")
        RULES[name] = Rule(name, fn, second_order, family)


def lookup(primitive) -> Rule | None:
    """The rule of a primitive (object or name), or ``None``."""
    return RULES.get(primitive if isinstance(primitive, str) else primitive.name)

