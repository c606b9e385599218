"""What propagation rules see: traced tensors, the call record, and the active tracer.

A :class:`TracedTensor` wraps a *primal* (a meta tensor under global tracing, a real tensor under
local tracing or for constants created inside the traced function) and refers to a
:class:`Storage` that holds one index-set row per element of the storage's base tensor. Views share
the storage of their base and keep an element map into it, so in-place writes through any view
(``r[1:-1] = ...``) update the sets every other view sees, as they update the values.

A rule receives a :class:`Call` (the op, its arguments, their primals, the output primals) and
returns the outputs' index sets. This module knows nothing of the rule table or of the
``__torch_dispatch__`` front end (:mod:`asd.detection.torch_tracer`); the front end registers the
tracer that is active in the current thread with :func:`push_tracer`.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp
import torch

from ..errors import TracingError, UnsupportedOpWarning
from . import sets as S

__all__ = ["Call", "FLOATING", "Storage", "TracedTensor", "TracerLike", "active_tracer", "bind",
           "is_differentiable_dtype", "pop_tracer", "push_tracer"]


class TracerLike(Protocol):
    """What a :class:`Call` and a :class:`TracedTensor` need from the tracer running them."""

    n: int
    local: bool
    drops_vanishing: bool

    def dispatch(self, func, args, kwargs): ...

    def unsupported(self, func) -> None: ...

    def note_autograd(self) -> None: ...

    def detached(self, t: "TracedTensor") -> bool: ...


_ACTIVE = threading.local()


def active_tracer() -> TracerLike | None:
    """The innermost tracer active in this thread, or ``None``."""
    stack = getattr(_ACTIVE, "stack", None)
    return stack[-1] if stack else None


def push_tracer(tracer: TracerLike) -> None:
    if not hasattr(_ACTIVE, "stack"):
        _ACTIVE.stack = []
    _ACTIVE.stack.append(tracer)


def pop_tracer(tracer: TracerLike) -> None:
    stack = _ACTIVE.stack
    if not stack or stack[-1] is not tracer:
        raise AssertionError("internal error: tracers were exited out of order")
    stack.pop()


FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
            torch.complex32, torch.complex64, torch.complex128)


def is_differentiable_dtype(dtype: torch.dtype) -> bool:
    return dtype in FLOATING


def storage_positions(shape, stride, offset) -> np.ndarray:
    """The storage position of every element (row-major) of a tensor of ``shape`` and ``stride``
    whose first element is at ``offset``: where ``as_strided`` and kin read and write."""
    pos = np.full((), int(offset or 0), dtype=np.int64)
    nd = len(shape)
    for d, (size, step) in enumerate(zip(shape, stride)):
        pos = pos + (np.arange(int(size), dtype=np.int64) * int(step)).reshape([-1 if i == d else 1 for i in range(nd)])
    return np.broadcast_to(pos, tuple(int(v) for v in shape)).reshape(-1)


def window_positions(bound: dict, x: torch.Tensor) -> np.ndarray:
    """The storage positions an ``as_strided``-like call on ``x`` (bound arguments ``size``,
    ``stride``, ``storage_offset``) addresses; a left-out ``storage_offset`` is ``x``'s own."""
    offset = bound.get("storage_offset")
    return storage_positions(bound["size"], bound["stride"], x.storage_offset() if offset is None else offset)


class Storage:
    """Index sets (and the primal base tensor) shared by a base tensor and all its views."""

    __slots__ = ("primal", "_sets", "_pending", "epoch", "read_only", "geometry", "alias_copies", "complex_base", "copy_of", "stale")

    def __init__(self, primal: torch.Tensor, sets: "sp.csr_matrix | S.PendingUnion"):
        self.primal = primal
        if isinstance(sets, S.PendingUnion):
            self._sets, self._pending = None, sets
        else:
            self._sets, self._pending = sets, None
        self.epoch = 0
        self.read_only: str | None = None  # why writes into it cannot be traced
        #: the tensors ``view_as_complex`` or ``conj()`` made of it (copies here, aliases in PyTorch):
        #: while one lives, a write into this storage cannot be followed into it
        self.alias_copies: "weakref.WeakSet | None" = None
        #: for the storage ``view_as_complex`` made: the real tensor it views, which a write into
        #: this storage also writes
        self.complex_base: "TracedTensor | None" = None
        #: for the storage of a ``conj()`` (negative view) copy: the storage it copies, which a write
        #: into this one leaves behind
        self.copy_of: "Storage | None" = None
        #: why the sets (and values) no longer follow PyTorch's: a write into a tensor this storage
        #: copies where PyTorch aliases, or through such a copy into this one. Read, it raises.
        self.stale: str | None = None
        # the layout whose elements (row-major) the rows of ``sets`` are, and its element size: fixed
        # here, as an in-place view op (t_, as_strided_) on the owning tensor changes its primal's
        self.geometry = (tuple(primal.shape), tuple(primal.stride()), primal.storage_offset(), primal.element_size())

    @property
    def sets(self) -> sp.csr_matrix:
        """The index sets of the storage's elements (a pending union merged at the first read)."""
        if self._pending is not None:
            self._sets, self._pending = self._pending.merged(), None
        return self._sets

    @sets.setter
    def sets(self, value: sp.csr_matrix) -> None:
        self._sets, self._pending = value, None

    @property
    def rows(self) -> int:
        """The number of rows of :attr:`sets` (without merging a pending union)."""
        return (self._pending if self._pending is not None else self._sets).shape[0]

    def rows_at(self, positions: np.ndarray) -> np.ndarray | None:
        """The row of ``sets`` of the element at each storage position (counted in this storage's
        elements), or ``None`` where a position holds none of them."""
        shape, stride, offset, _ = self.geometry
        own = storage_positions(shape, stride, offset)
        if not positions.size:
            return positions.astype(np.int64)
        if not own.size or int(positions.min()) < 0 or int(positions.max()) > int(own.max()):
            return None
        inverse = np.full(int(own.max()) + 1, -1, dtype=np.int64)
        inverse[own] = np.arange(own.size, dtype=np.int64)
        rows = inverse[positions]
        return None if (rows < 0).any() else rows

    def make_meta(self) -> None:
        """Called before a write under global tracing: the values become unknown."""
        if self.read_only is not None:
            raise TracingError(self.read_only)
        if not self.primal.is_meta:
            self.primal = self.primal.to("meta")
            self.epoch += 1


# Reverse-mode calls inside the traced function: their backward ops are traced like any other, but
# forward-mode evaluation (where ``x.requires_grad`` is False) cannot follow them.
_AUTOGRAD_CALLS = frozenset({torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward})


def resolved(primal: torch.Tensor, lazy: tuple | None) -> torch.Tensor:
    """``primal`` with the lazy conjugation / negation ``lazy`` (see :attr:`TracedTensor._lazy`)
    applied and resolved."""
    if lazy is None:
        return primal
    conj, neg = lazy
    if conj:
        primal = primal.conj()
    if neg:
        primal = primal._neg_view()
    return primal.resolve_conj().resolve_neg()


class TracedTensor(torch.Tensor):
    """A tensor that carries the index sets of its elements through a traced function."""

    _storage: Storage
    _idx: np.ndarray | None
    _geom: tuple
    _epoch: int
    _primal: torch.Tensor
    #: an alias made by ``detach()`` (or a view of one): writes through it are untracked by autograd
    _detached: bool = False
    #: a real view of one component of complex elements (``view_as_real``, ``.real``, ``.imag``, or a
    #: view of one): a write into it replaces that component only, the storage row keeps the rest
    _component: bool = False
    #: ``(storage sets, this view's sets)``: the rows of a view, taken again only once the storage's
    #: set matrix has been replaced (a write)
    _sets_cache: tuple | None = None
    #: ``(conj, neg)``: the view's values are its storage's conjugated / negated (a lazy ``conj()`` or
    #: ``_neg_view`` in PyTorch): the primal holds them resolved, which every op can read
    _lazy: tuple | None = None

    @staticmethod
    def __new__(cls, storage: Storage, primal: torch.Tensor, idx: np.ndarray | None, device: torch.device,
                requires_grad: bool = False):
        r = torch.Tensor._make_wrapper_subclass(
            cls, primal.shape, strides=primal.stride(), storage_offset=primal.storage_offset(),
            dtype=primal.dtype, layout=primal.layout, device=device, requires_grad=requires_grad,
        )
        r._storage = storage
        r._idx = idx
        r._primal = primal
        r._geom = (tuple(primal.shape), tuple(primal.stride()), primal.storage_offset())
        r._epoch = storage.epoch
        return r

    @property
    def primal(self) -> torch.Tensor:
        if self._epoch != self._storage.epoch:
            size, stride, offset = self._geom
            self._primal = resolved(self._storage.primal.as_strided(size, stride, offset), self._lazy)
            self._epoch = self._storage.epoch
        return self._primal

    @property
    def sets(self) -> sp.csr_matrix:
        """Index sets of this tensor's elements (row-major), shape ``(numel, n)``. Reading those of a
        stale storage (:attr:`Storage.stale`) raises; a view of it is made without reading them."""
        if self._storage.stale is not None:
            raise TracingError(self._storage.stale)
        base = self._storage.sets
        if self._idx is None:
            return base
        cache = self._sets_cache
        if cache is not None and cache[0] is base:
            return cache[1]
        sets = S.take_rows(base, self._idx)
        self._sets_cache = (base, sets)
        return sets

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        kind = "meta" if self.primal.is_meta else "real"
        return f"TracedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, {kind})"

    def _values(self, what: str) -> torch.Tensor:
        p = self.primal
        if p.is_meta:
            raise TracingError(
                f"{what} on a traced tensor under global tracing: its values are unknown (conversion "
                "to Python numbers, lists or numpy arrays leaves the traced computation). Pass "
                "local=True to trace at a point, or keep the computation in torch ops."
            )
        return p

    def tolist(self):
        return self._values(".tolist()").tolist()

    def numpy(self, *, force: bool = False):
        raise TracingError(
            ".numpy() / np.asarray on a traced tensor: numpy cannot see index sets, so the dependence "
            "would be lost. Keep the computation in torch ops (or detach() to use values as constants)."
        )

    def __array__(self, dtype=None, copy=None):
        return self.numpy()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _NARROWS:
            out = narrow_at_unknown_start(*args, **(kwargs or {}))
            if out is not None:
                return out
        if func in _AUTOGRAD_CALLS:
            tracer = active_tracer()
            if tracer is not None:
                tracer.note_autograd()
        with torch._C.DisableTorchFunctionSubclass():  # results are already traced (or plain constants)
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        tracer = active_tracer()
        if tracer is None:
            raise TracingError(
                f"a traced tensor was used outside of sparsity tracing (in {func}); do not keep tensors from "
                "a traced call: a tensor f stored while its pattern was detected (a cache in a closure, a global "
                "or a module attribute filled at f's first call) still holds one: clear it, or fill it outside f"
            )
        return tracer.dispatch(func, args, kwargs or {})


_NARROWS = frozenset({torch.narrow, torch.Tensor.narrow})


def narrow_at_unknown_start(input, dim, start, length) -> TracedTensor | None:
    """``narrow`` with a tensor ``start`` computed from the input, under global tracing (PyTorch
    reads ``start.item()``, unknown there): output position ``k`` may read any element ``s + k``
    along ``dim``, so its sets are the union over every start (computed as a sum of the windows).
    The result is no view: a write into it raises :class:`TracingError`. Returns ``None`` where
    ``start`` is known (plain ``narrow`` applies)."""
    if not (isinstance(start, TracedTensor) and start.primal.is_meta and isinstance(input, TracedTensor)
            and isinstance(length, int)):
        return None
    warnings.warn(
        "asd: narrow with a start computed from the input, unknown under global tracing; every start "
        "is assumed (a sound but denser pattern). Pass local=True for the pattern at a point.",
        UnsupportedOpWarning, stacklevel=3)
    d = dim % max(input.dim(), 1)
    with torch._C.DisableTorchFunctionSubclass():
        out = input.unfold(d, length, 1).sum(d).movedim(-1, d)
    if isinstance(out, TracedTensor):
        out._storage.read_only = ("a write into the result of narrow with a start computed from the input "
                                  "cannot be traced under global tracing; pass local=True")
    return out


@dataclass
class Call:
    """What a rule sees: the op, its original arguments, their primals, and the output primals."""

    func: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    pargs: tuple
    pkwargs: dict
    outs: list
    tracer: TracerLike
    _bound: dict | None = field(default=None, repr=False)
    #: (not a field) whether the rule may return a :class:`asd.detection.sets.PendingUnion` for an
    #: output: set by the tracer on the call it hands to the op's own rule, where the result goes
    #: straight into the output's storage
    lazy = False

    @property
    def n(self) -> int:
        return self.tracer.n

    @property
    def local(self) -> bool:
        return self.tracer.local

    def bound(self) -> dict[str, Any]:
        """Arguments by schema name (original objects), defaults filled in."""
        if self._bound is None:
            self._bound = bind(self.func, self.args, self.kwargs)
        return self._bound

    def sets(self, t) -> sp.csr_matrix | None:
        """Index sets of argument ``t``, or ``None`` when it depends on no input."""
        return sets_of(self.tracer, t)

    def constant(self, t) -> bool:
        """Whether ``t`` depends on no input here, as reverse mode sees it: no index sets (a plain
        tensor, a number, a detached value). A rule may then use ``t``'s values at the point as
        those of a constant (a zero factor cuts the other operand's sets). A value whose sets a
        rule is made not to see (:class:`asd.detection.hessian.MaskedCall`) is not constant."""
        return Call.sets(self, t) is None

    def set_parts(self, t) -> tuple:
        """Non-empty set matrices whose row-wise union is :meth:`sets` of ``t`` (none where that is
        ``None``), without merging a pending union (:class:`asd.detection.sets.PendingUnion`)."""
        if not isinstance(t, TracedTensor) or not is_differentiable_dtype(t.dtype) or self.tracer.detached(t):
            return ()
        pending = t._storage._pending
        if t._idx is None and pending is not None and not pending.taken:
            # the first consumer extends the union; any later one reads it merged (in the
            # storage, once), instead of merging the same parts again in every consumer
            pending.taken = True
            return pending.parts
        s = t.sets
        return (s,) if s.nnz else ()

    def unsupported(self) -> None:
        """Report that this op is traced by the conservative rule (warns, or raises under ``strict``)."""
        self.tracer.unsupported(self.func)

    def record_interaction(self, out_sets: list) -> None:
        """Record that every pair of dependencies of each output element may interact (a nonzero
        second derivative), for a rule whose op's second-order class depends on its arguments (the
        table's class is then the one for real arguments: ``abs`` is linear on real tensors,
        nonlinear on complex ones). Under a first-order tracer this does nothing."""
        add_square = getattr(self.tracer, "add_square", None)
        if add_square is None:
            return
        for o, s in zip(self.outs, out_sets):
            if s is not None and is_differentiable_dtype(o.dtype):
                add_square(s)

    def record_cross(self, Ga: sp.csr_matrix | None, Gb: sp.csr_matrix | None) -> None:
        """Record that input ``p`` may interact with input ``q`` wherever some row of ``Ga`` holds
        ``p`` and the same row of ``Gb`` holds ``q`` (or the other way round), for a rule that
        knows its op's second-order structure finer than the table's classes (``det``). Under a
        first-order tracer this does nothing."""
        add_cross = getattr(self.tracer, "add_cross", None)
        if add_cross is not None:
            add_cross(Ga, Gb)


def sets_of(tracer: TracerLike, t) -> sp.csr_matrix | None:
    """Index sets of ``t`` as an argument of an op traced by ``tracer``, or ``None`` when it
    depends on no input (:meth:`Call.sets`)."""
    if isinstance(t, TracedTensor) and t.dtype in FLOATING and not tracer.detached(t):
        s = t.sets
        return s if s.indptr[-1] else None
    return None


_NO_DEFAULT = object()
_SCHEMAS: dict = {}


def _schema_args(func) -> tuple:
    """``(name, kwarg_only, default)`` of each schema argument of ``func`` (``_NO_DEFAULT`` where it
    has none), read once per op: the schema builds its argument objects anew at every access."""
    entry = _SCHEMAS.get(id(func))
    if entry is None or entry[0] is not func:
        args = tuple((a.name, a.kwarg_only, a.default_value if a.has_default_value() else _NO_DEFAULT)
                     for a in func._schema.arguments)
        entry = _SCHEMAS[id(func)] = (func, args)  # func kept alive: its id is never reused
    return entry[1]


def bind(func, args, kwargs) -> dict[str, Any]:
    """Match positional and keyword arguments to the op's schema names."""
    out: dict[str, Any] = {}
    nargs = len(args)
    for i, (name, kwarg_only, default) in enumerate(_schema_args(func)):
        if i < nargs and not kwarg_only:
            out[name] = args[i]
        elif name in kwargs:
            out[name] = kwargs[name]
        elif default is not _NO_DEFAULT:
            # a fresh list per call, as the schema gives it: a rule may modify what it is handed
            out[name] = list(default) if isinstance(default, list) else default
        else:
            out[name] = None
    return out
