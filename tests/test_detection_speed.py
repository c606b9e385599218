"""Detection speed: the cold start of the tracer and the fast paths that serve it.

The tracer computes the output metadata of functional pointwise ops (and of a few common others)
without their meta kernels, many of which are Python references that import ``torch._dynamo`` or
sympy on first use (most of a second). These tests check that a fresh process detects without
those imports, and that the fast path's shape, dtype and strides are the meta kernel's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_flatten

from asd.detection import torch_tracer as T

aten = torch.ops.aten
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` and then :data:`_NO_HEAVY_IMPORTS` in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = textwrap.dedent(code) + textwrap.dedent(_NO_HEAVY_IMPORTS)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


_NO_HEAVY_IMPORTS = """
    for m in ("torch._dynamo", "sympy"):
        assert m not in sys.modules, m + " was imported"
    print("ok")
"""


def test_cold_detection_imports_neither_dynamo_nor_sympy():
    """Brusselator prepare, an MLP, common functions and a Hessian in a fresh process."""
    r = _fresh("""
        import sys, warnings
        import torch
        import torch.nn.functional as F
        import asd
        from asd.detection import hessian_pattern, jacobian_pattern
        from asd.problems import brusselator, brusselator_input
        assert "torch._dynamo" not in sys.modules and "sympy" not in sys.modules  # import asd itself
        f, x = brusselator(32), brusselator_input(32)
        asd.prepare_jacobian(f, x)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        jacobian_pattern(net, torch.randn(5, 8))
        W = torch.randn(8, 8, dtype=torch.float64)
        x = torch.randn(4, 8, dtype=torch.float64)
        for g in (lambda x: torch.softmax(x, -1), lambda x: F.log_softmax(x @ W, -1).mean(0),
                  lambda x: torch.cat([x[1:] - x[:-1], x[:1]]) ** 2, lambda x: torch.stack([x, 2 * x]).sum(0),
                  lambda x: x.norm(dim=-1) + x.var(-1) + x.amax(-1) + torch.logsumexp(x, -1),
                  lambda x: torch.cumsum(torch.tril(x.reshape(8, 4)), 0).flip(0),
                  lambda x: torch.where(x > 0, x.exp(), x.sin() / (1 + x ** 2)),
                  lambda x: F.mse_loss(x, torch.zeros_like(x)) + x.clamp(-1, 1).sum(),
                  lambda x: torch.bmm(x[None], x.t()[None])[0] @ x + x.repeat(2, 1)[:4] @ W.float().double()):
            jacobian_pattern(g, x)
        hessian_pattern(lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(), x[0])
    """)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_cold_prepare_and_call_imports_neither_dynamo_nor_sympy():
    """The whole cold start of a reverse-mode operator: detection, coloring, first evaluation."""
    r = _fresh("""
        import sys
        import torch
        import asd
        from asd.problems import brusselator, brusselator_input
        f, x = brusselator(32), brusselator_input(32)
        op = asd.prepare_jacobian(f, x)
        op(x)
    """)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


# -- the fast path against the meta kernels -------------------------------------------------------

def _both(func, args, kwargs=None):
    """(fast-path output or None, meta kernel output or the exception it raised)."""
    kwargs = kwargs or {}
    flat, spec = tree_flatten((args, kwargs))
    fast = T._fast_meta(func, flat, spec, args, kwargs)
    try:
        meta = func(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        meta = exc
    return fast, meta


def _agree(func, args, kwargs=None, *, expect_fast: bool | None = None):
    """The fast path's output (or None), checked against the meta kernel's."""
    fast, meta = _both(func, args, kwargs)
    if isinstance(meta, Exception):
        assert fast is None, f"{func}: the meta kernel raises {meta!r}, the fast path answers {fast}"
        return fast
    if expect_fast is not None:
        assert (fast is not None) == expect_fast, f"{func}: fast path {'missing' if fast is None else 'taken'}"
    if fast is not None:
        assert fast.is_meta
        got = (tuple(fast.shape), fast.dtype, fast.stride())
        want = (tuple(meta.shape), meta.dtype, meta.stride())
        assert got == want, f"{func} {[getattr(a, 'shape', a) for a in tree_flatten(args)[0]]}: {got} != {want}"
    return fast


def _m(shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.bool, torch.complex64, torch.complex128]

BINARY = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.pow.Tensor_Tensor,
          aten.maximum.default, aten.atan2.default, aten.eq.Tensor, aten.lt.Tensor, aten.logical_and.default,
          aten.bitwise_and.Tensor, aten.remainder.Tensor, aten.floor_divide.default, aten.hypot.default,
          aten.xlogy.Tensor, aten.copysign.Tensor, aten.fmod.Tensor]
UNARY = [aten.exp.default, aten.sin.default, aten.neg.default, aten.abs.default, aten.sqrt.default,
         aten.sigmoid.default, aten.tanh.default, aten.sign.default, aten.floor.default, aten.isnan.default,
         aten.reciprocal.default, aten.logical_not.default, aten.relu.default, aten.gelu.default,
         aten.erf.default, aten.log1p.default, aten.angle.default, aten.conj_physical.default]
SCALAR = [aten.add.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.sub.Tensor, aten.pow.Tensor_Scalar,
          aten.mul.Scalar, aten.add.Scalar, aten.rsub.Scalar, aten.eq.Scalar, aten.remainder.Scalar,
          aten.clamp.default, aten.leaky_relu.default]

SHAPE_PAIRS = [((), ()), ((3,), ()), ((), (2, 3)), ((2, 3), (3,)), ((2, 1), (1, 4)), ((4, 1, 3), (5, 3)),
               ((1,), (2, 2)), ((2, 3), (2, 3)), ((3,), (4,)), ((2, 3), (3, 2))]


@pytest.mark.parametrize("func", BINARY, ids=str)
@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=str)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float32, torch.float64),
                                    (torch.int64, torch.float16), (torch.int32, torch.int64), (torch.bool, torch.int64),
                                    (torch.float64, torch.complex64), (torch.bfloat16, torch.float16),
                                    (torch.uint8, torch.int8), (torch.bool, torch.bool)], ids=str)
def test_binary_pointwise_matches_meta(func, shapes, dtypes):
    _agree(func, (_m(shapes[0], dtypes[0]), _m(shapes[1], dtypes[1])))


@pytest.mark.parametrize("func", UNARY, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (1, 4, 1)], ids=str)
def test_unary_pointwise_matches_meta(func, dtype, shape):
    _agree(func, (_m(shape, dtype),))


@pytest.mark.parametrize("func", SCALAR, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.float16,
                                   torch.complex64], ids=str)
@pytest.mark.parametrize("scalar", [2, 2.5, True, 1 + 2j], ids=repr)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)], ids=str)
def test_pointwise_with_python_scalars_matches_meta(func, dtype, scalar, shape):
    x = _m(shape, dtype)
    names = [a.name for a in func._schema.arguments]
    if names[:2] == ["self", "other"] or names[:2] == ["self", "exponent"]:
        _agree(func, (x, scalar))
    elif func is aten.clamp.default:
        _agree(func, (x, -scalar if not isinstance(scalar, bool) else None, scalar))
    else:
        _agree(func, (x, scalar))


def test_zero_dim_operands_keep_their_lower_priority():
    # a 0-dim float64 tensor does not promote a float32 tensor; a 0-dim float one does promote an
    # integer tensor (a higher category), to its own dtype
    fast, meta = _both(aten.mul.Tensor, (_m((3,)), _m((), torch.float64)))
    assert fast is not None and fast.dtype == meta.dtype == torch.float32
    fast, meta = _both(aten.add.Tensor, (_m((3,), torch.int64), _m((), torch.float64)))
    assert fast is not None and fast.dtype == meta.dtype == torch.float64
    fast, meta = _both(aten.mul.Tensor, (_m((3,), torch.float16), 2.5))
    assert fast is not None and fast.dtype == meta.dtype == torch.float16


def test_three_operand_and_keyword_pointwise():
    c, x, y = _m((2, 1), torch.bool), _m((3,), torch.float64), _m((2, 3), torch.float32)
    _agree(aten.where.self, (c, x, y), expect_fast=True)
    _agree(aten.addcmul.default, (_m((2, 3)), _m((3,)), _m((2, 1))), {"value": 0.5}, expect_fast=True)
    _agree(aten.lerp.Scalar, (_m((4,)), _m((4,)), 0.3), expect_fast=True)
    _agree(aten.div.Tensor_mode, (_m((4,), torch.int64), _m((4,), torch.int64)), {"rounding_mode": "floor"},
           expect_fast=True)
    _agree(aten.gelu.default, (_m((4,)),), {"approximate": "tanh"}, expect_fast=True)


def test_layouts_the_fast_path_declines_or_matches():
    x = _m((4, 6))
    _agree(aten.mul.Tensor, (x.t(), _m((6, 4))), expect_fast=False)  # a transposed operand
    _agree(aten.mul.Tensor, (x[:, ::2], _m((4, 3))), expect_fast=True)  # a strided slice in row-major order
    _agree(aten.sub.Tensor, (x[1:, :-1], x[:-1, :-1]), expect_fast=True)  # a 2-D stencil's slices
    _agree(aten.mul.Tensor, (x.t()[:, ::2], _m((6, 2))), expect_fast=False)  # a transposed slice
    _agree(aten.mul.Tensor, (_m((6,)).expand(4, 6), x), expect_fast=True)  # an expanded contiguous operand
    _agree(aten.add.Tensor, (_m((4, 1)).expand(4, 6), _m((1, 6)).expand(4, 6)), expect_fast=True)
    _agree(aten.add.Tensor, (_m(()).expand(2, 3), _m(()).expand(2, 3)), expect_fast=True)
    _agree(aten.exp.default, (torch.empty_strided((3, 1, 4), (4, 100, 1), device="meta"),), expect_fast=False)
    _agree(aten.relu.default, (_m((1, 2)).permute(1, 0),), expect_fast=False)  # dense: its strides are copied
    _agree(aten.exp.default, (torch.empty_strided((3, 1, 4), (1, 100, 3), device="meta"),), expect_fast=False)
    _agree(aten.exp.default, (_m((0, 3)),), expect_fast=False)  # empty operands go to the meta kernel
    _agree(aten.exp.default, (_m((1,) * 9),), expect_fast=False)  # so do operands of many dims
    _agree(aten.exp.default, (_m((1,) * 8),), expect_fast=True)
    _agree(aten.clone.default, (x,), {"memory_format": torch.channels_last}, expect_fast=False)
    _agree(aten.mul.Tensor, (_m((2, 3)), _m((3, 2))))  # does not broadcast: both fail


# every functional pointwise overload of aten, with generic arguments drawn from its schema
def _pointwise_ops():
    ops = []
    for name in dir(aten):
        packet = getattr(aten, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for o in packet.overloads():
            op = getattr(packet, o)
            if T._fast_shape_fn(op) is T._pointwise_shape:
                ops.append(op)
    return sorted(ops, key=str)


POINTWISE = _pointwise_ops()


def test_the_pointwise_table_is_broad():
    assert len(POINTWISE) > 150
    assert aten.mul.Tensor in POINTWISE and aten.where.self in POINTWISE
    assert aten.add_.Tensor not in POINTWISE and aten.clone.default not in POINTWISE
    assert aten.bernoulli.p not in POINTWISE  # random


SCAN_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
               torch.uint8, torch.bool, torch.complex64, torch.complex128]


@pytest.mark.slow  # 40 s; the default suite samples the same space (test_any_pointwise_op_matches_meta)
def test_every_pointwise_op_and_dtype_combination_matches_meta():
    """Every pointwise overload with every (pair of) operand dtypes, a 0-dim first operand or not,
    and Python scalars of each kind: where the meta kernel answers, the fast path answers the same
    or declines; where it raises, the fast path declines. (``make test-all`` runs it.)"""
    import itertools

    answered = 0
    for op in POINTWISE:
        args_of = op._schema.arguments
        tens = [a for a in args_of if str(a.type) in ("Tensor", "Optional[Tensor]")]
        nums = [a for a in args_of if str(a.type) in ("number", "Optional[number]")]
        rest = [a for a in args_of if a not in tens and a not in nums and not a.has_default_value()]
        if any(str(a.type) not in ("int", "float") for a in rest):
            continue
        combos = (itertools.product(SCAN_DTYPES, repeat=len(tens)) if len(tens) <= 2
                  else [(d,) * len(tens) for d in SCAN_DTYPES])
        for dts in combos:
            for scalar in [None] if not nums else [2, 0.5, True, 1 + 1j]:
                for shapes in ([(3,)] * len(tens), [()] * len(tens), [()] + [(3,)] * (len(tens) - 1),
                               [(3,)] * (len(tens) - 1) + [()]):
                    args, kwargs, it = [], {}, iter(zip(dts, shapes))
                    for a in args_of:
                        if a in tens:
                            d, shape = next(it)
                            v = _m(shape, d)
                        elif a in nums:
                            v = scalar
                        elif a.has_default_value():
                            continue
                        else:
                            v = 1 if str(a.type) == "int" else 0.5
                        if a.kwarg_only:
                            kwargs[a.name] = v
                        else:
                            args.append(v)
                    answered += _agree(op, tuple(args), kwargs) is not None
    assert answered > 5000


@st.composite
def _operand(draw, shape):
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(["contiguous", "contiguous", "expanded", "transposed", "sliced"]))
    if layout == "sliced" and shape:  # every dim cut out of a larger tensor, some with a step
        steps = [draw(st.integers(1, 2)) for _ in shape]
        starts = [draw(st.integers(0, 1)) for _ in shape]
        big = _m(tuple(a + n * k + 1 for n, k, a in zip(shape, steps, starts)), dtype)
        return big[tuple(slice(a, a + n * k, k) for n, k, a in zip(shape, steps, starts))]
    if layout == "expanded" and shape:
        k = draw(st.integers(0, len(shape) - 1))
        small = tuple(1 if i == k else n for i, n in enumerate(shape))
        return _m(small, dtype).expand(shape)
    if layout == "transposed" and len(shape) >= 2:
        return _m(shape[::-1], dtype).permute(*range(len(shape) - 1, -1, -1))
    return _m(shape, dtype)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_pointwise_op_matches_meta(data):
    func = data.draw(st.sampled_from(POINTWISE), label="op")
    full = data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple), label="shape")
    args, kwargs = [], {}
    for a in func._schema.arguments:
        t = str(a.type)
        if t.startswith("Tensor") or t == "Optional[Tensor]":
            k = data.draw(st.integers(0, len(full)))
            shape = full[k:] if data.draw(st.booleans()) else tuple(1 if data.draw(st.booleans()) else n
                                                                     for n in full[k:])
            v = data.draw(_operand(shape))
        elif t in ("number", "Optional[number]"):
            v = data.draw(st.sampled_from([2, 0.5, True, -1, 3.0]))
        elif a.has_default_value():
            continue
        elif t == "int":
            v = data.draw(st.integers(0, 2))
        elif t in ("float", "Optional[float]"):
            v = 0.5
        else:
            return
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    _agree(func, tuple(args), kwargs)


# -- the other ops with a fast path ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 1, 3)], ids=str)
def test_reductions_and_same_shape_ops_match_meta(dtype, shape):
    x = _m(shape, dtype)
    nd = len(shape)
    dims = [[], [0], [-1], [0, -1]] if nd else [[], [0], [-1]]
    for keepdim in (False, True):
        for d in dims:
            for op in (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
                       aten.logsumexp.default, aten.var.correction, aten.std.correction,
                       aten.linalg_vector_norm.default):
                kw = {"keepdim": keepdim}
                if op in (aten.var.correction, aten.std.correction, aten.linalg_vector_norm.default):
                    kw["dim"] = d
                    _agree(op, (x,), kw)
                else:
                    _agree(op, (x, d), kw)
            for op in (aten.prod.dim_int,):
                if len(d) == 1:
                    _agree(op, (x, d[0], keepdim))
        _agree(aten.sum.dim_IntList, (x, None, keepdim), {"dtype": torch.float64})
        _agree(aten.var.correction, (x,), {"dim": None, "keepdim": keepdim, "correction": 0})
    for op in (aten.sum.default, aten.mean.default, aten.prod.default, aten.max.default, aten.min.default):
        _agree(op, (x,))
    _agree(aten.sum.default, (x,), {"dtype": torch.float64})
    _agree(aten.linalg_vector_norm.default, (x, 1))
    for d in ([0], [-1], [nd] if nd else [1]):
        _agree(aten.sum.dim_IntList, (x, d))  # the last: out of range, both fail
    _agree(aten.sum.dim_IntList, (x, [0, 0]) if nd else (x, [0, -1]))  # repeated: both fail
    for op, args in ((aten.roll.default, (x, [1], [0])), (aten.roll.default, (x, [1, -2], [0, -1])),
                     (aten.roll.default, (x, [2])), (aten.flip.default, (x, [0])), (aten.flip.default, (x, [0, -1])),
                     (aten.tril.default, (x,)), (aten.triu.default, (x, 1)), (aten._softmax.default, (x, -1, False)),
                     (aten._log_softmax.default, (x, 0, False)), (aten.cumsum.default, (x, 0)),
                     (aten.cumprod.default, (x, -1)), (aten.zeros_like.default, (x,)), (aten.ones_like.default, (x,)),
                     (aten.empty_like.default, (x,)), (aten.full_like.default, (x, 3)), (aten.clone.default, (x,)),
                     (aten.repeat.default, (x, [2] * max(nd, 1))), (aten.repeat.default, (x, [1, 2] + [1] * nd)),
                     (aten.repeat.default, (x, [2] * (nd - 1) if nd else [])),
                     (aten.mse_loss.default, (x, x, 1)), (aten.mse_loss.default, (x, x, 0))):
        _agree(op, args)
    for kw in ({"dtype": torch.float64}, {"dtype": torch.int32}, {"memory_format": torch.contiguous_format},
               {"device": "meta"}):
        _agree(aten._to_copy.default, (x,), kw)
        _agree(aten.zeros_like.default, (x,), kw)
    _agree(aten.cumsum.default, (x, 0), {"dtype": torch.float64})


def test_common_ops_take_the_fast_path():
    x = _m((3, 4))
    for op, args in ((aten.roll.default, (x, [1], [0])), (aten.sum.dim_IntList, (x, [0])),
                     (aten.mm.default, (x, _m((4, 2)))), (aten.addmm.default, (_m((2,)), x, _m((4, 2)))),
                     (aten.cat.default, ([x, x], 1)), (aten.stack.default, ([x, x], -1)),
                     (aten._log_softmax.default, (x, 1, False)), (aten.mul.Tensor, (x, 2.0))):
        _agree(op, args, expect_fast=True)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                    (torch.float32, torch.float64), (torch.int64, torch.int64),
                                    (torch.float16, torch.float16)], ids=str)
def test_matrix_products_match_meta(dtypes):
    da, db = dtypes
    a, b = _m((3, 4), da), _m((4, 5), db)
    for args in ((a, b), (a, _m((5, 4), db).t()), (_m((4, 3), da).t(), b), (a, _m((3, 5), db))):
        _agree(aten.mm.default, args)
    for bias in (_m((5,), da), _m((3, 5), da), _m((1, 5), da), _m((3, 1), da), _m((), da), _m((4,), da),
                 _m((2, 3, 5), da)):
        _agree(aten.addmm.default, (bias, a, b))
        _agree(aten.addmm.default, (bias, a, _m((5, 4), db).t()), {"beta": 0.5, "alpha": 2})
    _agree(aten.bmm.default, (_m((2, 3, 4), da), _m((2, 4, 5), db)))
    _agree(aten.bmm.default, (_m((2, 3, 4), da), _m((2, 5, 4), db).transpose(1, 2)))
    _agree(aten.bmm.default, (_m((2, 3, 4), da), _m((3, 4, 5), db)))
    _agree(aten.mv.default, (a, _m((4,), db)))
    _agree(aten.mv.default, (a, _m((8,), db)[::2]))
    _agree(aten.mv.default, (a, _m((3,), db)))
    _agree(aten.dot.default, (_m((4,), da), _m((4,), db)))
    _agree(aten.dot.default, (_m((4,), da), _m((3,), db)))


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float32, torch.float64),
                                    (torch.int64, torch.float16), (torch.bool, torch.int32)], ids=str)
def test_cat_and_stack_match_meta(dtypes):
    da, db = dtypes
    for shapes, dim in ((((2, 3), (4, 3)), 0), (((2, 3), (2, 5)), 1), (((2, 3), (2, 5)), -1),
                        (((2, 3), (4, 5)), 0), (((3,), (4,)), 0), (((), ()), 0), (((2, 3), (2, 3)), 2),
                        (((2, 3), (3,)), 0)):
        _agree(aten.cat.default, ([_m(shapes[0], da), _m(shapes[1], db)], dim))
    for shapes, dim in ((((2, 3), (2, 3)), 0), (((2, 3), (2, 3)), 2), (((2, 3), (2, 3)), -1),
                        (((2, 3), (2, 3)), 3), (((), ()), 0), (((2, 3), (3, 2)), 0)):
        _agree(aten.stack.default, ([_m(shapes[0], da), _m(shapes[1], db)], dim))
    _agree(aten.cat.default, ([_m((2, 3), da)] * 3,))


def test_patterns_unchanged_by_the_fast_path():
    """Detection with and without the fast path gives the same patterns and output metadata."""
    from asd.detection import jacobian_pattern
    from asd.problems import brusselator, brusselator_input

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    cases = [(brusselator(6), brusselator_input(6)), (net, torch.randn(4, 6)),
             (lambda x: torch.cat([x.cumsum(0), x.roll(1, 0).softmax(0)]) * x.sum(), torch.randn(5))]
    for f, x in cases:
        T._META_CACHE.clear()
        fast = jacobian_pattern(f, x)
        saved = T._fast_meta
        T._fast_meta = lambda *a: None
        try:
            T._META_CACHE.clear()
            slow = jacobian_pattern(f, x)
        finally:
            T._fast_meta = saved
            T._META_CACHE.clear()
        assert fast.fingerprint == slow.fingerprint and fast.shape == slow.shape


# -- set operations ---------------------------------------------------------------------------------

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

from asd.detection import sets as S  # noqa: E402


def test_set_matrices_are_built_without_validation_on_this_scipy():
    """The unvalidated constructor is active (so detection is fast) and builds what scipy's
    validated constructor builds; a scipy it does not recognize gets the validated path."""
    assert S._FIELDS is not None, "scipy's csr_matrix changed: set matrices are validated (slow)"
    fast = S._csr(np.array([0, 2, 2, 3]), np.array([0, 4, 1]), (3, 5))
    slow = S._csr_validated(np.array([0, 2, 2, 3], np.int32), np.array([0, 4, 1], np.int32), (3, 5))
    assert type(fast) is type(slow) is sp.csr_matrix
    assert set(vars(fast)) == set(vars(slow))
    for k in vars(slow):
        a, b = getattr(fast, k), getattr(slow, k)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), k
        else:
            assert a == b, k
    fast.check_format(full_check=True)
    assert fast.has_canonical_format and fast.nnz == 3 and fast.dtype == np.bool_
    np.testing.assert_array_equal((fast @ fast.T).toarray(), (slow @ slow.T).toarray())
    np.testing.assert_array_equal((fast + slow).toarray(), slow.toarray())


def test_an_unrecognized_scipy_takes_the_validated_path(monkeypatch):
    monkeypatch.setattr(S, "_FIELDS", None)
    a = S._csr(np.array([0, 1, 3]), np.array([2, 0, 1]), (2, 3))
    b = S.identity(3)[:2]
    np.testing.assert_array_equal(S.union([a, S._canonical(b)], 2, 3).toarray(), a.toarray() | b.toarray())
    from asd.detection import jacobian_pattern
    from asd.problems import brusselator, brusselator_input

    with_validation = jacobian_pattern(brusselator(5), brusselator_input(5))
    monkeypatch.undo()
    assert jacobian_pattern(brusselator(5), brusselator_input(5)).fingerprint == with_validation.fingerprint


@st.composite
def _set_matrices(draw, rows=None, n=None):
    rows = draw(st.integers(0, 12)) if rows is None else rows
    n = draw(st.integers(1, 9)) if n is None else n
    kind = draw(st.sampled_from(["random", "random", "empty", "uniform", "identity"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if kind == "empty":
        D = np.zeros((rows, n), bool)
    elif kind == "uniform":
        D = np.zeros((rows, n), bool)
        w = draw(st.integers(1, n))
        for r in range(rows):
            D[r, rng.choice(n, w, replace=False)] = True
    elif kind == "identity":
        D = np.eye(rows, n, k=draw(st.integers(-2, 2)), dtype=bool)
    else:
        D = rng.random((rows, n)) < draw(st.sampled_from([0.1, 0.3, 0.7]))
    M = sp.csr_matrix(D)
    return S._csr(M.indptr, M.indices, (rows, n)), D


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_take_rows_matches_dense(data):
    M, D = data.draw(_set_matrices())
    rows = D.shape[0]
    kind = data.draw(st.sampled_from(["range", "all", "random", "negatives", "repeat"]))
    if kind == "range" and rows:
        s = data.draw(st.integers(0, rows - 1))
        idx = np.arange(s, data.draw(st.integers(s, rows)))
    elif kind == "all":
        idx = np.arange(rows)
    elif kind == "repeat" and rows:
        idx = np.repeat(np.arange(rows), data.draw(st.integers(1, 3)))
    elif rows:
        idx = np.array(data.draw(st.lists(st.integers(-1 if kind == "negatives" else 0, rows - 1), max_size=15)),
                       dtype=data.draw(st.sampled_from([np.int64, np.int32])))
    else:
        idx = np.full(data.draw(st.integers(0, 3)), -1)
    out = S.take_rows(M, idx)
    want = np.array([D[i] if i >= 0 else np.zeros(D.shape[1], bool) for i in idx]).reshape(len(idx), D.shape[1])
    assert out.shape == want.shape and out.dtype == np.bool_
    out.check_format(full_check=True)
    assert out.has_canonical_format
    np.testing.assert_array_equal(out.toarray(), want)
    assert M.toarray().tolist() == D.tolist()  # the argument is untouched


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_gather_of_one_entry_rows_matches_the_general_gather(data):
    """The one-pass gather of rows holding one entry each (a moved input's sets) gives what the
    two-pass gather gives; a negative index, a row of another length or pointers that start past 0
    are served too, and an index past the last row raises."""
    from asd.detection import _set_kernels as K

    rows, n = data.draw(st.integers(0, 12)), data.draw(st.integers(1, 9))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    lo = data.draw(st.integers(0, 3))  # row pointers of a view: they start past 0
    indices = rng.integers(0, n, lo + rows + 2).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    indptr = (lo + np.arange(rows + 1)).astype(indices.dtype)
    odd = data.draw(st.sampled_from(["unit", "unit", "short", "long"]))
    if rows and odd != "unit":
        r = data.draw(st.integers(0, rows - 1))
        indptr[r + 1:] += -1 if odd == "short" else 1
    D = np.zeros((rows, n), bool)
    for r in range(rows):
        D[r, indices[indptr[r]:indptr[r + 1]]] = True
    low = -1 if data.draw(st.booleans()) else 0
    idx = np.array(data.draw(st.lists(st.integers(low, rows - 1), max_size=20)) if rows else [],
                   dtype=data.draw(st.sampled_from([np.int32, np.int64])))
    cp, cj = K.gather_rows(indptr, indices, idx)
    assert cp.dtype == np.int64 and len(cp) == len(idx) + 1 and cp[0] == 0
    got = np.zeros((len(idx), n), bool)
    for k in range(len(idx)):
        got[k, cj[cp[k]:cp[k + 1]]] = True
    want = np.array([D[i] if i >= 0 else np.zeros(n, bool) for i in idx]).reshape(len(idx), n)
    np.testing.assert_array_equal(got, want)
    assert cp[-1] == sum(indptr[i + 1] - indptr[i] for i in idx if i >= 0)
    with pytest.raises(IndexError):
        K.gather_rows(indptr, indices, np.array([0, rows] if rows else [rows], dtype=np.int64))


@pytest.mark.parametrize("indptr, indices, idx", [
    ([0, 1, 2], [0, 1], [0, 1]),  # well formed: served
    ([1, 2, 3], [0, 1], [1]),  # a one-entry row past the indices
    ([-1, 0, 1], [0, 1], [0]),  # a negative pointer
    ([2**63 - 1, -2**63], [33], [0]),  # a pointer pair whose length wraps in int64
    ([0, 1, 5], [0, 1], [0, 1]),  # the second row runs past the indices
])
def test_gather_of_malformed_one_entry_rows_raises(indptr, indices, idx):
    """The one-pass gather reads nothing outside ``indices`` (the kernels have no bounds checks):
    a row taken whose pointers leave them is left to the general gather, which raises."""
    from asd.detection import _set_kernels as K

    indptr, indices = np.array(indptr, dtype=np.int64), np.array(indices, dtype=np.int64)
    idx = np.array(idx, dtype=np.int64)
    if indptr[0] == 0 and indptr[-1] == 2 and len(indptr) == 3 and indptr[1] == 1:
        cp, cj = K.gather_rows(indptr, indices, idx)
        assert cp.tolist() == [0, 1, 2] and cj.tolist() == [0, 1]
        return
    with pytest.raises(ValueError, match="malformed"):
        K.gather_rows(indptr, indices, idx)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_union_matches_dense(data):
    rows, n = data.draw(st.integers(0, 10)), data.draw(st.integers(1, 9))
    mats = [data.draw(_set_matrices(rows, n)) for _ in range(data.draw(st.integers(0, 4)))]
    parts = [m for m, _ in mats]
    if parts and data.draw(st.booleans()):
        parts.append(parts[0])  # the same object twice
    if parts and data.draw(st.booleans()):  # the same structure in other arrays (int64)
        p = parts[-1]
        parts.append(sp.csr_matrix((p.data.copy(), p.indices.astype(np.int64), p.indptr.astype(np.int64)),
                                   shape=p.shape))
    if data.draw(st.booleans()):
        parts.insert(0, None)
    if rows and data.draw(st.booleans()):  # a user rule's matrix: unsorted, not bool
        D = np.random.default_rng(data.draw(st.integers(0, 99))).random((rows, n)) < 0.4
        U = sp.csr_matrix(D.astype(np.float64))
        for r in range(rows):
            a, b = U.indptr[r], U.indptr[r + 1]
            U.indices[a:b] = U.indices[a:b][::-1].copy()
        U.has_sorted_indices = False
        parts.append(U)
        mats.append((None, D))
    out = S.union(parts, rows, n)
    want = np.zeros((rows, n), bool)
    for _, D in mats:
        want |= D
    assert out.shape == (rows, n) and out.dtype == np.bool_ and out.has_sorted_indices
    out.check_format(full_check=True)
    np.testing.assert_array_equal(out.toarray(), want)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_full_rows_and_gathered_unions_match_dense(data):
    """The union of all rows (a mask over the inputs where that is cheaper than sorting, else
    np.unique) and gather_union into one row (a full reduction, no product) equal the dense union."""
    M, D = data.draw(_set_matrices())
    rows, n = D.shape
    if data.draw(st.booleans()):  # many more inputs than entries: the sorting branch
        wide = sp.csr_matrix(np.hstack([D, np.zeros((rows, 5000), bool)]))
        M, D = S._csr(wide.indptr, wide.indices, wide.shape), wide.toarray()
    out = S.full_row(M)
    out.check_format(full_check=True)
    assert out.has_canonical_format and out.shape == (1, D.shape[1])
    np.testing.assert_array_equal(out.toarray()[0], D.any(axis=0))
    if rows:
        cols = np.array(data.draw(st.lists(st.integers(-1, rows - 1), max_size=12)), dtype=np.int64)
        got = S.gather_union(M, np.zeros(len(cols), dtype=np.int64), cols, 1)
        want = D[cols[cols >= 0]].any(axis=0) if (cols >= 0).any() else np.zeros(D.shape[1], bool)
        got.check_format(full_check=True)
        np.testing.assert_array_equal(got.toarray().reshape(-1), want)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_unions_of_different_index_dtypes_match_dense(data):
    """The merge kernel casts both operands to one index dtype: int32 and int64 arrays of different
    structures (a user rule's scipy matrix) give the dense union."""
    rows, n = data.draw(st.integers(0, 10)), data.draw(st.integers(1, 9))
    (A, Da), (B, Db) = data.draw(_set_matrices(rows, n)), data.draw(_set_matrices(rows, n))
    B64 = sp.csr_matrix((B.data.copy(), B.indices.astype(np.int64), B.indptr.astype(np.int64)), shape=B.shape)
    B64.has_sorted_indices = True
    for a, b in ((A, B64), (B64, A)):
        out = S.union([a, b], rows, n)
        out.check_format(full_check=True)
        assert out.has_canonical_format and out.dtype == np.bool_
        np.testing.assert_array_equal(out.toarray(), Da | Db)


def test_take_rows_refuses_a_row_past_the_last():
    """The gather kernel has no bounds checks of its own: a row index past the last raises
    IndexError (as numpy's indexing did) instead of reading past the arrays."""
    M = S.identity(4)
    with pytest.raises(IndexError):
        S.take_rows(M, np.array([3, 1, 4]))
    with pytest.raises(IndexError):
        S.take_rows(M, np.array([2, 0, 7, 1]))
    np.testing.assert_array_equal(S.take_rows(M, np.array([3, -1, 0])).toarray(),
                                  np.eye(4, dtype=bool)[[3, 0, 0]] * np.array([[1], [0], [1]], bool))


def _malformed(indptr, indices, shape):
    """A scipy CSR matrix carrying exactly these arrays (scipy's own checks bypassed, as a user
    rule's matrix built by hand can be)."""
    M = sp.csr_matrix(shape, dtype=bool)
    M.indptr, M.indices = np.asarray(indptr, dtype=np.int32), np.asarray(indices, dtype=np.int32)
    M.data = np.ones(len(M.indices), dtype=bool)
    M.has_sorted_indices = True
    return M


def test_set_kernels_refuse_malformed_matrices():
    """The Numba kernels have no bounds checks of their own: row pointers that decrease, are
    negative or point past the indices raise instead of reading or writing past an array (a user
    rule's matrix); so do unions of different shapes."""
    past = _malformed([0, 3_000_000, 3], [0, 1, 2], (2, 4))
    decreasing = _malformed([0, 4, 0, 4], [0, 1, 2, 3], (3, 4))
    negative = _malformed([-2, 1, 2], [0, 1], (2, 4))
    for M, idx in ((past, [0, 0]), (decreasing, [1, 0, 0, 2]), (negative, [1, 0])):
        with pytest.raises(ValueError, match="malformed"):
            S.take_rows(M, np.array(idx))
        other = S._csr(np.arange(M.shape[0] + 1), np.zeros(M.shape[0], dtype=np.int64), M.shape)
        with pytest.raises(ValueError, match="malformed"):
            S.union([other, M], *M.shape)
    with pytest.raises(ValueError, match="shapes"):
        S.union([S.identity(4), S.identity(4)[:2].tocsr()], 4, 4)


def test_union_keeps_large_column_indices_of_mixed_index_dtypes():
    """An int64 column index past int32's range, merged with a matrix of int32 arrays, survives."""
    n = 2**33
    big = sp.csr_matrix((np.ones(1, bool), np.array([n - 5], np.int64), np.array([0, 1, 1], np.int64)), shape=(2, n))
    big.has_sorted_indices = True
    small = _malformed([0, 0, 1], [3], (2, n))
    for a, b in ((small, big), (big, small)):
        out = S.union([a, b], 2, n)
        assert out.indices.tolist() == [n - 5, 3] and out.indptr.tolist() == [0, 1, 2]


def test_take_rows_refuses_unsigned_and_empty_out_of_range_rows():
    """An unsigned index past int64's range is not wrapped into "no row", and an index past the
    last row raises for a matrix without entries too."""
    with pytest.raises(IndexError):
        S.take_rows(S.identity(4), np.array([2, 0, 2**64 - 1], dtype=np.uint64))
    with pytest.raises(IndexError):
        S.take_rows(S.empty(4, 3), np.array([9, 1]))
    assert S.take_rows(S.empty(4, 3), np.array([3, -1])).shape == (2, 3)


def test_set_operations_read_only_the_stored_entries():
    """A scipy matrix (a user rule's) may keep unused room past ``indptr[-1]`` in ``indices``:
    stacking must not shift the next matrix's rows by it, nor taking rows of equal length fail."""
    A = sp.csr_matrix((np.ones(2, bool), np.array([0, 2]), np.array([0, 1, 2])), shape=(2, 3))
    A.indices, A.data = np.array([0, 2, 1, 1], dtype=A.indices.dtype), np.ones(4, bool)  # room past the end
    assert A.nnz == 2
    dense = A.toarray()
    out = S.vstack([A, S.identity(3)])
    out.check_format(full_check=True)
    np.testing.assert_array_equal(out.toarray(), np.vstack([dense, np.eye(3, dtype=bool)]))
    np.testing.assert_array_equal(S.take_rows(A, np.array([1, 0, 1])).toarray(), dense[[1, 0, 1]])
    np.testing.assert_array_equal(S.gather_union(A, np.zeros(2), np.array([1, 0]), 1).toarray()[0],
                                  dense.any(axis=0))


def test_a_full_reduction_reads_each_row_once(monkeypatch):
    """gather_union into one row with every row read many times (F.bilinear's rule) takes each
    row once, not once per read (memory and time growing with the repeats)."""
    M = S.identity(300)
    taken = []
    real = S.take_rows
    monkeypatch.setattr(S, "take_rows", lambda m, idx: taken.append(len(idx)) or real(m, idx))
    cols = np.tile(np.arange(300), 200)
    out = S.gather_union(M, np.zeros(len(cols), dtype=np.int64), cols, 1)
    np.testing.assert_array_equal(out.indices, np.arange(300))
    assert taken == [300]


def test_a_view_reads_its_rows_again_after_a_write():
    """Views cache their rows of the storage's sets; a write through any alias, or an in-place
    view op changing the view's element map, makes them read again."""
    from asd.detection import jacobian_sparsity

    def f(x):
        y = x.clone()
        v = y[1:3]
        a = v * 2  # v's rows cached
        y[1] = x[0] * x[3]  # replaces the storage's sets
        b = v * 3  # v's rows read again
        w = y[:4].view(2, 2)
        c = w * 1  # w's rows cached
        w.t_()  # an in-place view changes w's element map
        return torch.cat([a, b, c.reshape(-1), w.reshape(-1)])

    x = torch.randn(6, dtype=torch.float64)
    P = jacobian_sparsity(f, x).toarray().astype(int)
    J = torch.autograd.functional.jacobian(f, x).numpy() != 0
    assert (P >= J).all()
    e = np.eye(6, dtype=int)
    np.testing.assert_array_equal(P[:2], e[[1, 2]])
    np.testing.assert_array_equal(P[2:4], [e[0] + e[3], e[2]])
    np.testing.assert_array_equal(P[4:8], [e[0], e[0] + e[3], e[2], e[3]])
    np.testing.assert_array_equal(P[8:], [e[0], e[2], e[0] + e[3], e[3]])
