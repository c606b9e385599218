"""Ops whose derivative class differs between real and complex arguments.

On a real tensor ``abs`` is piecewise linear, ``sgn`` and ``angle`` are piecewise constant (zero
derivative); on a complex tensor all three are smooth nonlinear functions of the real and imaginary
parts (``|z| = sqrt(re^2 + im^2)``, ``z / |z|``, ``atan2(im, re)``). The table holds their class for
real arguments; on complex ones the rules record the interactions themselves
(:meth:`~asd.detection._core.Call.record_interaction`). ``real``, ``imag``, ``conj`` and
``view_as_real`` are linear in both cases and keep their rules in the other families.
"""

from __future__ import annotations

from .._core import Call, TracedTensor
from ..table import aten_ops, register_rule
from .elementwise import broadcast_union, zero


def _is_complex(call: Call) -> bool:
    x = call.bound().get("self")
    return isinstance(x, TracedTensor) and x.dtype.is_complex


def abs_rule(call: Call) -> list:
    """``|x|``: the operand's sets; nonlinear on complex tensors."""
    res = broadcast_union(call)
    if _is_complex(call):
        call.record_interaction(res)
    return res


def phase_rule(call: Call) -> list:
    """``sgn``/``angle``: zero derivative on real tensors, nonlinear on complex ones."""
    if not _is_complex(call):
        return zero(call)
    res = broadcast_union(call)
    call.record_interaction(res)
    return res


register_rule(aten_ops("abs", "abs_"), abs_rule, second_order="linear", family="complex")
register_rule(aten_ops("sgn", "sgn_", "angle"), phase_rule, second_order="zero", family="complex")
