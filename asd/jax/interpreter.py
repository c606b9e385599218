"""The jaxpr interpreter: index sets (and, for Hessians, the shared second-order pattern) pushed
through the equations of ``jax.make_jaxpr(f)(x)``.

Every variable carries a :class:`Val`: its shape and dtype, its index sets (a boolean CSR matrix
of :mod:`asd.detection.sets`, one row per element, or ``None`` when it depends on no input), and
its concrete value where that is known: always for constants and values computed from constants
only, and for everything under ``local=True``. Rules use the values where they are known (gather
indices, a ``select_n`` predicate, the side ``max`` picks) and stay sound where they are not.
"""

from __future__ import annotations

import warnings
from functools import singledispatch

import jax
import numpy as np
import scipy.sparse as sp
from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, Literal

from ..detection import sets as S
from ..detection.second_order import SecondOrder
from ..errors import TracingError, UnsupportedOpError, UnsupportedOpWarning
from .table import Bilinear, Custom, Linear, LinearOnReal, Nonlinear, Quotient, Zero, lookup


def differentiable(dtype) -> bool:
    """Whether elements of ``dtype`` carry derivatives (real or complex floating point)."""
    return jax.dtypes.issubdtype(dtype, np.inexact)


class Val:
    """What the interpreter knows about one jaxpr variable."""

    __slots__ = ("shape", "dtype", "sets", "value")

    def __init__(self, shape, dtype, sets: sp.csr_matrix | None = None, value=None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.sets = sets
        self.value = value

    @classmethod
    def of(cls, value, sets=None) -> "Val":
        dtype = getattr(value, "dtype", None)
        return cls(np.shape(value), dtype if dtype is not None else jax.dtypes.result_type(value), sets, value)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def known(self) -> bool:
        return self.value is not None


class Ctx:
    """What a rule sees: the equation, its inputs, and the interpreter."""

    __slots__ = ("eqn", "ins", "interp", "out_values")

    def __init__(self, eqn, ins: list[Val], interp: "Interpreter"):
        self.eqn = eqn
        self.ins = ins
        self.interp = interp
        self.out_values: list | None = None

    @property
    def params(self) -> dict:
        return self.eqn.params

    @property
    def n(self) -> int:
        return self.interp.n

    @property
    def local(self) -> bool:
        return self.interp.local

    @property
    def hessian(self) -> SecondOrder | None:
        return self.interp.hessian

    @property
    def out_shapes(self) -> list[tuple]:
        return [tuple(v.aval.shape) for v in self.eqn.outvars]

    def out_size(self, k: int = 0) -> int:
        return int(np.prod(self.out_shapes[k], dtype=np.int64))

    def sets(self, i: int) -> sp.csr_matrix | None:
        """Index sets of input ``i``, or ``None`` when it depends on no input."""
        v = self.ins[i]
        if v.sets is None or not differentiable(v.dtype) or v.sets.nnz == 0:
            return None
        return v.sets

    def value(self, i: int) -> np.ndarray | None:
        """The concrete value of input ``i`` (numpy), or ``None`` when unknown."""
        v = self.ins[i].value
        return None if v is None else np.asarray(v)

    def empty(self, rows: int) -> sp.csr_matrix:
        return S.empty(rows, self.n)

    def call(self, jaxpr, ins: list[Val]) -> list[Val]:
        """Interpret an inner (closed) jaxpr on ``ins``."""
        return self.interp.run_closed(jaxpr, ins)


class Interpreter:
    """Runs jaxprs on :class:`Val` environments.

    Parameters
    ----------
    n
        Number of input elements (columns of every set matrix).
    local
        Whether the inputs carry values (rules then prune by them).
    strict
        Raise :class:`asd.errors.UnsupportedOpError` on a primitive without a rule.
    hessian
        Also accumulate the second-order pattern (:attr:`hessian`).
    """

    def __init__(self, n: int, *, local: bool, strict: bool = False, hessian: bool = False):
        self.n = n
        self.local = local
        self.strict = strict
        self.hessian = SecondOrder(n) if hessian else None
        #: how many custom_jvp / custom_vjp functions' rules are being interpreted (asd.jax.rules.control)
        self.in_rule = 0
        #: the trace met a custom_vjp function (which JAX differentiates in reverse mode only)
        self.custom_vjp = False

    def run_closed(self, jaxpr, ins: list[Val]) -> list[Val]:
        if isinstance(jaxpr, ClosedJaxpr):
            consts = [Val.of(c) for c in jaxpr.consts]
            return self.run(jaxpr.jaxpr, consts, ins)
        if isinstance(jaxpr, Jaxpr):
            return self.run(jaxpr, [], ins)
        raise TypeError(f"expected a jaxpr, got {type(jaxpr).__name__}")

    def run(self, jaxpr: Jaxpr, consts: list[Val], args: list[Val]) -> list[Val]:
        env: dict = {}
        for var, val in zip(jaxpr.constvars, consts):
            env[var] = val
        if len(args) != len(jaxpr.invars):
            raise TracingError(f"internal: {len(args)} arguments for a jaxpr of {len(jaxpr.invars)} inputs")
        for var, val in zip(jaxpr.invars, args):
            env[var] = val

        def read(atom) -> Val:
            if isinstance(atom, Literal):
                return Val.of(np.asarray(atom.val, dtype=atom.aval.dtype))
            return env[atom]

        for eqn in jaxpr.eqns:
            outs = self.equation(eqn, [read(a) for a in eqn.invars])
            for var, val in zip(eqn.outvars, outs):
                if not isinstance(var, DropVar):
                    env[var] = val
        return [read(a) for a in jaxpr.outvars]

    def equation(self, eqn, ins: list[Val]) -> list[Val]:
        ctx = Ctx(eqn, ins, self)
        rule = lookup(eqn.primitive)
        if rule is None:
            if self.strict:
                raise UnsupportedOpError(f"no sparsity rule for the JAX primitive {eqn.primitive.name!r}; "
                                         "pass strict=False to trace it conservatively")
            warnings.warn(f"no sparsity rule for the JAX primitive {eqn.primitive.name!r}: every output "
                          "element is assumed to depend on every input element of the operation "
                          "(sound but dense)", UnsupportedOpWarning, stacklevel=4)
            sets = conservative(ctx)
            second = Nonlinear()
        else:
            sets = rule.fn(ctx)
            second = rule.second_order
        outs = []
        values = ctx.out_values
        if values is None and all(v.known for v in ins):
            values = _evaluate(eqn, ins)
        if len(sets) != len(eqn.outvars):
            raise TracingError(f"internal: the rule of {eqn.primitive.name!r} returned {len(sets)} results "
                               f"for {len(eqn.outvars)} outputs")
        for k, (var, s) in enumerate(zip(eqn.outvars, sets)):
            aval = var.aval
            v = Val(getattr(aval, "shape", ()), getattr(aval, "dtype", None), None,
                    None if values is None else values[k])
            if s is not None and v.dtype is not None and differentiable(v.dtype) and s.nnz:
                if s.shape != (v.size, self.n):
                    raise TracingError(f"internal: the rule of {eqn.primitive.name!r} gave sets of shape "
                                       f"{s.shape} for an output of {v.size} elements")
                v.sets = s
            outs.append(v)
        if self.hessian is not None:
            second_order(second, ctx, outs)
        return outs


#: primitives whose result is no function of their operands, so never evaluated at detection: XLA's
#: stateful generator, and host callbacks (a callback may return other values at every call, whatever
#: purity it declares); values known from them would cut dependencies (``where(mask, x, y)``)
_UNREPEATABLE = frozenset({"rng_uniform", "pure_callback", "io_callback", "debug_callback"})


def _evaluate(eqn, ins: list[Val]) -> list:
    if eqn.primitive.name in _UNREPEATABLE or eqn.effects:
        return None
    try:
        res = eqn.primitive.bind(*[v.value for v in ins], **eqn.params)
    except Exception:  # a primitive that cannot run eagerly here: values stay unknown (sound)
        return None
    return list(res) if eqn.primitive.multiple_results else [res]


def conservative(ctx: Ctx) -> list:
    """Every output element depends on every input element of the equation."""
    parts = [ctx.sets(i) for i in range(len(ctx.ins))]
    parts = [S.full_row(p) for p in parts if p is not None]
    if not parts:
        return [None] * len(ctx.eqn.outvars)
    row = S.union(parts, 1, ctx.n)
    return [S.take_rows(row, np.zeros(ctx.out_size(k), dtype=np.int64)) for k in range(len(ctx.eqn.outvars))]


def broadcast_sets(s: sp.csr_matrix | None, shape: tuple, out_shape: tuple) -> sp.csr_matrix | None:
    """Sets of an operand of ``shape`` broadcast (numpy rules) to ``out_shape``."""
    if s is None or tuple(shape) == tuple(out_shape):
        return s
    ids = np.broadcast_to(np.arange(s.shape[0], dtype=np.int64).reshape(shape), out_shape)
    return S.take_rows(s, ids.ravel())


@singledispatch
def second_order(kind, ctx: Ctx, outs: list[Val]) -> None:
    raise TypeError(f"unknown second-order class {type(kind).__name__}")


@second_order.register(Zero)
@second_order.register(Linear)
@second_order.register(Custom)
def _(kind, ctx, outs):
    return None


@second_order.register(Nonlinear)
def _(kind, ctx, outs):
    for v in outs:
        ctx.hessian.add_square(v.sets)


@second_order.register(LinearOnReal)
def _(kind, ctx, outs):
    if any(v.dtype is not None and np.issubdtype(np.dtype(v.dtype), np.complexfloating) for v in ctx.ins):
        for v in outs:
            ctx.hessian.add_square(v.sets)


def _operands(ctx: Ctx, outs: list[Val]):
    shape = outs[0].shape
    a, b = (broadcast_sets(ctx.sets(i), ctx.ins[i].shape, shape) for i in (0, 1))
    x, y = ctx.eqn.invars[0], ctx.eqn.invars[1]
    same = x is y and not isinstance(x, Literal)
    return a, b, same


@second_order.register(Bilinear)
def _(kind, ctx, outs):
    a, b, same = _operands(ctx, outs)
    if same:
        ctx.hessian.add_square(a)
    else:
        ctx.hessian.add_cross(a, b)


@second_order.register(Quotient)
def _(kind, ctx, outs):
    a, b, same = _operands(ctx, outs)
    if same:  # x / x
        return
    ctx.hessian.add_cross(a, b)
    ctx.hessian.add_square(b)
