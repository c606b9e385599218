"""Elementwise ops: unary and n-ary math with broadcasting, and zero-derivative ops.

An output element of an elementwise op depends on the broadcast-matching element of every
differentiable operand (minus the operands the op's derivative ignores, e.g. ``copysign``'s sign
source). Zero-derivative ops (comparisons, sign, rounding) give empty sets. Ops whose class differs on
complex tensors (``abs``, ``sgn``, ``angle``) are in :mod:`~asd.detection.rules.complex`. Under local tracing,
piecewise-linear ops whose derivative vanishes on part of the domain (``relu``) use the values.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import sets as S
from .._core import Call, TracedTensor, is_differentiable_dtype
from ..table import aten_ops, overloads_except, register_rule

aten = torch.ops.aten


def _broadcast_rows(a: torch.Tensor, out_shape) -> np.ndarray:
    ids = torch.arange(a.numel(), dtype=torch.int64).reshape(a.shape)
    return ids.broadcast_to(out_shape).reshape(-1).numpy()


def operand_sets(call: Call, a, out: torch.Tensor):
    """Sets of operand ``a`` broadcast to the shape of ``out`` (``None`` if it carries none)."""
    s = call.sets(a)
    if s is None:
        return None
    if tuple(a.shape) == tuple(out.shape):
        return s
    return S.take_rows(s, _broadcast_rows(a, out.shape))


def _traced(values):
    """The traced tensors among ``values`` and inside their lists and tuples."""
    for v in values:
        if isinstance(v, TracedTensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, TracedTensor):
                    yield t


def _tensor_args(call: Call, skip: tuple[str, ...] = ()):
    """The traced tensor arguments, those named in ``skip`` left out (without ``skip`` the arguments
    are not bound to names: schema defaults are never tensors)."""
    if not skip:
        return _traced((*call.args, *call.kwargs.values()))
    return _traced(v for name, v in call.bound().items() if name not in skip)


def broadcast_union(call: Call, skip: tuple[str, ...] = ()) -> list:
    """Every output depends on the matching element of every differentiable operand."""
    res = []
    for out in call.outs:
        if not is_differentiable_dtype(out.dtype):
            res.append(None)
            continue
        parts = [operand_sets(call, a, out) for a in _tensor_args(call, skip)]
        res.append(S.union(parts, out.numel(), call.n))
    return res


def elementwise(call: Call, skip: tuple[str, ...] = ()) -> list:
    """:func:`broadcast_union` as an op's own rule: where the tracer allows it (``call.lazy``) the
    union is left pending (:class:`asd.detection.sets.PendingUnion`), an operand's pending parts
    joining the output's, so that a chain of elementwise ops merges rows once."""
    if not call.lazy or len(call.outs) != 1:
        return broadcast_union(call, skip)
    out = call.outs[0]
    if not is_differentiable_dtype(out.dtype):
        return [None]
    shape = tuple(out.shape)
    parts: list = []
    seen: set = set()
    for a in _tensor_args(call, skip):
        if id(a) in seen:  # ``a + a``: its sets once (a second take would merge its pending union)
            continue
        seen.add(id(a))
        if tuple(a.shape) == shape:
            parts.extend(call.set_parts(a))
        else:
            s = operand_sets(call, a, out)
            if s is not None:
                parts.append(s)
    return [S.lazy_union(parts, out.numel(), call.n)]


def mul_rule(call: Call) -> list:
    """``self * other``: the union of both operands' sets. Traced locally, an operand's sets are
    dropped where the other operand is a constant (it depends on no input) equal to zero, as the
    derivative there is that zero; globally a constant's values may change between calls."""
    out = call.outs[0]
    if not call.local or call.func._schema.is_mutable or not is_differentiable_dtype(out.dtype):
        return elementwise(call)
    b = call.bound()
    parts = []
    for a, other in ((b.get("self"), b.get("other")), (b.get("other"), b.get("self"))):
        s = operand_sets(call, a, out)
        if s is None:
            continue
        if not call.constant(other):
            parts.append(s)
            continue
        if isinstance(other, (int, float, complex)):  # a Python number (bool is an int)
            parts.append(s if other != 0 else None)
            continue
        values = other.primal if isinstance(other, TracedTensor) else other
        if isinstance(values, torch.Tensor) and not values.is_meta:
            keep = (values.detach() != 0).cpu().broadcast_to(tuple(out.shape)).reshape(-1).numpy()
            s = S.take_rows(s, np.where(keep, np.arange(keep.size), -1))
        parts.append(s)
    return [S.union(parts, out.numel(), call.n)]


def zero(call: Call) -> list:
    """Zero derivative almost everywhere: empty sets."""
    return [None] * len(call.outs)


def _skipping(*names: str):
    def rule(call: Call) -> list:
        return elementwise(call, skip=names)
    return rule


def div_rule(call: Call) -> list:
    if call.bound().get("rounding_mode") is not None:
        return zero(call)
    return elementwise(call)


def _masked_by_value(predicate):
    """Local tracing: drop the sets where ``predicate(self_values)`` is false, the derivative 0 there.
    A predicate is written as PyTorch's derivative formula zeroes: ``~(x <= 0)`` for relu, not
    ``x > 0``, since no comparison with a NaN holds and the formula passes the derivative there."""

    def rule(call: Call) -> list:
        res = broadcast_union(call)
        if not call.local:
            return res
        x = call.bound()["self"]
        if not isinstance(x, TracedTensor) or x.primal.is_meta or res[0] is None:
            return res
        if tuple(x.shape) != tuple(call.outs[0].shape):
            return res
        keep = predicate(x.primal, call.bound()).reshape(-1).cpu().numpy()
        rows = np.where(keep, np.arange(len(keep)), -1)
        return [S.take_rows(res[0], rows)] + res[1:]

    return rule


def _clamp_keep(x, b):
    keep = torch.ones_like(x, dtype=torch.bool)
    for bound, cmp in ((b.get("min"), torch.ge), (b.get("max"), torch.le)):
        if bound is not None:
            keep &= cmp(x, bound)
    return keep


def _known_values(t, shape):
    """Values of operand ``t`` (a tensor, a traced tensor or a number) broadcast to ``shape``, or
    ``None`` when they are unknown (global tracing)."""
    if isinstance(t, TracedTensor):
        t = t.primal
    if isinstance(t, torch.Tensor):
        return None if t.is_meta else t.cpu().broadcast_to(shape)
    return torch.full(shape, t, dtype=torch.float64)


def _clamp_masks(x, lo, hi):
    """Where each operand of ``clamp(x, lo, hi) = min(max(x, lo), hi)`` has a nonzero derivative
    (a superset at ties: PyTorch's masks are strict there); ``lo``/``hi`` may be ``None``."""
    keep_x = torch.ones_like(x, dtype=torch.bool)
    if lo is not None:
        keep_x &= x >= lo
    if hi is not None:
        keep_x &= x <= hi
    keep_lo = None if lo is None else (x <= lo) & (True if hi is None else lo <= hi)
    keep_hi = None if hi is None else (x >= hi) | (False if lo is None else hi <= lo)
    return keep_x, keep_lo, keep_hi


def clamp_rule(call: Call) -> list:
    """``clamp`` and its variants. Traced locally, an output element depends on ``x`` where ``x`` is
    within the bounds, on a tensor bound where that bound is the result."""
    b = call.bound()
    lo, hi = b.get("min"), b.get("max")
    if not (isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor)):
        return _scalar_clamp(call)
    out = call.outs[0]
    if not call.local:
        return broadcast_union(call)
    shape = tuple(out.shape)
    values = [_known_values(t, shape) if t is not None else None for t in (b["self"], lo, hi)]
    if any(v is None for v, t in zip(values, (b["self"], lo, hi)) if t is not None):
        return broadcast_union(call)
    parts = []
    for t, keep in zip((b["self"], lo, hi), _clamp_masks(*values)):
        s = operand_sets(call, t, out) if isinstance(t, torch.Tensor) else None
        if s is not None:
            parts.append(_rows_where(s, keep))
    return [S.union(parts, out.numel(), call.n)]


def _rows_where(s, keep: torch.Tensor):
    k = keep.reshape(-1).cpu().numpy()
    return S.take_rows(s, np.where(k, np.arange(len(k)), -1))


def _curved_where(first, curved):
    """Rule of an op that is linear where ``curved(x, bound)`` is false (elu for ``x > 0``): the
    first-order sets by ``first``, and second-order interactions recorded where it may be curved
    (everywhere under global tracing). Registered as ``"linear"``: the rule records the rest. An
    in-place variant has overwritten ``x`` when its rule runs: it records everywhere."""

    def rule(call: Call) -> list:
        res = first(call)
        x = call.bound()["self"]
        at_point = call.local and not call.func._schema.is_mutable and isinstance(x, TracedTensor) \
            and not x.primal.is_meta and tuple(x.shape) == tuple(call.outs[0].shape)
        if at_point and res[0] is not None:
            call.record_interaction([_rows_where(res[0], curved(x.primal, call.bound()))])
        else:
            call.record_interaction(res[:1])
        return res

    return rule


NONLINEAR_UNARY = aten_ops(
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh",
    "exp", "exp2", "expm1", "log", "log10", "log1p", "log2", "sqrt", "rsqrt", "reciprocal",
    "sigmoid", "logit", "erf", "erfc", "erfinv", "lgamma", "digamma", "polygamma", "i0", "sinc",
    "special_i0e", "special_i1", "special_i1e", "special_ndtr", "special_ndtri", "special_log_ndtr",
    "special_erfcx", "special_entr", "special_zeta",
    "special_bessel_j0", "special_bessel_j1", "special_spherical_bessel_j0", "gelu", "silu",
    "mish", "softplus", "log_sigmoid_forward", "mvlgamma", "square",
    "logaddexp", "logaddexp2", "hypot", "atan2", "arctan2",
    "igamma", "igammac", "ldexp", "polar", "erfinv_", "exp_", "log_", "sqrt_",
    "sin_", "cos_", "tanh_", "sigmoid_", "reciprocal_", "rsqrt_", "ldexp_",
)
PIECEWISE_LINEAR = aten_ops(
    "leaky_relu", "leaky_relu_",
    "fmod", "remainder", "rrelu_with_noise", "frexp",
)
LINEAR = aten_ops(
    "add", "add_", "sub", "sub_", "rsub", "neg", "neg_", "positive", "_to_copy", "conj_physical",
    "_conj_physical", "real", "imag", "deg2rad", "rad2deg", "frac", "_to_dense", "complex",
    "native_dropout_backward", "to_dense", "_neg_view", "_conj", "resolve_conj", "resolve_neg", "nan_to_num",
)
ZERO = aten_ops(
    "eq", "ne", "lt", "le", "gt", "ge", "eq_", "ne_", "lt_", "le_", "gt_", "ge_", "sign", "sign_",
    "floor", "floor_", "ceil", "ceil_", "round", "round_", "trunc", "trunc_", "fix",
    "isnan", "isinf", "isfinite", "isposinf", "isneginf", "isreal", "signbit", "heaviside",
    "logical_and", "logical_or", "logical_xor", "logical_not", "logical_not_", "logical_and_", "logical_or_", "logical_xor_", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "floor_divide",
    "argmax", "argmin", "any", "all", "count_nonzero", "nonzero", "nonzero_static", "argsort",
    "searchsorted", "bucketize", "histc", "bincount", "isin", "zeros_like", "ones_like", "full_like",
    "empty_like", "rand_like", "randn_like", "randint_like", "new_zeros", "new_ones", "new_full",
    "new_empty", "new_empty_strided", "empty_strided", "bernoulli", "bernoulli_", "uniform_",
    "normal_", "random_", "exponential_", "geometric_", "log_normal_",
    "is_same_size", "is_pinned", "_is_all_true", "_is_any_true", "allclose", "isclose",
    "unique_consecutive", "_unique2", "unique_dim", "detach_", "cauchy_",
)

# linear in ``self``, nonlinear in ``other``
_QUOTIENT = (("self", "other"), ("other", "other"))

register_rule(NONLINEAR_UNARY, elementwise, second_order="nonlinear", family="elementwise")
register_rule(aten_ops("xlogy", "special_xlogy", "special_xlog1py"), elementwise, second_order="nonlinear",
              pairs=_QUOTIENT, family="elementwise")
register_rule(aten_ops("addcdiv", "addcdiv_"), elementwise, second_order="nonlinear",
              pairs=(("tensor1", "tensor2"), ("tensor2", "tensor2")), family="elementwise")
register_rule(PIECEWISE_LINEAR, elementwise, second_order="linear", family="elementwise")
register_rule(LINEAR, elementwise, second_order="linear", family="elementwise")
register_rule(aten_ops("mul", "mul_"), mul_rule, second_order="bilinear", pairs=(("self", "other"),),
              family="elementwise")
register_rule(aten_ops("addcmul", "addcmul_"), elementwise, second_order="bilinear",
              pairs=(("tensor1", "tensor2"),), family="elementwise")
register_rule(aten_ops("prelu", "_prelu_kernel"), elementwise, second_order="bilinear",
              pairs=(("self", "weight"),), family="elementwise")
register_rule(aten_ops("lerp", "lerp_"), elementwise, second_order="bilinear",
              pairs=(("weight", "self"), ("weight", "end")), family="elementwise")
register_rule(ZERO, zero, second_order="zero", family="elementwise")
register_rule(aten_ops("div", "div_", "true_divide"), div_rule, second_order="nonlinear", pairs=_QUOTIENT,
              family="elementwise")
register_rule(aten_ops("copysign", "copysign_", "nextafter", "nextafter_"), _skipping("other"), second_order="linear",
              family="elementwise")
register_rule([torch.ops.aten.max.other, torch.ops.aten.min.other], elementwise, second_order="linear",
              family="elementwise")
register_rule(aten_ops("relu", "relu_"), _masked_by_value(lambda x, b: ~(x <= 0)), second_order="linear",
              family="elementwise")
_scalar_clamp = _masked_by_value(_clamp_keep)
register_rule(aten_ops("clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_", "clamp_max",
                       "clamp_max_"),
              clamp_rule, second_order="linear", family="elementwise")
# dead zones: a zero derivative where |x| < lambd
register_rule(aten_ops("softshrink", "hardshrink"), _masked_by_value(lambda x, b: ~(x.abs() < b["lambd"])),
              second_order="linear", family="elementwise")
# exponential for x <= 0, linear above
register_rule(aten_ops("elu", "elu_", "celu", "celu_", "selu", "selu_"),
              _curved_where(broadcast_union, lambda x, b: x <= 0), second_order="linear", family="elementwise")


def _choose(pick_self):
    """Local tracing of maximum/minimum/fmax/fmin: each output follows the operand it selects
    (both on ties); global: the union."""

    def rule(call: Call) -> list:
        b = call.bound()
        a, o = b["self"], b["other"]
        out = call.outs[0]
        if not call.local or any(isinstance(t, TracedTensor) and t.primal.is_meta for t in (a, o)):
            return broadcast_union(call)
        av = (a.primal if isinstance(a, TracedTensor) else a).broadcast_to(out.shape)
        ov = (o.primal if isinstance(o, TracedTensor) else o).broadcast_to(out.shape)
        take_a, take_o = pick_self(av, ov)
        parts = []
        for t, keep in ((a, take_a), (o, take_o)):
            s = operand_sets(call, t, out)
            if s is not None:
                k = keep.reshape(-1).cpu().numpy()
                parts.append(S.take_rows(s, np.where(k, np.arange(len(k)), -1)))
        return [S.union(parts, out.numel(), call.n)]

    return rule


# Each pick keeps an operand wherever either AD mode's formula may pass it a derivative: PyTorch's
# formulas zero a derivative where a comparison holds, and no comparison with a NaN does (reverse
# mode credits both operands of maximum(nan, 1)); both at ties.
def _max_pick(a, o):
    return ~(a < o), ~(a > o)


def _min_pick(a, o):
    return ~(a > o), ~(a < o)


def _fmax_pick(a, o):
    # fmax ignores a NaN operand; of two NaNs it credits the first
    return (a >= o) | torch.isnan(o), (o >= a) | (torch.isnan(a) & ~torch.isnan(o))


def _fmin_pick(a, o):
    return (a <= o) | torch.isnan(o), (o <= a) | (torch.isnan(a) & ~torch.isnan(o))


register_rule(aten_ops("maximum"), _choose(_max_pick), second_order="linear", family="elementwise")
register_rule(aten_ops("minimum"), _choose(_min_pick), second_order="linear", family="elementwise")
register_rule(aten_ops("fmax"), _choose(_fmax_pick), second_order="linear", family="elementwise")
register_rule(aten_ops("fmin"), _choose(_fmin_pick), second_order="linear", family="elementwise")


def _between(lo_name, hi_name, lo_default, hi_default, nan_passes: bool = True):
    """Keep where ``lo <= x <= hi``; a NaN also where the op's derivative formula passes one
    (hardtanh's zeroes only where ``x`` is outside its bounds, hardsigmoid's keeps only inside)."""
    def keep(x, b):
        lo = b.get(lo_name, lo_default) if lo_name else lo_default
        hi = b.get(hi_name, hi_default) if hi_name else hi_default
        return ~((x < lo) | (x > hi)) if nan_passes else (x >= lo) & (x <= hi)
    return keep


register_rule(aten_ops("hardtanh", "hardtanh_"), _masked_by_value(_between("min_val", "max_val", -1.0, 1.0)),
              second_order="linear", family="elementwise")
register_rule(aten_ops("hardsigmoid", "hardsigmoid_"), _masked_by_value(_between(None, None, -3.0, 3.0, False)),
              second_order="linear", family="elementwise")
# x (x + 3) / 6 on [-3, 3], 0 below and x above
register_rule(aten_ops("hardswish", "hardswish_"),
              _curved_where(_masked_by_value(lambda x, b: ~(x < -3.0)), lambda x, b: ~((x < -3.0) | (x > 3.0))),
              second_order="linear", family="elementwise")
register_rule(aten_ops("threshold", "threshold_"), _masked_by_value(lambda x, b: ~(x <= b["threshold"])),
              second_order="linear", family="elementwise")


def power_rule(call: Call) -> list:
    """``x ** c`` for a constant exponent known at trace time: ``c = 0`` has a zero derivative,
    ``c = 1`` a zero second derivative; a tensor exponent or base makes it a general op."""
    c = call.bound().get("exponent")
    if isinstance(c, (int, float, complex)) and not isinstance(c, bool):
        if c == 0:
            return zero(call)
        res = broadcast_union(call)
        if c != 1:
            call.record_interaction(res)
        return res
    res = broadcast_union(call)
    call.record_interaction(res)
    return res


_POWERS = aten_ops("pow", "pow_", "float_power", "float_power_")
_SCALAR_EXPONENT = ("pow.Tensor_Scalar", "pow.Tensor_Scalar_out", "pow_.Scalar", "float_power.Tensor_Scalar",
                    "float_power.Tensor_Scalar_out", "float_power_.Scalar")
# the table's class is that of a constant exponent 1 (linear); the rule records the others' interactions
register_rule([getattr(getattr(aten, n.split(".")[0]), n.split(".")[1]) for n in _SCALAR_EXPONENT], power_rule,
              second_order="linear", family="elementwise")
register_rule(overloads_except(_POWERS, *_SCALAR_EXPONENT), elementwise, second_order="nonlinear",
              family="elementwise")
