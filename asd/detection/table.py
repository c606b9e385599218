"""The rule table: one propagation rule per ATen operator overload.

The families in ``asd/detection/rules`` register their rules when :mod:`asd.detection` is
imported, so the table is complete after ``import asd``. Users add or replace rules with
:func:`register_rule` (``override=True`` to replace one).

A rule is a function ``rule(call) -> list`` of an :class:`asd.detection._core.Call`; see
:func:`register_rule` for the contract. Every rule also carries the op's second-order class, used by
Hessian tracing (:mod:`asd.detection.hessian`):

``"zero"``      the derivative is zero almost everywhere (comparisons, sign, rounding, indices)
``"linear"``    linear in every differentiable operand (movement, sums, adds, convolutions with a
                constant filter): no second-order terms
``"bilinear"``  linear in each operand separately (mul, mm, conv of two traced tensors): cross
                terms between operands, no squares
``"nonlinear"`` anything else: every pair of dependencies of an output may interact

Two optional refinements make the second-order class precise where an op is linear in some of its
operands or only some operand elements interact:

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

Registration takes a lock; lookups read a plain dict and take none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Union

import torch

from .._fork import fork_safe

__all__ = ["INTERACTIONS", "RULES", "Rule", "SECOND_ORDER", "aten_ops", "inplace_twin", "lookup", "overloads_except",
           "recording_reached", "register_inplace_twins", "register_rule", "unreached"]

OpLike = Union[torch._ops.OpOverload, torch._ops.OpOverloadPacket]

SECOND_ORDER = ("zero", "linear", "bilinear", "nonlinear")
INTERACTIONS = ("output", "contraction", "multilinear")


@dataclass(frozen=True)
class Rule:
    """A registered propagation rule and the second-order class of its op."""

    op: torch._ops.OpOverload
    fn: Callable
    second_order: str
    family: str
    pairs: tuple[tuple[str, str], ...] | None = None
    interaction: str = "output"
    #: one of asd's own rules (registered while ``asd.detection.rules`` is imported): what it returns
    #: is trusted; every other rule's return is checked in full (:func:`asd.detection.sets.from_rule`)
    builtin: bool = dataclasses.field(default=False, compare=False)

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
_LOCK = fork_safe(threading.Lock())


def _overloads(op) -> list[torch._ops.OpOverload]:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    raise TypeError(f"register_rule: expected an ATen OpOverload or OpOverloadPacket (e.g. "
                    f"torch.ops.aten.mul or torch.ops.aten.mul.Tensor), got {op!r}")


def register_rule(
    ops: OpLike | Iterable[OpLike],
    fn: Callable,
    *,
    second_order: str = "nonlinear",
    pairs: Iterable[tuple[str, str]] | None = None,
    interaction: str = "output",
    family: str = "user",
    override: bool = False,
) -> None:
    """Register ``fn`` as the sparsity rule of every overload of ``ops``.

    A rule has the signature ``fn(call) -> list``. ``call`` (an
    :class:`asd.detection._core.Call`) holds the op (``call.func``), its arguments as passed
    (``call.args``, ``call.kwargs``; ``call.bound()`` maps them to schema names, defaults filled
    in), the output tensors (``call.outs``, the op's tensor results in flattened order, with their
    shapes and dtypes), the number of inputs ``call.n`` and whether the trace is local
    (``call.local``: real values are then available as ``t.primal``). ``call.sets(t)`` gives the
    index sets of a tensor argument ``t``: a boolean ``scipy.sparse.csr_matrix`` with one row per
    element of ``t`` (row-major) and ``call.n`` columns, or ``None`` when ``t`` depends on no input.
    The rule returns, for each entry of ``call.outs``, the index sets of that output (same format,
    one row per output element, sorted indices) or ``None`` for an output that depends on no
    input. :mod:`asd.detection.sets` has the set operations (``take_rows``, ``union``,
    ``gather_union``). A rule must be sound: an output element that may depend on an input must list
    it. What a rule registered here returns is checked in full and copied (any scipy format, order,
    dtype or duplicates are accepted; a wrong shape, malformed row pointers or column indices, or a
    value that is not a list of scipy sparse matrices raise an error naming the rule). The set
    operations expect set matrices: those ``call.sets`` returns, results of set operations, or
    ``asd.detection.sets.from_rule(M, shape)`` of a matrix built by hand.

    Parameters
    ----------
    ops
        An op: an overload (``torch.ops.aten.mul.Tensor``), a packet (``torch.ops.aten.mul``,
        meaning all its overloads), or an iterable of them.
    fn
        The rule, ``fn(call) -> list[scipy.sparse.csr_matrix | None]``.
    second_order
        The op's second-order class for Hessian detection: ``"zero"``, ``"linear"``,
        ``"bilinear"`` or ``"nonlinear"`` (see :mod:`asd.detection.table`). ``"nonlinear"`` is
        always sound.
    pairs, interaction
        Second-order refinements (see :mod:`asd.detection.table`); by default derived from
        ``second_order``. Pair entries are argument names of the op's schema.
    family
        Name of the family (module) registering the rule, for coverage reports.
    override
        Replace a rule already registered for one of the overloads. Without it, a second rule for
        an overload raises :class:`ValueError`.

    Raises
    ------
    TypeError
        If an entry of ``ops`` is not an ATen op.
    ValueError
        For an unknown ``second_order`` or ``interaction``, a pair naming an argument the op does not
        have, or an overload that already has a rule (without ``override=True``). Nothing is
        registered then.
    """
    if second_order not in SECOND_ORDER:
        raise ValueError(f"second_order must be one of {SECOND_ORDER}, got {second_order!r}")
    if interaction not in INTERACTIONS:
        raise ValueError(f"interaction must be one of {INTERACTIONS}, got {interaction!r}")
    if not callable(fn):
        raise TypeError(f"register_rule: fn must be callable, got {fn!r}")
    pairs = None if pairs is None else tuple(tuple(p) for p in pairs)
    if isinstance(ops, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ops = [ops]
    overloads = [o for op in ops for o in _overloads(op)]
    if len(set(overloads)) != len(overloads):
        twice = next(o for o in overloads if overloads.count(o) > 1)
        raise ValueError(f"register_rule: {twice} is listed twice in one registration")
    for overload in overloads:
        _check_pairs(overload, pairs)
    with _LOCK:
        if not override:
            taken = [o for o in overloads if o in RULES]
            if taken:
                raise ValueError(f"a rule for {taken[0]} is already registered (family "
                                 f"{RULES[taken[0]].family!r}); pass override=True to replace it")
        for overload in overloads:
            RULES[overload] = Rule(overload, fn, second_order, family, pairs, interaction)


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


def aten_ops(*names: str, optional: Iterable[str] = ()) -> list[torch._ops.OpOverloadPacket]:
    """The packets ``torch.ops.aten.<name>`` for ``names`` and, where this torch has them, ``optional``.

    A name in ``names`` that this torch does not have raises :class:`ValueError`; ops that exist in
    some supported torch versions only go in ``optional``.
    """
    aten = torch.ops.aten
    missing = [name for name in names if not hasattr(aten, name)]
    if missing:
        raise ValueError(f"torch {torch.__version__} has no ATen op named {', '.join(missing)}; "
                         "list ops that only some torch versions have in optional=")
    return [getattr(aten, name) for name in names] + [getattr(aten, name) for name in optional
                                                      if hasattr(aten, name)]


def overloads_except(packets: Iterable[torch._ops.OpOverloadPacket], *excluded: str) -> list[torch._ops.OpOverload]:
    """All overloads of ``packets`` but those named ``excluded`` (``"max.other"``); an excluded name
    that is not an overload of one of the packets raises :class:`ValueError`."""
    packets = list(packets)
    known = {f"{p.__name__}.{o}" for p in packets for o in p.overloads()}
    unknown = [name for name in excluded if name not in known]
    if unknown:
        raise ValueError(f"torch {torch.__version__} has no overload {', '.join(unknown)} of "
                         f"{', '.join(p.__name__ for p in packets)}")
    return [getattr(p, o) for p in packets for o in p.overloads() if f"{p.__name__}.{o}" not in excluded]


_REACHED: list[set] = []  # the sets of open recording_reached() blocks


def lookup(op: torch._ops.OpOverload) -> Rule | None:
    """The rule registered for ``op``, or ``None``."""
    rule = RULES.get(op)
    if _REACHED and rule is not None:
        for reached in _REACHED:
            reached.add(op)
    return rule


def _traceable(op: torch._ops.OpOverload) -> bool:
    args = op._schema.arguments
    if any(a.name == "out" or (a.kwarg_only and a.alias_info is not None and a.alias_info.is_write) for a in args):
        return False
    return any("Tensor" in str(a.type) for a in args)


@contextlib.contextmanager
def recording_reached() -> Iterator[set]:
    """Record the overloads whose rule a trace looks up (in any thread) while the block runs.

    Yields the set they are added to, for a coverage report (:func:`unreached`)."""
    reached: set = set()
    with _LOCK:
        _REACHED.append(reached)
    try:
        yield reached
    finally:
        with _LOCK:
            _REACHED.remove(reached)


def unreached(reached: Iterable[torch._ops.OpOverload], *, traceable_only: bool = True) -> dict[str, list[str]]:
    """The registered overloads not in ``reached``, by family, sorted by name.

    Parameters
    ----------
    reached
        Overloads whose rule ran (from :func:`recording_reached`).
    traceable_only
        Leave out the overloads a trace never meets: ``out=`` variants (functional code calls the
        others) and overloads of Python numbers only (``aten.sin.int``).

    Returns
    -------
    dict
        ``{family: [overload name, ...]}`` for every family with an unreached rule.
    """
    reached = set(reached)
    out: dict[str, list[str]] = {}
    for op, rule in RULES.items():
        if op not in reached and not (traceable_only and not _traceable(op)):
            out.setdefault(rule.family, []).append(str(op))
    return {family: sorted(names) for family, names in sorted(out.items())}


def inplace_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The in-place variant of an out-of-place overload (``aten.elu.default`` ->
    ``aten.elu_.default``): the overload of the same name in packet ``<name>_`` taking the same
    arguments, or ``None`` when there is none."""
    name = op.overloadpacket.__name__
    if name.endswith("_") or not hasattr(torch.ops.aten, name + "_"):
        return None
    packet = getattr(torch.ops.aten, name + "_")
    if op._overloadname not in packet.overloads():
        return None
    twin = getattr(packet, op._overloadname)
    if {a.name for a in twin._schema.arguments} != {a.name for a in op._schema.arguments}:
        return None
    return twin


def seal_builtin() -> None:
    """Mark every rule registered so far as one of asd's own (called once, at the end of
    ``asd.detection.rules``'s import); a rule registered later, or registered again, is not."""
    with _LOCK:
        for op, rule in list(RULES.items()):
            RULES[op] = dataclasses.replace(rule, builtin=True)


def register_inplace_twins() -> list[torch._ops.OpOverload]:
    """Give the in-place variant of every registered overload that has none its out-of-place rule.

    An in-place op writes into ``self`` the value its out-of-place variant returns, so the same rule
    (and second-order class) describes it. Returns the overloads registered."""
    added = []
    with _LOCK:
        for op, rule in list(RULES.items()):
            twin = inplace_twin(op)
            if twin is not None and twin not in RULES:
                RULES[twin] = Rule(twin, _as_twin_of(op, rule.fn), rule.second_order, rule.family, rule.pairs,
                                   rule.interaction)
                added.append(twin)
    return added


def _as_twin_of(op: torch._ops.OpOverload, fn: Callable) -> Callable:
    """``fn`` run on a call of ``op``'s in-place variant as if it were a call of ``op`` (rules may
    dispatch on ``call.func``); arguments stay bound by the variant's own schema."""

    def rule(call):
        return fn(dataclasses.replace(call, func=op, _bound=call.bound()))

    rule.__name__ = rule.__qualname__ = f"{getattr(fn, '__name__', 'rule')}_inplace"
    rule.__doc__ = fn.__doc__
    return rule
