"""Elementwise primitives: every output element depends on the same element of every operand
(scalar operands broadcast). Comparisons, rounding and integer ops carry no sets; ``max``,
``min``, ``select_n`` and ``clamp`` follow the operand they pick when its values are known."""

from __future__ import annotations

import numpy as np

from ...detection import sets as S
from ..interpreter import broadcast_sets
from ..table import BILINEAR, LINEAR, LINEAR_ON_REAL, NONLINEAR, QUOTIENT, ZERO, register

NONLINEAR_UNARY = (
    "exp", "exp2", "log", "log1p", "expm1", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
    "asinh", "acosh", "atanh", "logistic", "sqrt", "rsqrt", "cbrt", "integer_pow", "square", "lgamma", "digamma",
    "erf", "erfc", "erf_inv", "bessel_i0e", "bessel_i1e", "polygamma", "igamma", "igammac", "igamma_grad_a",
    "random_gamma_grad", "regularized_incomplete_beta", "zeta", "pow", "atan2", "nextafter_grad",
)
LINEAR_OPS = ("neg", "add", "sub", "add_any", "copy", "copy_p", "real", "imag", "conj", "complex", "reduce_precision",
              "rem")
ZERO_OPS = ("sign", "floor", "ceil", "round", "is_finite", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not",
            "xor", "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count", "clz",
            "stop_gradient", "nextafter", "iota", "random_bits", "random_seed", "random_wrap", "random_unwrap",
            "rng_bit_generator", "rng_uniform", "argmax", "argmin", "reduce_and", "reduce_or", "reduce_xor",
            "bitcast_convert_type", "eq_to", "lt_to", "le_to", "zeros_like", "platform_index", "empty",
            "empty2")


def union_of_operands(ctx, which=None):
    """Each output element: the union of the same (broadcast) element of the operands ``which``."""
    shape = ctx.out_shapes[0]
    idx = range(len(ctx.ins)) if which is None else which
    parts = [broadcast_sets(ctx.sets(i), ctx.ins[i].shape, shape) for i in idx]
    return S.union(parts, ctx.out_size(0), ctx.n)


def elementwise(ctx):
    return [union_of_operands(ctx)]


def zero(ctx):
    return [None] * len(ctx.eqn.outvars)


register(NONLINEAR_UNARY, elementwise, NONLINEAR, "elementwise")
register(LINEAR_OPS, elementwise, LINEAR, "elementwise")
register(("mul",), elementwise, BILINEAR, "elementwise")
register(("div",), elementwise, QUOTIENT, "elementwise")
register(ZERO_OPS, zero, ZERO, "elementwise")


# |z| is piecewise linear on the reals only (found by an adversarial review: the Hessian of sum(|z|)
# came out empty); JAX gives sign no derivative, complex or not
register(("abs",), elementwise, LINEAR_ON_REAL, "elementwise")


#: primitives that pass every operand through unchanged (casts, placement and naming annotations)
IDENTITY_OPS = ("convert_element_type", "optimization_barrier", "device_put", "name", "sharding_constraint",
                "layout_constraint", "reshard", "pvary")

register(IDENTITY_OPS,
         lambda ctx: [ctx.sets(i) for i in range(len(ctx.ins))], LINEAR, "elementwise")


def _picked(ctx, choice: np.ndarray, operands: list[int]):
    """Output element ``r`` follows operand ``operands[choice[r]]`` (``-1``: the union of all)."""
    shape = ctx.out_shapes[0]
    m = ctx.out_size(0)
    parts = []
    for k, i in enumerate(operands):
        s = broadcast_sets(ctx.sets(i), ctx.ins[i].shape, shape)
        if s is None:
            continue
        keep = (choice == k) | (choice < 0)
        parts.append(S.take_rows(s, np.where(keep, np.arange(m), -1)))
    return S.union(parts, m, ctx.n)


def _max_min(pick_first):
    def fn(ctx):
        a, b = ctx.value(0), ctx.value(1)
        if not ctx.local or a is None or b is None:
            return elementwise(ctx)
        shape = ctx.out_shapes[0]
        a, b = np.broadcast_to(a, shape).ravel(), np.broadcast_to(b, shape).ravel()
        choice = np.where(a == b, -1, np.where(pick_first(a, b), 0, 1))
        return [_picked(ctx, choice, [0, 1])]

    return fn


register("max", _max_min(lambda a, b: a > b), LINEAR, "elementwise")
register("min", _max_min(lambda a, b: a < b), LINEAR, "elementwise")


def select_n(ctx):
    """``select_n(pred, *cases)``: with a known predicate (a constant, or any under ``local``),
    each element follows the case it selects; otherwise the union of the cases."""
    pred = ctx.value(0)
    cases = list(range(1, len(ctx.ins)))
    if pred is None:
        return [union_of_operands(ctx, cases)]
    choice = np.broadcast_to(pred.astype(np.int64), ctx.out_shapes[0]).ravel()
    return [_picked(ctx, choice, cases)]


register("select_n", select_n, LINEAR, "elementwise")


def clamp(ctx):
    """``clamp(lo, x, hi)``, which XLA computes as ``min(max(x, lo), hi)``: with known values each
    element follows ``x`` strictly inside the bounds and the bound it hits otherwise (``hi`` where
    ``max(x, lo)`` exceeds it, even with ``lo > hi``); a tie reads both."""
    lo, x, hi = ctx.value(0), ctx.value(1), ctx.value(2)
    if not ctx.local or lo is None or x is None or hi is None:
        return [union_of_operands(ctx)]
    shape = ctx.out_shapes[0]
    lo, x, hi = (np.broadcast_to(v, shape).ravel() for v in (lo, x, hi))
    m = np.maximum(x, lo)
    inner = np.where(x < lo, 0, np.where(x == lo, -1, 1))  # max(x, lo)
    choice = np.where(m > hi, 2, np.where(m == hi, -1, inner))
    return [_picked(ctx, choice, [0, 1, 2])]


register("clamp", clamp, LINEAR, "elementwise")
