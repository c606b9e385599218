"""The ``__torch_dispatch__`` front end: tensor-level index-set tracing of a torch function.

While a :class:`Tracer` is active, a dispatch mode sees every ATen call made by the traced function:
factory calls (``torch.zeros``, ``torch.arange``) return traced constants, view ops share storage
(see :mod:`asd.detection._core`), in-place ops write sets back, and every other op is propagated by
its rule from the table (:mod:`asd.detection.table`).
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import torch
from torch.utils._mode_utils import no_dispatch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch._decomp import decomposition_table
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..errors import InputError, TracingError, UnsupportedOpError, UnsupportedOpWarning
from . import sets as S
from ._core import Call, Storage, TracedTensor, bind, is_differentiable_dtype, pop_tracer, push_tracer, sets_of
from .ad_gaps import GAPS, gaps_of
from .rules.elementwise import div_rule, elementwise, mul_rule
from .rules.fallback import conservative
from .rules import movement as movement_memo
from .rules.movement import movement, storage_view_rows, view_ids
from .table import aten_ops, lookup

__all__ = ["TraceInfo", "Tracer", "trace"]

aten = torch.ops.aten


def _alias_of_returns(func) -> list[tuple[int | None, bool]]:
    """For each return: (index of the argument it aliases or None, whether that is a write)."""
    schema = func._schema
    res = []
    for r in schema.returns:
        ai = r.alias_info
        if ai is None:
            res.append((None, False))
            continue
        hit = None
        for j, a in enumerate(schema.arguments):
            if a.alias_info is not None and (a.alias_info.before_set & ai.before_set):
                hit = j
                break
        if hit is None and func.is_view:  # list-returning views (unbind, split) alias ``self``
            hit = 0
        res.append((hit, bool(ai.is_write)))
    return res


_ALIAS_CACHE: dict = {}


def alias_of_returns(func):
    v = _ALIAS_CACHE.get(func)
    if v is None:
        v = _ALIAS_CACHE[func] = _alias_of_returns(func)
    return v


_MUTATED_CACHE: dict = {}


def _mutated_args(func) -> list[int]:
    v = _MUTATED_CACHE.get(func)
    if v is None:
        v = _MUTATED_CACHE[func] = [j for j, a in enumerate(func._schema.arguments)
                                    if a.alias_info is not None and a.alias_info.is_write]
    return v


# Ops that have no meta kernel: under global tracing they run at a generic point (fixed random
# values) in place of the unknown values. A generic point, not zeros: some output shapes follow the
# rank of the operands (linalg_lstsq's residuals), and zeros are rank-deficient.
_SHAPE_NEEDS_NO_DATA = {aten.masked_select.default, aten.linalg_lstsq.default}

# Ops that update running statistics in place as a side effect (batch norm in training mode). The
# update is not part of the op's result, so it runs on private copies: tracing leaves the user's
# buffers untouched, and the buffers need not be traced.
_STAT_UPDATES = {getattr(packet, o) for packet in aten_ops(
    "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update", "batch_norm_update_stats",
    "cudnn_batch_norm", "miopen_batch_norm") for o in packet.overloads()}
_STAT_NAMES = ("running_mean", "running_var")


def _private_stats(func, pargs, pkwargs):
    names = [a.name for a in func._schema.arguments]
    pargs = list(pargs)
    for i, a in enumerate(pargs):
        if i < len(names) and names[i] in _STAT_NAMES and isinstance(a, torch.Tensor):
            pargs[i] = a.clone()
    pkwargs = {k: (v.clone() if k in _STAT_NAMES and isinstance(v, torch.Tensor) else v) for k, v in pkwargs.items()}
    return tuple(pargs), pkwargs


# -- flattening ----------------------------------------------------------------------------------
# An ATen call's arguments are tensors, numbers and a few enums in tuples, lists and a kwargs dict:
# flattened here in plain Python, the same leaves in the same order as torch's pytree (which costs
# tens of microseconds per call in its generic node handling). Anything else goes to pytree.
_LEAF_TYPES = frozenset({int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout,
                         torch.memory_format})


class _Spec(tuple):
    """The structure :func:`_flatten` found (hashable, compared by value)."""

    __slots__ = ()


class _NotPlain(Exception):
    pass


def _flat_into(x, flat: list):
    t = type(x)
    if t is tuple or t is list:
        return (t, tuple([_flat_into(e, flat) for e in x]))
    if t is dict:
        return (dict, tuple(x), tuple([_flat_into(v, flat) for v in x.values()]))
    if t in _LEAF_TYPES or isinstance(x, torch.Tensor):
        flat.append(x)
        return None
    raise _NotPlain


class _ArgsSpec(_Spec):
    """The structure of ``(args, {})`` with every argument a leaf, the common ATen call: equal to
    the one :func:`_flat_into` finds, and unflattened without walking it."""

    __slots__ = ()


_ARGS_SPECS: dict = {}
#: the structure of a single leaf (a tensor result)
_LEAF = _Spec((None,))


def _args_spec(n: int) -> _ArgsSpec:
    spec = _ARGS_SPECS.get(n)
    if spec is None:
        spec = _ARGS_SPECS[n] = _ArgsSpec(((tuple, ((tuple, (None,) * n), (dict, (), ()))),))
    return spec


def _flatten(x) -> tuple[list, Any]:
    """``tree_flatten(x)``: the leaves and a structure for :func:`_unflatten`."""
    if isinstance(x, torch.Tensor):
        return [x], _LEAF
    flat: list = []
    try:
        return flat, _Spec((_flat_into(x, flat),))
    except _NotPlain:
        return tree_flatten(x)


def _flatten_call(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """``_flatten((args, kwargs))``, without walking a call whose arguments are all leaves."""
    if not kwargs and type(args) is tuple:
        for a in args:
            if not (isinstance(a, torch.Tensor) or type(a) in _LEAF_TYPES):
                break
        else:
            return list(args), _args_spec(len(args))
    return _flatten((args, kwargs))


def _rebuild(node, it):
    if node is None:
        return next(it)
    if node[0] is dict:
        return {k: _rebuild(c, it) for k, c in zip(node[1], node[2])}
    return node[0]([_rebuild(c, it) for c in node[1]])


def _unflatten(flat, spec):
    """``tree_unflatten`` for a structure from :func:`_flatten` (or from ``tree_flatten``)."""
    t = type(spec)
    if t is _ArgsSpec:
        return tuple(flat), {}
    if t is _Spec:
        if spec is _LEAF:
            return flat[0]
        return _rebuild(spec[0], iter(flat))
    return tree_unflatten(flat, spec)


# Output metadata of functional ops on meta tensors, keyed on the op and its arguments' metadata:
# many meta kernels are Python reference implementations, and a traced function repeats the same
# few calls (the same shapes) many times.
_META_CACHE: dict = {}
_META_CACHE_SIZE = 8192


def _meta_key(a):
    if isinstance(a, torch.Tensor):
        if not a.is_meta or a.layout != torch.strided:
            raise TypeError
        return ("T", tuple(a.shape), a.stride(), a.dtype)
    if isinstance(a, (list, tuple)):
        return tuple(_meta_key(t) for t in a)
    hash(a)
    return (type(a), a)  # 1, 1.0 and True promote differently


# Output metadata without the meta kernel. In PyTorch 2.x many meta kernels are Python references
# (torch._refs, torch._meta_registrations): the first call of one imports torch._dynamo (through the
# ``torch._disable_dynamo`` wrapper of the type-promoting references) or sympy (through
# ``torch._check``), together most of a second of cold start. For functional pointwise ops and a few
# common others, the tracer computes the output's metadata itself instead: the shape from the
# operands' shapes, the dtype by running the op on tiny CPU tensors of the operands' dtypes and
# ranks (``torch.ones([2] * t.dim())``: 0-dim operands keep their lower type-promotion priority, the
# op checks its dims and dtypes as it would, and no dim of size 1 makes a case of its own, such as
# var's degrees of freedom), contiguous strides. It answers only
# where every tensor operand is non-empty and contiguous with canonical strides (for pointwise ops
# also expanded, or a slice whose strides keep the dims' order: the output is then contiguous);
# anywhere else, or on any error, the meta kernel runs as before (and reports a
# genuine error in ``f``). tests/test_detection_speed.py checks it against the meta kernels.

# Argument types a functional pointwise op may take here (no memory format, device or layout).
_POINTWISE_ARG_TYPES = frozenset({"Tensor", "Optional[Tensor]", "number", "Optional[number]", "int",
                                  "Optional[int]", "float", "Optional[float]", "str", "Optional[str]", "bool"})
_MEMORY_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def _broadcast_shape(shapes) -> tuple | None:
    """The broadcast shape of ``shapes``, or ``None`` where they do not broadcast (in plain Python:
    ``torch.broadcast_shapes`` imports sympy on its first call)."""
    out = [1] * max((len(s) for s in shapes), default=0)
    for s in shapes:
        for i, d in enumerate(s, len(out) - len(s)):
            if d != 1:
                if out[i] == 1:
                    out[i] = d
                elif out[i] != d:
                    return None
    return tuple(out)


def _contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


_STRIDES: dict = {}


def _canonical_strides(shape: torch.Size) -> tuple:
    """:func:`_contiguous_strides` of ``shape``, remembered per shape."""
    strides = _STRIDES.get(shape)
    if strides is None:
        if len(_STRIDES) >= 4096:
            _STRIDES.clear()
        strides = _STRIDES[shape] = _contiguous_strides(shape)
    return strides


def _expanded_contiguous(t: torch.Tensor) -> bool:
    """Whether ``t`` is a canonical contiguous tensor, possibly expanded (stride 0) along some dims:
    to a pointwise op the same as a smaller contiguous operand it broadcasts."""
    acc = 1
    for n, st in zip(reversed(t.shape), reversed(t.stride())):
        if st == 0:
            continue
        if st != acc:
            return False
        acc *= n
    return True


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its storage span without gaps or overlaps (dims of size 1
    aside): any permutation of a contiguous layout."""
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def _row_major(t: torch.Tensor, shape: tuple) -> bool:
    """Whether ``t`` is a slice with gaps (not dense) whose strides decrease strictly along the
    dims where it and the broadcast ``shape`` have more than one element (``u[1:, :-1]``):
    TensorIterator then keeps the dims in order and a pointwise result is contiguous."""
    if _dense(t):  # a dense operand's layout (a permutation) is what a pointwise result copies
        return False
    last = None
    for n, st, full in zip(t.shape, t.stride(), shape[len(shape) - t.dim():]):
        if n == 1 or full == 1 or st == 0:
            continue
        if st < 0 or (last is not None and st >= last):
            return False
        last = st
    return True


def _pointwise_shape(b: dict, tensors: list):
    return _broadcast_shape([tuple(t.shape) for t in tensors])


def _same_shape(b: dict, tensors: list):
    if b.get("memory_format") not in _MEMORY_FORMATS or b.get("layout") not in (None, torch.strided):
        return None
    return tuple(b["self"].shape)


def _scalar_shape(b: dict, tensors: list):
    return ()


def _normalized_dims(dims, nd: int):
    """``dims`` (ints, possibly negative) as a set of dims of an ``nd``-dim tensor, or ``None``."""
    wrap = max(nd, 1)
    out = set()
    for d in dims:
        if not isinstance(d, int) or not -wrap <= d < wrap or d % wrap in out:
            return None
        out.add(d % wrap)
    return out


def _reduction(all_if_empty: bool):
    def shape(b: dict, tensors: list):
        x, dim = b["self"], b.get("dim")
        nd = x.dim()
        if dim is None or (isinstance(dim, (list, tuple)) and not dim):
            if dim is not None and not all_if_empty:
                return None
            dims = set(range(nd))
        else:
            dims = _normalized_dims([dim] if isinstance(dim, int) else dim, nd)
            if dims is None:
                return None
        if b.get("keepdim"):
            return tuple(1 if i in dims else n for i, n in enumerate(x.shape))
        return tuple(n for i, n in enumerate(x.shape) if i not in dims)
    return shape


def _mm_shape(b: dict, tensors: list):
    a, m = b["self"], b["mat2"]
    if a.dim() != 2 or m.dim() != 2 or a.shape[1] != m.shape[0]:
        return None
    return (a.shape[0], m.shape[1])


def _addmm_shape(b: dict, tensors: list):
    a, m, c = b["mat1"], b["mat2"], b["self"]
    if a.dim() != 2 or m.dim() != 2 or a.shape[1] != m.shape[0] or c.dim() > 2:
        return None
    out = (a.shape[0], m.shape[1])
    return out if _broadcast_shape([tuple(c.shape), out]) == out else None


def _bmm_shape(b: dict, tensors: list):
    a, m = b["self"], b["mat2"]
    if a.dim() != 3 or m.dim() != 3 or a.shape[0] != m.shape[0] or a.shape[2] != m.shape[1]:
        return None
    return (a.shape[0], a.shape[1], m.shape[2])


def _mv_shape(b: dict, tensors: list):
    a, v = b["self"], b["vec"]
    if a.dim() != 2 or v.dim() != 1 or a.shape[1] != v.shape[0]:
        return None
    return (a.shape[0],)


def _dot_shape(b: dict, tensors: list):
    a, v = b["self"], b["tensor"]
    return () if a.dim() == 1 and v.dim() == 1 and a.shape == v.shape else None


def _cat_shape(b: dict, tensors: list):
    ts, nd = b["tensors"], tensors[0].dim()
    if nd == 0 or any(t.dim() != nd for t in ts):
        return None
    dims = _normalized_dims([b["dim"]], nd)
    if dims is None:
        return None
    (d,) = dims
    first = list(ts[0].shape)
    if any(list(t.shape[:d]) + list(t.shape[d + 1:]) != first[:d] + first[d + 1:] for t in ts):
        return None
    first[d] = sum(t.shape[d] for t in ts)
    return tuple(first)


def _stack_shape(b: dict, tensors: list):
    ts = b["tensors"]
    shape = tuple(ts[0].shape) if ts else None
    if not ts or any(tuple(t.shape) != shape for t in ts):
        return None
    dims = _normalized_dims([b["dim"]], len(shape) + 1)
    if dims is None:
        return None
    (d,) = dims
    return shape[:d] + (len(ts),) + shape[d:]


def _mse_loss_shape(b: dict, tensors: list):
    if b.get("reduction") in (1, 2):
        return () if _broadcast_shape([tuple(b["self"].shape), tuple(b["target"].shape)]) is not None else None
    return _pointwise_shape(b, tensors)


def _repeat_shape(b: dict, tensors: list):
    x, reps = b["self"], list(b["repeats"])
    if len(reps) < x.dim() or any(not isinstance(r, int) or r < 0 for r in reps):
        return None
    shape = [1] * (len(reps) - x.dim()) + list(x.shape)
    return tuple(n * r for n, r in zip(shape, reps))


# ops whose output is a fresh contiguous tensor whatever the strides of their operands
_ANY_STRIDES = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.mv.default, aten.dot.default})


def _fast_shapes() -> dict:
    ops: dict = {}
    same = aten_ops("roll", "flip", "tril", "triu", "_softmax", "_log_softmax", "cumsum", "cumprod",
                    "zeros_like", "ones_like", "full_like", "empty_like", "clone", "_to_copy")
    for packet in same:
        ops[packet.default] = _same_shape
    for op in (aten.sum.default, aten.mean.default, aten.prod.default, aten.max.default, aten.min.default):
        ops[op] = _scalar_shape
    for op in (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default):
        ops[op] = _reduction(all_if_empty=True)
    for op in (aten.prod.dim_int, aten.logsumexp.default, aten.linalg_vector_norm.default, aten.var.correction,
               aten.std.correction):
        ops[op] = _reduction(all_if_empty=False)
    ops.update({aten.mm.default: _mm_shape, aten.addmm.default: _addmm_shape, aten.bmm.default: _bmm_shape,
                aten.mv.default: _mv_shape, aten.dot.default: _dot_shape, aten.cat.default: _cat_shape,
                aten.stack.default: _stack_shape, aten.mse_loss.default: _mse_loss_shape,
                aten.repeat.default: _repeat_shape})
    return ops


_FAST_SHAPES = _fast_shapes()
_FAST_SHAPE_OF: dict = {}


def _fast_shape_fn(func):
    """The shape function of ``func`` for :func:`_fast_meta` (``False`` if it has none)."""
    fn = _FAST_SHAPE_OF.get(func)
    if fn is None:
        fn = _FAST_SHAPES.get(func, False)
        schema = func._schema
        if (fn is False and torch.Tag.pointwise in func.tags and not schema.is_mutable
                and not schema.name.endswith("_backward")  # mixed dtypes: the meta kernels differ
                and schema.name not in _META_DIFFERS
                and len(schema.returns) == 1 and schema.returns[0].alias_info is None
                and str(schema.returns[0].type) == "Tensor"
                and torch.Tag.nondeterministic_seeded not in func.tags
                and all(str(a.type) in _POINTWISE_ARG_TYPES for a in schema.arguments)):
            fn = _pointwise_shape
        _FAST_SHAPE_OF[func] = fn
    return fn


# pointwise ops whose CPU and meta kernels promote some operand dtypes differently
_META_DIFFERS = frozenset({"aten::ldexp"})
_SHIFTS = frozenset({"aten::__lshift__", "aten::__rshift__", "aten::bitwise_left_shift", "aten::bitwise_right_shift"})


def _dtype_corner(func, b: dict, tensors: list) -> bool:
    """Operand dtypes where PyTorch's CPU kernels and meta kernels disagree on the result (found by
    tests/test_detection_speed.py): uint8 operands (``where``'s deprecated uint8 condition), bool
    operands of shifts, and all-bool operands with a Python number (``pow(bool, True)``)."""
    if any(t.dtype == torch.uint8 for t in tensors):
        return True
    plain = [v for k, v in b.items() if isinstance(v, torch.Tensor) and k not in ("condition", "mask")]
    bools = [t.dtype == torch.bool for t in plain]
    if not any(bools):
        return False
    return func._schema.name in _SHIFTS or (all(bools) and any(
        isinstance(v, (int, float, complex)) for k, v in b.items() if not isinstance(v, torch.Tensor)))


#: ops that return their (real) operand itself, strides and all
_RETURNS_INPUT = {aten.conj_physical.default}


def _fast_meta(func, pflat, spec, pargs, pkwargs):
    """The meta output of ``func`` computed without its meta kernel, or ``None`` (see above)."""
    shape_fn = _fast_shape_fn(func)
    if shape_fn is False or func in _RETURNS_INPUT:
        return None
    tensors = [a for a in pflat if isinstance(a, torch.Tensor)]
    if not tensors:
        return None
    out_shape = _broadcast_shape([tuple(t.shape) for t in tensors]) if shape_fn is _pointwise_shape else None
    for t in tensors:
        if t.numel() == 0 or t.dim() > 8:  # the stand-ins below have 2 ** dim elements
            return None
        if t.stride() != _contiguous_strides(t.shape) and func not in _ANY_STRIDES and not (
                shape_fn is _pointwise_shape and (_expanded_contiguous(t) or (
                    out_shape is not None and _row_major(t, out_shape)))):
            return None
    try:
        b = bind(func, pargs, pkwargs)
        if shape_fn is _pointwise_shape and _dtype_corner(func, b, tensors):
            return None
        shape = shape_fn(b, tensors)
        if shape is None:
            return None
        tiny = [torch.ones([2] * a.dim(), dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in pflat]
        targs, tkwargs = _unflatten(tiny, spec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = func(*targs, **tkwargs)
    except Exception:  # noqa: BLE001  (the meta kernel decides)
        return None
    if not isinstance(r, torch.Tensor) or r.dim() != len(shape) or r.layout != torch.strided:
        return None
    return torch.empty_strided(shape, _contiguous_strides(shape), dtype=r.dtype, device="meta")


def _meta_call(func, pflat, spec, pargs, pkwargs, facts: "_OpFacts | None" = None):
    """``func(*pargs, **pkwargs)`` on meta tensors, memoized for ops that return fresh tensors."""
    facts = facts or op_facts(func)
    if not facts.memoizable:
        return func(*pargs, **pkwargs)
    try:
        key = (facts, spec, tuple(_meta_key(a) for a in pflat))
    except TypeError:  # an unhashable argument: no memo
        return func(*pargs, **pkwargs)
    hit = _META_CACHE.get(key)
    if hit is None:
        out = _fast_meta(func, pflat, spec, pargs, pkwargs)
        if out is None:
            out = func(*pargs, **pkwargs)
        leaves, out_spec = _flatten(out)
        if not all(isinstance(t, torch.Tensor) and t.is_meta and t.layout == torch.strided for t in leaves):
            return out
        if len(_META_CACHE) >= _META_CACHE_SIZE:
            _META_CACHE.clear()
        _META_CACHE[key] = ([(tuple(t.shape), t.stride(), t.dtype) for t in leaves], out_spec)
        return out
    metas, out_spec = hit
    return _unflatten([torch.empty_strided(sh, st, dtype=dt, device="meta") for sh, st, dt in metas], out_spec)


def _run_at_generic_point(func, flat, spec):
    def real(a):
        if isinstance(a, TracedTensor):
            a = a.primal
        if isinstance(a, torch.Tensor) and a.is_meta:
            if a.dtype.is_floating_point or a.is_complex():
                return torch.randn(a.shape, dtype=a.dtype, generator=torch.Generator().manual_seed(0))
            raise TracingError(f"{func} depends on the values of an integer or boolean tensor computed "
                               "from the input; pass local=True to trace at a point")
        return a

    a, k = _unflatten([real(t) for t in flat], spec)
    out = func(*a, **k)
    return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, out)


def _decomposition(func, rule=False):
    """PyTorch's own decomposition of a functional op that has no rule (``slice_backward`` and other
    backward ops met when ``f`` calls autograd), or ``None``. ``rule``: ``lookup(func)`` where the
    caller has it."""
    if (lookup(func) if rule is False else rule) is not None or not op_facts(func).decomposable:
        return None
    return decomposition_table.get(func)


_POINTWISE: dict = {}


def _pointwise_rule(func):
    """The rule function :meth:`Tracer._pointwise` may run for ``func``, or ``None``: a functional
    pointwise op of tensor and number arguments (no rounding mode, no int parameter) and one tensor
    output, whose builtin rule is the plain elementwise union under global tracing
    (``elementwise``, ``mul_rule``, ``div_rule``), with no known AD gap."""
    entry = _POINTWISE.get(id(func))
    if entry is None or entry[0] is not func:
        entry = _POINTWISE[id(func)] = (func, _pointwise_fn(func))  # func kept alive: its id is never reused
    return entry[1]


def _pointwise_fn(func):
    if not isinstance(func, torch._ops.OpOverload):
        return None
    rule = lookup(func)
    schema = func._schema
    if (rule is None or not rule.builtin or rule.fn not in (elementwise, mul_rule, div_rule)
            or torch.Tag.pointwise not in func.tags or schema.is_mutable
            or torch.Tag.nondeterministic_seeded in func.tags
            or len(schema.returns) != 1 or schema.returns[0].alias_info is not None
            or str(schema.returns[0].type) != "Tensor"
            or func.overloadpacket._qualified_op_name in GAPS
            # a tensor or a number per argument: an int argument (polygamma's n, mvlgamma's p) has
            # range checks that only the meta kernel makes
            or not all(str(a.type) in _OPERAND_TYPES for a in schema.arguments)):
        return None
    return rule.fn


_OPERAND_TYPES = frozenset({"Tensor", "number"})


#: ops :meth:`Tracer._permuting` answers: functional moves of every element to one place, the output
#: of the input's shape (``clone`` without a memory format: the identity)
_PERMUTING = frozenset({aten.roll.default, aten.flip.default, aten.clone.default})
_STACK = aten.stack.default
_VIEW = aten.view.default
_UNBIND = aten.unbind.int


def _permutation_rows(key: tuple, func, rest: tuple) -> np.ndarray | None:
    """Row ``i`` of the output of ``func(x, *rest)`` copies element ``rows[i]`` of ``x`` (row-major),
    for ``x`` of shape ``key[1]``: the op run once on element ids (``None`` if it raises there), kept
    in the movement rule's memo; :data:`_UNMOVED` where every element stays where it is (``clone``,
    a roll by a multiple of the size): the output's sets are then the input's."""
    key = ("permuting", *key)
    hit = movement_memo.remembered(key)
    if hit is not None:
        return hit[0]
    shape = tuple(key[2])
    n = 1
    for d in shape:
        n *= d
    try:
        with no_dispatch():
            out = func(torch.arange(n, dtype=torch.int64).reshape(shape), *rest)
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None
    if tuple(out.shape) != shape:
        return None
    rows = out.reshape(-1).numpy().copy()
    if np.array_equal(rows, np.arange(n)):
        rows = _UNMOVED
    movement_memo.remember(key, [rows])
    return rows


#: what :func:`_permutation_rows` answers for an op that leaves every element where it is
_UNMOVED = np.zeros(0, dtype=np.int64)


def clear_memos() -> None:
    """Forget the memos of meta outputs and of strides."""
    _META_CACHE.clear()
    _STRIDES.clear()


# Ops answered by the tracer itself, before any rule.
_SCALAR_OPS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}


class _OpFacts:
    """What the tracer reads of an op's schema and tags, worked out once per op (an OpOverload
    hashes in Python: a dict lookup keyed on it costs more than one keyed on its ``id``)."""

    __slots__ = ("func", "qualname", "scalar", "detach", "to_sparse", "decomposable", "mutated", "stat_update", "aliases",
                 "aliasing", "memoizable", "inplace_view")

    def __init__(self, func):
        schema = func._schema
        self.func = func  # kept alive: its id is never reused while this entry exists
        self.qualname = func.overloadpacket._qualified_op_name  # the key of its AD gaps
        self.scalar = func in _SCALAR_OPS
        self.detach = func is aten.detach.default
        self.to_sparse = func.__name__.lstrip("_").startswith("to_sparse")
        fresh = not any(r.alias_info is not None for r in schema.returns)
        self.decomposable = not schema.is_mutable and fresh
        self.mutated = _mutated_args(func)
        self.stat_update = func in _STAT_UPDATES
        self.aliases = alias_of_returns(func)
        self.aliasing = any(a is not None for a, _ in self.aliases)
        self.memoizable = fresh and torch.Tag.nondeterministic_seeded not in func.tags
        self.inplace_view = torch.Tag.inplace_view in func.tags


_FACTS: dict = {}


def op_facts(func) -> _OpFacts:
    """The :class:`_OpFacts` of ``func``."""
    facts = _FACTS.get(id(func))
    if facts is None or facts.func is not func:
        facts = _FACTS[id(func)] = _OpFacts(func)
    return facts


class _Mode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # otherwise TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose first
        # call imports torch._dynamo (seconds); nothing here is ever compiled
        return False

    def __init__(self, tracer: "Tracer"):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.tracer.dispatch(func, args, kwargs or {})


_SPARSE_CONSTRUCTORS = frozenset({torch.sparse_coo_tensor, torch.sparse_csr_tensor, torch.sparse_csc_tensor,
                                  torch.sparse_bsr_tensor, torch.sparse_bsc_tensor, torch.sparse_compressed_tensor})


class _Factories(TorchFunctionMode):
    """Sparse constructors, which no tensor argument's ``__torch_function__`` sees (factories):
    PyTorch's invariant check (``check_invariants=True``) reads the indices through data pointers,
    which a traced tensor has none of. The traced call skips it; it runs on the primals instead
    where their values are known (under global tracing, evaluation runs the user's own check)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _SPARSE_CONSTRUCTORS:
            return func(*args, **kwargs)
        check = kwargs.get("check_invariants")
        if check is None:
            check = torch.sparse.check_sparse_tensor_invariants.is_enabled()
        if check:
            flat, spec = tree_flatten((args, kwargs))
            primals = [t.primal if isinstance(t, TracedTensor) else t for t in flat]
            if not any(isinstance(t, torch.Tensor) and t.is_meta for t in primals):
                pargs, pkwargs = tree_unflatten(primals, spec)
                with _disable_current_modes(), torch._C.DisableTorchFunctionSubclass():
                    func(*pargs, **dict(pkwargs, check_invariants=True))
        return func(*args, **dict(kwargs, check_invariants=False))


@dataclass(frozen=True)
class TraceInfo:
    """What a finished trace saw of the traced function, beyond its pattern.

    Attributes
    ----------
    ops
        The ATen overloads applied to traced tensors (forward and, where ``f`` calls autograd,
        backward ops): with ``gaps``, what :func:`asd.detection.ad_gaps.unsafe_modes` reads.
    writes_input
        ``f`` wrote into the storage of a traced input (an in-place op on it or on a view of it):
        evaluation must hand ``f`` a copy of the caller's tensor.
    no_grad_cut
        ``f`` computed from traced values under ``torch.no_grad()`` / ``set_grad_enabled(False)``
        (or a backward pass without ``create_graph``): detection cut those dependencies as reverse
        mode does; forward-mode products (dual numbers) do not, so they would differ.
    calls_autograd
        ``f`` calls ``torch.autograd.grad`` / ``backward`` on traced tensors (the force-field idiom
        ``-autograd.grad(E, pos, create_graph=True)``): only reverse-mode evaluation, where the
        input has ``requires_grad=True`` as during detection, sees what detection saw.
    fallback_ops
        Names of the ops traced by the conservative rule.
    gaps
        The :class:`asd.detection.ad_gaps.Gap` entries (PyTorch derivative formulas known to be
        wrong in some AD mode) that ``f``'s calls fall into.
    elements
        The elements of the tensors the traced ops computed or wrote in place (views aside): the
        size of one evaluation of ``f``, which the cost estimate of a one-call operator reads
        (:func:`asd.coloring.choose.one_call_prefers_star`). A lower bound of the work: a matrix
        product or a convolution counts the elements it writes, not its multiplications.
    custom_functions
        Names of the ``torch.autograd.Function`` classes that ``f``'s output was computed through:
        the trace follows the ops of their ``forward``, PyTorch differentiates their ``backward``
        (or ``jvp``), which may not follow them (a straight-through estimator), so operators check
        their first call (:func:`custom_functions_of`).
    float_dtypes
        The floating dtypes of the tensors the traced ops computed: an ``f`` that computes in
        float32 on a float64 input has float32's rounding in its derivatives, whatever their dtype
        (acyclic substitution is then not the default).
    """

    ops: frozenset
    writes_input: bool
    no_grad_cut: bool
    calls_autograd: bool
    fallback_ops: frozenset
    gaps: frozenset = frozenset()
    elements: int = 0
    custom_functions: frozenset = frozenset()
    float_dtypes: frozenset = frozenset()

    def coarsest(self) -> torch.dtype | None:
        """The least precise real floating dtype a traced op computed in (``None``: none seen)."""
        reals = [d.to_real() if d.is_complex else d for d in self.float_dtypes]
        return max(reals, key=lambda d: torch.finfo(d).eps, default=None)

    def computes_coarser_than(self, dtype: torch.dtype) -> bool:
        """Whether a traced op computed in a floating dtype less precise than ``dtype``."""
        coarsest = self.coarsest()
        return coarsest is not None and torch.finfo(coarsest).eps > torch.finfo(dtype).eps


class Tracer:
    """Traces index sets through a function of one flat input of ``n`` elements.

    Parameters
    ----------
    n
        Number of input elements (columns of every set matrix).
    local
        Trace with real values (sets may then depend on them, e.g. ``relu``); otherwise the
        input's primal is a meta tensor and any use of its values raises :class:`TracingError`.
    strict
        Raise :class:`UnsupportedOpError` on an op without a rule instead of warning.
    device
        The device traced tensors report (the user's input device).
    """

    #: under local tracing, rules may drop a dependency whose derivative vanishes at the point
    #: without vanishing around it (an element of a product whose other factor is zero there): the
    #: sets are then the first derivatives' nonzeros at the point. A second derivative need not
    #: vanish there (``x0 * x1`` at ``x1 = 0``), so the Hessian tracer keeps such dependencies;
    #: a dependency that is absent around the point (``relu`` below its kink, a constant zero factor)
    #: is dropped by both
    drops_vanishing: bool = True
    #: whether the trace intercepts sparse constructors (:class:`_Factories`): a mode on every torch
    #: call, so only on the second try of a trace whose first read a traced tensor's memory
    sees_factories: bool = False

    def __init__(self, n: int, *, local: bool, strict: bool = False, device=None):
        self.n = n
        self.local = local
        self.strict = strict
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.warned: set[str] = set()
        self.fallback_ops: set[str] = set()
        self.ops_seen: set = set()
        self.writes_input = False
        self.no_grad_cut = False
        self.calls_autograd = False
        self.gaps: set = set()
        self.elements = 0
        self.float_dtypes: set = set()
        self.custom_functions: frozenset = frozenset()
        self._decomposing = 0
        self._input_storages: list[Storage] = []
        # elementwise rules may leave an output's union pending (merged where it is read), unless
        # a subclass observes the rules' results (the Hessian tracer reads them at once)
        self._lazy = type(self).observe is Tracer.observe

    def info(self) -> TraceInfo:
        """What this trace saw besides the index sets (see :class:`TraceInfo`)."""
        return TraceInfo(frozenset(self.ops_seen), self.writes_input, self.no_grad_cut, self.calls_autograd,
                         frozenset(self.fallback_ops), frozenset(self.gaps), self.elements, self.custom_functions,
                         frozenset(self.float_dtypes))

    def note_autograd(self) -> None:
        self.calls_autograd = True

    # -- context ------------------------------------------------------------------------------
    def __enter__(self):
        # f runs with gradients recorded, as under evaluation's transforms (which ignore an outer
        # no_grad); no_grad regions inside f then cut dependencies as they do in reverse mode
        self._grad = torch.enable_grad()
        self._grad.__enter__()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._factories = _Factories() if self.sees_factories else None
        if self._factories is not None:
            self._factories.__enter__()
        push_tracer(self)
        return self

    def __exit__(self, *exc):
        pop_tracer(self)
        # the mode holds the tracer: dropped here, so that the trace's index sets (tens of MB at 10^6
        # inputs) are freed with the tracer, not when the garbage collector finds the cycle
        if self._factories is not None:
            self._factories.__exit__(*exc)
        mode, self._mode = self._mode, None
        mode.__exit__(*exc)
        self._grad.__exit__(*exc)
        return False

    # -- construction -------------------------------------------------------------------------
    def input(self, x: torch.Tensor, sets: sp.csr_matrix | None = None) -> TracedTensor:
        """The traced stand-in for the input ``x`` (its elements are inputs ``0..numel-1``).

        Call it inside the tracer's context. Like the inputs of evaluation, the stand-in has
        ``requires_grad=True`` and is not a leaf (``f`` may write into it); its values (under
        ``local=True``) are a copy, so ``f`` never writes into the caller's ``x``."""
        with no_dispatch():  # the primal is a plain tensor, not a traced constant
            if not self.local:
                primal = torch.empty(x.shape, dtype=x.dtype, device="meta")
            else:
                primal = x.detach().clone(memory_format=torch.contiguous_format)
        if sets is None:
            sets = S.identity(x.numel())
        leaf = TracedTensor(Storage(primal, sets), primal, None, x.device, requires_grad=True)
        stand_in = leaf.clone()
        self._input_storages.append(stand_in._storage)
        return stand_in

    def constant(self, t: torch.Tensor):
        """A traced tensor with value ``t`` that depends on no input (sparse layouts stay plain)."""
        if t.layout != torch.strided:
            return t
        return TracedTensor(Storage(t, S.empty(t.numel(), self.n)), t, None, self.device)

    def wrap(self, primal: torch.Tensor, sets: sp.csr_matrix | S.PendingUnion | None) -> TracedTensor:
        if primal.layout != torch.strided:
            if isinstance(sets, S.PendingUnion):
                sets = sets.merged()
            # sparse layouts: a constant stays a plain sparse tensor (its structure is respected by
            # the product rules); one whose values depend on the input cannot be traced
            if sets is not None and sets.nnz and is_differentiable_dtype(primal.dtype):
                raise TracingError(
                    f"a {primal.layout} tensor computed from the input cannot be traced; build sparse "
                    "matrices from constants only, or keep input-dependent values dense")
            return primal
        if primal.is_conj() or primal.is_neg():
            primal = primal.resolve_conj().resolve_neg()
        if sets is None or not is_differentiable_dtype(primal.dtype):
            sets = S.empty(primal.numel(), self.n)
        if sets.shape[0] != primal.numel():
            raise AssertionError(
                f"internal error: a rule produced {sets.shape[0]} index sets for an output of "
                f"{primal.numel()} elements"
            )
        self.elements += primal.numel()
        if primal.dtype.is_floating_point or primal.dtype.is_complex:
            self.float_dtypes.add(primal.dtype)
        return TracedTensor(Storage(primal, sets), primal, None, self.device)

    # -- dispatch -----------------------------------------------------------------------------
    def dispatch(self, func, args, kwargs):
        if not kwargs and self._lazy and not self.local and "observe" not in self.__dict__:
            fn = _pointwise_rule(func)
            if fn is not None:
                out = self._pointwise(func, args, fn)
                if out is not None:
                    return out
            elif func in _PERMUTING:
                out = self._permuting(func, args)
                if out is not None:
                    return out
            elif func is _STACK:
                out = self._stacking(args)
                if out is not None:
                    return out
            elif func is _VIEW or func is _UNBIND:
                out = self._viewing(func, args)
                if out is not None:
                    return out
        facts = op_facts(func)
        flat, spec = _flatten_call(args, kwargs)
        traced = [a for a in flat if isinstance(a, TracedTensor)]
        if traced:
            self.ops_seen.add(func)
            # an op inside another's decomposition is not what AD differentiates: the outer op's formula is
            if facts.qualname in GAPS and not self._decomposing:
                gaps = gaps_of(func, lambda: bind(func, args, kwargs))
                if gaps:
                    self.gaps.update(gaps)

        if facts.scalar:
            return self._scalar(func, args, kwargs, traced)
        if facts.detach and traced:
            # an alias that keeps its sets: autograd also detaches the outputs it saves for backward
            # and unpacks them tracked again; whether a use is cut is decided there (``detached``)
            a = args[0]
            alias = TracedTensor(a._storage, a.primal.detach(), a._idx, self.device)
            alias._detached = True
            return alias

        if not traced:
            out = func(*args, **kwargs)
            return tree_map(lambda t: self.constant(t) if isinstance(t, torch.Tensor) else t, out)

        if facts.to_sparse and any(t.sets.nnz for t in traced):
            raise TracingError(
                f"{func}: a sparse tensor computed from the input cannot be traced; build sparse "
                "matrices from constants only, or keep input-dependent values dense")
        rule = lookup(func)
        decompose = _decomposition(func, rule) if rule is None else None
        if decompose is not None:  # traced through the ops it decomposes into, each by its rule
            # below autograd: the decomposition's intermediates are untracked, yet not detached
            self._decomposing += 1
            try:
                return decompose(*args, **kwargs)
            finally:
                self._decomposing -= 1
        any_meta = any(t.primal.is_meta for t in traced)
        mutated = facts.mutated
        before = {}
        if mutated:
            self._prepare_mutation(func, args, kwargs, mutated, any_meta)
            if self.local and not any_meta and not facts.inplace_view:
                before = self._snapshot(func, args, kwargs, mutated)

        def unwrap(a):
            if isinstance(a, TracedTensor):
                a = a.primal
            if isinstance(a, torch.Tensor) and any_meta and not a.is_meta:
                if a.layout != torch.strided:  # sparse constants: only the shape matters here
                    return torch.empty(a.shape, dtype=a.dtype, device="meta")
                return a.to("meta")
            return a

        pflat = [unwrap(a) for a in flat]
        pargs, pkwargs = _unflatten(pflat, spec)
        if any_meta and pkwargs.get("device") is not None:
            pkwargs["device"] = torch.device("meta")  # e.g. x.to("cpu", copy=True) on a meta primal
        if facts.stat_update:
            pargs, pkwargs = _private_stats(func, pargs, pkwargs)
        try:
            if any_meta and not mutated:
                pout = _meta_call(func, pflat, spec, pargs, pkwargs, facts)
            else:
                pout = func(*pargs, **pkwargs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
            if any_meta and func in _SHAPE_NEEDS_NO_DATA:
                pout = _run_at_generic_point(func, flat, spec)
            elif any_meta:
                # A genuine error in f (mismatched shapes) fails at any point too: report it as such.
                try:
                    _run_at_generic_point(func, flat, spec)
                except TracingError:
                    raise
                except Exception:  # noqa: BLE001
                    raise exc from None
                raise TracingError(
                    f"{func} cannot be traced without values under global tracing "
                    f"({str(exc).splitlines()[0][:200]}); "
                    "its output shape or result depends on data. Pass local=True to trace at a point."
                ) from exc
            else:
                raise

        outs_flat, out_spec = _flatten(pout)
        out_tensors = [o for o in outs_flat if isinstance(o, torch.Tensor)]
        restore = {}
        if before:  # the rule reads the values the op overwrote, as its out-of-place variant would
            stand_ins = {i: self._before_write(t, p) for i, (t, p) in before.items()}
            restore = {id(s): before[i][0] for i, s in stand_ins.items()}
            swap = lambda a: stand_ins.get(id(a), a) if isinstance(a, TracedTensor) else a  # noqa: E731
            args = tuple(swap(a) for a in args)
            kwargs = {k: swap(v) for k, v in kwargs.items()}
        call = Call(func, args, kwargs, pargs, pkwargs, out_tensors, self)

        if facts.aliasing:
            return self._aliasing(call, pout, facts.aliases, restore)

        call.lazy = self._lazy and rule is not None and rule.builtin and "observe" not in self.__dict__
        out_sets = self._run_rule(call, rule)
        wrapped = [self.wrap(t, s) for t, s in zip(out_tensors, out_sets)]
        if func in _LAZY_ALIASES and isinstance(args[0], TracedTensor):
            # PyTorch's conj() / negative view aliases its input, asd follows a resolved copy: writes
            # into either while the other lives are refused
            self._alias_copy(args[0], wrapped[0])
        wrapped = iter(wrapped)
        return _unflatten([next(wrapped) if isinstance(o, torch.Tensor) else o for o in outs_flat], out_spec)

    def _pointwise(self, func, args: tuple, fn) -> TracedTensor | None:
        """What :meth:`dispatch` returns for a functional pointwise op under global tracing, in the
        one case a traced function repeats most: every tensor operand a traced meta tensor of one
        floating dtype and one shape, contiguous, the others Python numbers (``u * v + 2.0``). The
        output is then a contiguous tensor of that shape and dtype, and the op's own rule gives its
        sets; the general path would compute the same through the meta kernel's memo. ``None``
        where the case does not apply (the general path then runs)."""
        if not 0 < len(args) <= 2:
            return None
        shape = dtype = None
        pargs = []
        for a in args:
            if type(a) is TracedTensor:
                p = a.primal
                if dtype is None:
                    shape, dtype = p.shape, p.dtype
                    if (not p.is_meta or p.layout != torch.strided or not dtype.is_floating_point or not p.numel()
                            or p.stride() != _canonical_strides(shape)):
                        return None
                elif (not p.is_meta or p.layout != torch.strided or p.dtype != dtype or p.shape != shape
                      or p.stride() != _canonical_strides(shape)):
                    return None
                pargs.append(p)
            elif type(a) is int or type(a) is float:
                pargs.append(a)
            else:
                return None
        if dtype is None:
            return None
        rule = lookup(func)
        if rule is None or rule.fn is not fn or not rule.builtin:
            return None
        self.ops_seen.add(func)
        out = torch.empty_strided(shape, _canonical_strides(shape), dtype=dtype, device="meta")
        call = Call(func, args, {}, tuple(pargs), {}, [out], self)
        call.lazy = True
        out_sets = fn(call)
        return self.wrap(out, out_sets[0])

    def _permuting(self, func, args: tuple) -> TracedTensor | None:
        """What :meth:`dispatch` returns for ``roll`` / ``flip`` / ``clone`` of a contiguous traced
        meta tensor with Python int arguments under global tracing: a contiguous tensor of its shape
        whose sets are the input's rows in the order the op moves the elements (found once per
        shape and arguments by running the op on element ids, as the movement rule does). ``None``
        where the case does not apply (the general path then runs)."""
        if not args or type(args[0]) is not TracedTensor:
            return None
        a = args[0]
        p = a.primal
        shape = p.shape
        if (not p.is_meta or p.layout != torch.strided or not p.dtype.is_floating_point or not p.numel()
                or p.stride() != _canonical_strides(shape)):
            return None
        key = [func, shape]
        for v in args[1:]:
            if type(v) is int:
                key.append(v)
            elif type(v) is list or type(v) is tuple:
                for i in v:
                    if type(i) is not int:
                        return None
                key.append((type(v), tuple(v)))
            else:
                return None
        rule = lookup(func)
        if rule is None or not rule.builtin or rule.fn is not movement:
            return None
        rows = _permutation_rows(tuple(key), func, args[1:])
        if rows is None:
            return None
        self.ops_seen.add(func)
        out = torch.empty_strided(shape, _canonical_strides(shape), dtype=p.dtype, device="meta")
        s = sets_of(self, a)
        if s is None or rows is _UNMOVED:
            return self.wrap(out, s)
        return self.wrap(out, S.take_rows(s, rows))

    def _viewing(self, func, args: tuple):
        """What :meth:`dispatch` returns for ``view`` (``reshape`` of a contiguous tensor) and
        ``unbind`` along dim 0 of a contiguous real floating traced meta tensor under global
        tracing: views of its storage whose elements are its own, in order (``view``) or in
        consecutive blocks (``unbind``). ``None`` where the case does not apply (the general path,
        whose movement rule finds the same element maps by running the op on element ids, then
        runs)."""
        a = args[0] if args else None
        if type(a) is not TracedTensor or a._lazy is not None or a._component:
            return None
        p = a.primal
        if (not p.is_meta or p.layout != torch.strided or not p.dtype.is_floating_point or not p.numel()
                or p.stride() != _canonical_strides(p.shape)):
            return None
        if func is _VIEW:
            if len(args) != 2 or type(args[1]) not in (list, tuple) or any(type(d) is not int for d in args[1]):
                return None
            outs = [p.view(args[1])]
            ids = [None]
        else:
            if len(args) == 2 and args[1] not in (0, -p.dim()):
                return None
            if len(args) > 2 or p.dim() == 0:
                return None
            outs = list(p.unbind(0))
            m = outs[0].numel() if outs else 0
            ids = [np.arange(i * m, (i + 1) * m, dtype=np.int64) for i in range(len(outs))]
        self.ops_seen.add(func)
        views = []
        for out, k in zip(outs, ids):
            if k is None:  # every element where it was: the base's element map (and its rows taken)
                view = TracedTensor(a._storage, out, a._idx, self.device)
                view._sets_cache = a._sets_cache
            else:
                view = self._view(a, out, k)
            view._detached = a._detached
            views.append(view)
        return views[0] if func is _VIEW else tuple(views)

    def _stacking(self, args: tuple) -> TracedTensor | None:
        """What :meth:`dispatch` returns for ``stack`` along dim 0 of contiguous traced meta tensors
        of one shape and floating dtype, each depending on some input: a contiguous tensor whose
        sets are theirs one after the other. ``None`` where the case does not apply (the general
        path then runs)."""
        if not args or len(args) > 2 or type(args[0]) is not list:
            return None
        tensors = args[0]
        if not tensors or type(tensors[0]) is not TracedTensor:
            return None
        p0 = tensors[0].primal
        shape, dtype = p0.shape, p0.dtype
        if len(args) == 2 and (type(args[1]) is not int or args[1] not in (0, -len(shape) - 1)):
            return None
        if not dtype.is_floating_point or not p0.numel():
            return None
        rule = lookup(_STACK)
        if rule is None or not rule.builtin or rule.fn is not movement:
            return None
        strides = _canonical_strides(shape)
        parts = []
        for t in tensors:
            if type(t) is not TracedTensor:
                return None
            p = t.primal
            if (not p.is_meta or p.layout != torch.strided or p.dtype != dtype or p.shape != shape
                    or p.stride() != strides):
                return None
            s = sets_of(self, t)
            if s is None:
                return None
            parts.append(s)
        self.ops_seen.add(_STACK)
        out_shape = torch.Size((len(tensors), *shape))
        out = torch.empty_strided(out_shape, _canonical_strides(out_shape), dtype=dtype, device="meta")
        return self.wrap(out, S.vstack(parts))

    @staticmethod
    def _alias_copy(base: TracedTensor, copy: TracedTensor) -> None:
        """``copy`` aliases ``base`` in PyTorch and is followed as a copy: a write into ``copy``, or
        into ``base``'s storage while ``copy`` lives, raises :class:`TracingError`."""
        copy._storage.copy_of = base._storage
        copy._storage.stale = base._storage.stale
        if base._storage.alias_copies is None:
            base._storage.alias_copies = weakref.WeakSet()
        base._storage.alias_copies.add(copy)

    def _run_rule(self, call: Call, rule=False) -> list:
        """Output sets of ``call`` by its rule (``rule``: ``lookup(call.func)`` where the caller has
        it, else ``False``)."""
        if rule is False:
            rule = lookup(call.func)
        if rule is None:
            self.unsupported(call.func)
            out_sets = conservative(call)
        else:
            out_sets = self.rule_sets(call, rule, rule.fn(call))
        if len(out_sets) != len(call.outs):
            raise AssertionError(f"internal error: rule for {call.func} returned {len(out_sets)} "
                                 f"set matrices for {len(call.outs)} outputs")
        for o, s in zip(call.outs, out_sets):
            if s is not None and s.shape != (o.numel(), self.n):
                raise AssertionError(f"internal error: rule for {call.func} returned sets of shape "
                                     f"{s.shape} for an output of {o.numel()} elements")
        self.observe(call, rule, out_sets)
        return out_sets

    def rule_sets(self, call: Call, rule, out_sets) -> list:
        """``out_sets``, what ``rule`` returned for ``call``: asd's own rules' as they are, any other
        rule's checked in full and converted (:func:`asd.detection.sets.from_rule`), since the set
        algebra's kernels trust their input."""
        if rule.builtin:
            return out_sets
        who = f"the sparsity rule {getattr(rule.fn, '__qualname__', rule.fn)!r} registered for {call.func}"
        if (out_sets is None or sp.issparse(out_sets) or isinstance(out_sets, (np.ndarray, torch.Tensor, str))
                or not hasattr(out_sets, "__iter__")):
            raise InputError(f"{who} returned {type(out_sets).__name__}: return a list with one scipy.sparse matrix "
                            f"(or None) per output of the op ({len(call.outs)} here)")
        out_sets = list(out_sets)
        if len(out_sets) != len(call.outs):
            raise InputError(f"{who} returned {len(out_sets)} set matrices for {len(call.outs)} outputs")
        return [None if s is None else S.from_rule(s, (o.numel(), self.n), who) for o, s in zip(call.outs, out_sets)]

    def detached(self, t: TracedTensor) -> bool:
        """Whether reverse mode sees ``t`` as a constant here: gradients are being recorded, yet
        autograd does not track ``t`` (computed under ``no_grad``, or by a backward pass without
        ``create_graph``). Its index sets are then cut, and the trace notes it (``no_grad_cut``).
        While recording is off (inside a no_grad region or an ``autograd.Function``'s forward) sets
        propagate as usual: what counts is whether the result is tracked where it is used."""
        if (t.requires_grad or self._decomposing or not torch.is_grad_enabled()
                or not is_differentiable_dtype(t.dtype)):
            return False
        if t.sets.nnz:
            self.no_grad_cut = True
            return True
        return False

    def observe(self, call: Call, rule, out_sets: list) -> None:
        """Hook run after every rule (``rule`` is ``None`` for the fallback); subclasses such as
        the Hessian tracer record second-order information here."""

    def unsupported(self, func) -> None:
        """Record that ``func`` is traced by the conservative rule: warn once, or raise under strict."""
        name = str(func)
        self.fallback_ops.add(name)
        if self.strict:
            raise UnsupportedOpError(
                f"no sparsity rule for {name}; without strict=True it is traced conservatively "
                "(every output element depends on every input element of the op)"
            )
        if name not in self.warned:
            self.warned.add(name)
            warnings.warn(
                f"asd: no sparsity rule for {name}; using the conservative rule (every output "
                "element depends on every input of the op). The pattern stays correct but may be "
                "denser than necessary.", UnsupportedOpWarning, stacklevel=4)

    # -- special cases ------------------------------------------------------------------------
    def _scalar(self, func, args, kwargs, traced):
        for t in traced:
            if t.primal.is_meta:
                raise TracingError(
                    "value-dependent control flow or conversion to a Python number "
                    f"({func}) under global tracing: the traced values are unknown. Pass "
                    "local=True to trace at the given point, or rewrite the branch with torch.where."
                )
        pargs, pkwargs = tree_map(lambda a: a.primal if isinstance(a, TracedTensor) else a, (args, kwargs))
        return func(*pargs, **pkwargs)

    def _prepare_mutation(self, func, args, kwargs, mutated, any_meta):
        b = bind(func, args, kwargs)
        names = [func._schema.arguments[j].name for j in mutated]
        for name in names:
            target = b.get(name)
            targets = target if isinstance(target, (list, tuple)) else [target]
            for t in targets:
                if isinstance(t, TracedTensor):
                    storage = t._storage
                    while any_meta and storage.complex_base is not None:  # the real tensors it views, nested
                        storage = storage.complex_base._storage
                        storage.make_meta()
                    if any(t._storage is s for s in self._input_storages):
                        self.writes_input = True
                    if any_meta:
                        t._storage.make_meta()
                elif isinstance(t, torch.Tensor) and not (func in _STAT_UPDATES and name in _STAT_NAMES):
                    raise TracingError(
                        f"{func} writes traced values into a tensor created outside the traced "
                        "function; create that buffer inside the function (e.g. torch.zeros_like(x))"
                    )

    def _snapshot(self, func, args, kwargs, mutated) -> dict:
        """``{id(t): (t, copy of its values)}`` for the traced tensors ``func`` will write into."""
        b = bind(func, args, kwargs)
        out = {}
        for j in mutated:
            target = b.get(func._schema.arguments[j].name)
            for t in target if isinstance(target, (list, tuple)) else [target]:
                if isinstance(t, TracedTensor):
                    out[id(t)] = (t, t.primal.clone())
        return out

    def _before_write(self, t: TracedTensor, values: torch.Tensor) -> TracedTensor:
        """``t`` as it was before an in-place op: its storage and element map, the old values."""
        stand_in = TracedTensor(t._storage, values, t._idx, self.device, requires_grad=t.requires_grad)
        stand_in._detached = t._detached
        return stand_in

    def _aliasing(self, call: Call, pout, aliases, restore: dict | None = None):
        """Views share their base's storage; in-place ops write sets back into it (``restore`` maps
        the stand-ins a rule saw back to the tensors the op returns)."""
        func = call.func
        args = call.args
        b_args = list(args) + [call.kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
        writes = [(j, w) for j, w in aliases if j is not None and w]
        if op_facts(func).inplace_view and isinstance(b_args[0], TracedTensor):
            return self._inplace_view(call, b_args[0])
        if writes:
            out_sets = self._run_rule(call)
            results = []
            for (j, _), s in zip(writes, out_sets):
                target = b_args[j]
                target = (restore or {}).get(id(target), target)
                self.elements += target.numel()  # an in-place op computes as its out-of-place variant does
                if not target._detached:
                    # also with recording off (a no_grad region, an autograd.Function's forward): the
                    # written sets are what reverse mode sees wherever the result is tracked
                    self._write(target, s)
                    z = target._storage
                    while z.complex_base is not None:  # through view_as_complex: each real pair gets its element's sets
                        real = z.complex_base
                        self._write(real, S.take_rows(z.sets, np.repeat(np.arange(z.rows, dtype=np.int64), 2)))
                        z = real._storage
                    _leave_behind(target._storage)
                elif s is not None and s.nnz:
                    # through a detached alias autograd does not see the write: the tensor behind it
                    # keeps the dependencies it had, as reverse mode sees them
                    self.no_grad_cut = True
                results.append(target)
            return results[0] if len(results) == 1 and not isinstance(pout, (list, tuple)) else tuple(results)

        j = aliases[0][0]
        base = b_args[j]
        rows = storage_view_rows(call, base)
        if rows is not None:  # as_strided: positions in the storage, wherever the base starts
            return self._view(base, call.outs[0], rows, of_storage=True)
        ids_list = view_ids(call, base)
        if ids_list is None and base._storage.stale is not None:  # a copy of a stale tensor is stale
            wrapped = [self.wrap(t, None) for t in call.outs]
            for w in wrapped:
                if isinstance(w, TracedTensor):
                    w._storage.stale = base._storage.stale
        elif ids_list is None:  # no id map: treat as a conservative copy
            out_sets = self._run_rule(call)
            wrapped = [self.wrap(t, s) for t, s in zip(call.outs, out_sets)]
        else:
            wrapped = [self._view(base, t, ids) for t, ids in zip(call.outs, ids_list)]
        if func in _COMPONENT_VIEWS and base.is_complex():
            wrapped[0]._component = True
        elif ((func in _LAZY_ALIASES or func is aten.as_strided.default) and isinstance(wrapped[0], TracedTensor)
              and wrapped[0]._storage is not base._storage):
            # (as_strided: a window beyond the memory the trace knows, off a captured constant view,
            # read as a copy of constants: a write through it would reach memory the copy does not)
            self._alias_copy(base, wrapped[0])
        elif func is aten.view_as_complex.default and isinstance(wrapped[0], TracedTensor):
            # a copy of index sets where PyTorch aliases memory: a write into the copy is written
            # into the real tensor as well; one into the real tensor while the copy lives is refused
            wrapped[0]._storage.complex_base = base
            if base._storage.alias_copies is None:
                base._storage.alias_copies = weakref.WeakSet()
            base._storage.alias_copies.add(wrapped[0])
        if isinstance(pout, (list, tuple)):
            return type(pout)(wrapped)
        return wrapped[0]

    def _inplace_view(self, call: Call, target: TracedTensor) -> TracedTensor:
        """``squeeze_``, ``t_``, ``transpose_``...: the same tensor, with new metadata and element map."""
        rows = storage_view_rows(call, target)
        ids_list = [rows] if rows is not None else view_ids(call, target)
        if ids_list is None:
            raise TracingError(f"{call.func} changes a traced tensor's shape in place in a way asd cannot "
                               "follow; use the out-of-place variant (e.g. x = x.squeeze(0))")
        primal = call.outs[0]
        # change the wrapper's own sizes and strides, as torch.utils._python_dispatch does for
        # wrapper subclasses (no storage: run the op on the metadata only)
        rest = [a.primal if isinstance(a, TracedTensor) else a for a in call.args[1:]]
        with no_dispatch():
            meta_in_tls = torch._C._meta_in_tls_dispatch_include()
            torch._C._set_meta_in_tls_dispatch_include(True)
            try:
                call.func(target, *rest, **call.kwargs)
            finally:
                torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
        ids = ids_list[0]
        idx = ids if target._idx is None or rows is not None else target._idx[ids]
        if _is_identity(idx, target._storage.rows):
            idx = None
        target._idx = idx
        target._sets_cache = None
        target._primal = primal
        target._geom = (tuple(primal.shape), tuple(primal.stride()), primal.storage_offset())
        target._epoch = target._storage.epoch
        return target

    def _view(self, base: TracedTensor, primal: torch.Tensor, ids: np.ndarray, of_storage: bool = False) -> TracedTensor:
        """A view of ``base``: element ``k`` is ``base``'s element ``ids[k]`` (``of_storage``: the
        storage's element ``ids[k]``)."""
        idx = ids if base._idx is None or of_storage else base._idx[ids]
        storage = base._storage
        if _is_identity(idx, storage.rows):
            idx = None
        view = TracedTensor(storage, primal, idx, self.device)
        view._detached = base._detached
        view._component = base._component
        if primal.is_conj() or primal.is_neg():  # PyTorch's lazy bits, which view_as_real and others refuse
            view._lazy = (primal.is_conj(), primal.is_neg())
            view._primal = primal.resolve_conj().resolve_neg()
        return view

    def _write(self, target: TracedTensor, new_sets: sp.csr_matrix | None) -> None:
        storage = target._storage
        if new_sets is None:
            new_sets = S.empty(target.numel(), self.n)
        if target._component:  # one component of complex elements: each row keeps the other's sets
            rows = storage.sets.shape[0]
            idx = np.arange(rows, dtype=np.int64) if target._idx is None else target._idx
            k = len(idx)
            storage.sets = S.gather_union(S.vstack([storage.sets, new_sets]),
                                          np.concatenate([np.arange(rows, dtype=np.int64), idx]),
                                          np.concatenate([np.arange(rows, dtype=np.int64),
                                                          rows + np.arange(k, dtype=np.int64)]), rows)
            return
        if target._idx is None:
            storage.sets = new_sets
            return
        rows = storage.sets.shape[0]
        mapping = np.arange(rows, dtype=np.int64)
        mapping[target._idx] = rows + np.arange(len(target._idx), dtype=np.int64)
        storage.sets = S.take_rows(S.vstack([storage.sets, new_sets]), mapping)


_COMPONENT_VIEWS = frozenset({aten.view_as_real.default, aten.real.default, aten.imag.default})
def _leave_behind(storage) -> None:
    """After a write into ``storage``: where asd copies what PyTorch aliases (a ``conj()`` view), the
    other side no longer follows it, and reading it later raises (it may never be read:
    ``z += z.conj()``, ``fft.ihfft(x).mul_(2)``)."""
    if storage.copy_of is not None:
        storage.copy_of.stale = _ALIAS_COPY
    for copy in list(storage.alias_copies or ()):
        copy._storage.stale = _ALIAS_COPY


_LAZY_ALIASES = frozenset({aten._conj.default, aten._neg_view.default})
_ALIAS_COPY = ("a tensor read after a write into a view of it, or into the tensor it views, cannot be traced where "
               "asd follows the view as a copy (torch.view_as_complex, conj() of a complex tensor, an as_strided "
               "window reaching beyond a captured view into the larger tensor behind it): take the view "
               "of a clone (torch.view_as_complex(y.clone()), z.clone().conj()), or take it after the write; a "
               "write through a view_as_complex view is followed")

# Whether a read-only element map owning its data (the memoized ids of a view op, shared by every
# trace that makes the same view) is the identity, by the array's id, with a weak reference to the array: the entry
# is for that array only while it lives, and keeps no array alive.
_IDENTITY: dict = {}
_IDENTITY_SIZE = 4096


def _is_identity(idx: np.ndarray, rows: int) -> bool:
    """Whether the element map ``idx`` of a view of a storage with ``rows`` elements is
    ``0, 1, ..., rows - 1`` (the view is its storage's own layout)."""
    k = len(idx)
    if k != rows or (k and (idx[0] != 0 or idx[-1] != k - 1)):
        return False
    if idx.flags.writeable or idx.base is not None:  # its values may change: compared each time
        return bool(np.array_equal(idx, np.arange(k)))
    hit = _IDENTITY.get(id(idx))
    if hit is not None and hit[0]() is idx:
        return hit[1]
    same = bool(np.array_equal(idx, np.arange(k)))
    if len(_IDENTITY) >= _IDENTITY_SIZE:
        _IDENTITY.clear()
    _IDENTITY[id(idx)] = (weakref.ref(idx), same)
    return same


def trace(f: Callable, x: torch.Tensor, *, local: bool, strict: bool = False,
          tracer_cls: type[Tracer] = Tracer) -> tuple[Any, Tracer]:
    """Run ``f`` on a traced stand-in of ``x`` under a ``tracer_cls``; returns ``f``'s output and
    the tracer."""
    return traced_call(lambda: tracer_cls(x.numel(), local=local, strict=strict, device=x.device),
                       lambda tracer: f(tracer.input(x)))


def custom_functions_of(out) -> frozenset:
    """Names of the ``torch.autograd.Function`` classes whose backward nodes the autograd graph of
    ``out``'s tensors reaches."""
    flat, _ = tree_flatten(out)
    stack = [t.grad_fn for t in flat if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen, names = set(stack), set()
    while stack:
        node = stack.pop()
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            cls = getattr(node, "_forward_cls", None)
            names.add(getattr(cls, "__qualname__", type(node).__name__))
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return frozenset(names)


def traced_call(make: Callable[[], Tracer], run: Callable[[Tracer], Any]) -> tuple[Any, Tracer]:
    """``run(tracer)`` inside a fresh tracer from ``make()``; returns its output and the tracer.
    Where PyTorch read a traced tensor's memory (it has none), as a sparse constructor's invariant
    check does, the call is traced again with :attr:`Tracer.sees_factories` set. Inside a
    ``torch.func`` transform every op would pass the transform's layers, which wrap the traced
    tensors: :class:`InputError` (an ``AttributeError`` of the wrapped stand-in before)."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        raise InputError("asd detects sparsity patterns outside torch.func transforms (vmap, grad, jacrev, jvp): "
                         "prepare the operator outside, e.g. op = asd.prepare_jacobian(f, x, args=(q0,)), and call "
                         "op.values(x, q) inside the transform (with check=False where its arguments vary)")
    for sees_factories in (False, True):
        tracer = make()
        tracer.sees_factories = sees_factories
        try:
            # forward-mode AD off in this thread: a dual tensor f captured (inside the caller's
            # dual_level) would meet the traced stand-ins, which carry no tangent (a segfault in
            # PyTorch); the pattern is that of the primal computation either way
            with tracer, torch.autograd.forward_ad._set_fwd_grad_enabled(False):
                out = run(tracer)
                tracer.custom_functions = custom_functions_of(out)
        except RuntimeError as e:
            text = str(e)
            if sees_factories or not ("data is not allocated yet" in text or "doesn't have storage" in text):
                raise
            continue
        return out, tracer
    raise AssertionError("unreachable")
