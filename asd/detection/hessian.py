"""Hessian sparsity patterns: second-order index-set tracing at tensor level.

The Hessian tracer is the Jacobian tracer (:mod:`asd.detection.torch_tracer`) plus one shared
``n x n`` boolean pattern ``H``, updated after every rule from the op's second-order class in the
rule table (:mod:`asd.detection.table`; Hill and Dalle's global second-order tracer, one tensor at a
time):

* ``"zero"``, ``"linear"``: nothing (zero-derivative ops already cut the first-order sets);
* ``"nonlinear"`` without ``pairs``: ``H |= G^T G`` for the output's first-order sets ``G``, that is
  every pair of dependencies of one output element (a unary op: the square of its operand's sets);
* argument ``pairs`` (``"bilinear"`` ops and ops linear in some arguments): for each pair ``(a, b)``
  of arguments, ``G_a`` are the output's sets through ``a`` alone (the rule run with every other
  argument blanked) and ``H |= G_a^T G_b + G_b^T G_a``: ``x * y`` adds only cross terms, ``x * x``
  (``G_a = G_b``) its square, and an argument that carries no sets (a constant) adds nothing;
* ``interaction="contraction"`` (matrix products): only the operand elements that are multiplied
  together interact, so ``x @ (A @ x)`` gives ``A``'s pattern exactly;
* ``interaction="multilinear"`` (``prod``): distinct elements of one product interact, an element
  never with itself.

Every rule's result is sound, so ``H`` is: a true nonzero of the Hessian is a product of first-order
dependencies met at some nonlinear op. At the end ``H`` is symmetrized and restricted to the inputs
the output depends on at all (a row of the Hessian vanishes where the gradient does around the
point), which removes the contributions of dead code.

Traced locally, the first-order sets drop only what is absent around the point (``relu`` below its
kink, a constant zero factor), not what merely vanishes at it (``x0 * x1`` at ``x1 = 0``: a zero
first, a nonzero second derivative; see ``Tracer.drops_vanishing``), and the rule of an op run
through one argument alone does not take the others for constants (``Call.constant``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from ..errors import InputError
from ..patterns import SparsityPattern
from . import sets as S
from ._core import Call, TracedTensor, is_differentiable_dtype
from .jacobian import check_input, pattern_of_sets, traced_sets
from .rules.reductions import _dims, group_ids
from .second_order import SecondOrder
from .table import Rule
from .torch_tracer import Tracer, trace

__all__ = ["HessianTracer", "hessian_pattern", "hessian_sparsity"]


@dataclass
class MaskedCall(Call):
    """A :class:`Call` whose ``sets()`` sees only the arguments in ``keep`` (by identity).

    Running a rule on it gives the output's index sets through those arguments alone. An object
    passed under two names (``x * x``) is kept under both: the result is then a superset, so sound.
    """

    keep: frozenset = frozenset()

    def sets(self, t):
        if id(t) not in self.keep:
            return None
        return super().sets(t)


def _traced_in(v) -> list:
    if isinstance(v, TracedTensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for t in v if isinstance(t, TracedTensor)]
    return []


def _carries_sets(t) -> bool:
    return isinstance(t, TracedTensor) and is_differentiable_dtype(t.dtype) and t.sets.nnz > 0


class HessianTracer(Tracer):
    """A :class:`Tracer` that also accumulates the second-order pattern of the traced function
    (a :class:`asd.detection.second_order.SecondOrder`)."""

    drops_vanishing = False

    def __init__(self, n: int, *, local: bool, strict: bool = False, device=None):
        super().__init__(n, local=local, strict=strict, device=device)
        self.second_order = SecondOrder(n)

    # -- accumulation ---------------------------------------------------------------------------
    def add_square(self, G: sp.csr_matrix | None) -> None:
        """``H |= G^T G``: every pair of dependencies of one row of ``G``."""
        self.second_order.add_square(G)

    def add_cross(self, Ga: sp.csr_matrix | None, Gb: sp.csr_matrix | None) -> None:
        """``H |= Ga^T Gb + Gb^T Ga``."""
        self.second_order.add_cross(Ga, Gb)

    def pattern(self) -> sp.csr_matrix:
        """The accumulated symmetric pattern (bool CSR, sorted indices)."""
        return self.second_order.pattern()

    # -- the hook -------------------------------------------------------------------------------
    def observe(self, call: Call, rule: Rule | None, out_sets: list) -> None:
        if rule is None:  # the conservative fallback: a general op
            pairs, interaction = None, "output"
        else:
            if rule.second_order in ("zero", "linear") and rule.pairs is None:
                return
            names = [k for k, v in call.bound().items() if _traced_in(v)]
            pairs, interaction = rule.hessian_pairs(names), rule.interaction
        if pairs == ():
            return
        if interaction == "contraction" and pairs:
            for a, b in pairs:
                self._contraction(call, rule, out_sets, a, b)
            return
        if interaction == "multilinear" and pairs is None:
            self._multilinear(call, out_sets)
            return
        if pairs is None:
            for o, s in zip(call.outs, out_sets):
                if s is not None and is_differentiable_dtype(o.dtype):
                    self.add_square(s)
            return
        through: dict[str, sp.csr_matrix | None] = {}
        for a, b in pairs:
            for name in (a, b):
                if name not in through:
                    through[name] = self._through(call, rule, out_sets, name)
            if a == b:
                self.add_square(through[a])
            else:
                self.add_cross(through[a], through[b])

    def _through(self, call: Call, rule: Rule, out_sets: list, name: str):
        """The sets of the op's (differentiable) outputs through argument ``name`` alone, stacked."""
        keep = [t for t in _traced_in(call.bound().get(name)) if _carries_sets(t)]
        if not keep:
            return None
        keep_ids = frozenset(id(t) for t in keep)
        others = [t for v in call.bound().values() for t in _traced_in(v)
                  if id(t) not in keep_ids and _carries_sets(t)]
        if others:
            masked = MaskedCall(call.func, call.args, call.kwargs, call.pargs, call.pkwargs, call.outs,
                                call.tracer, call._bound, keep=keep_ids)
            sets = self.rule_sets(call, rule, rule.fn(masked))
        else:  # nothing else is traced: the output's sets are those through ``name``
            sets = out_sets
        parts = [s for o, s in zip(call.outs, sets) if s is not None and is_differentiable_dtype(o.dtype)]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else S.vstack(parts)

    def _contraction(self, call: Call, rule: Rule, out_sets: list, a: str, b: str) -> None:
        """Matrix products ``A (b, m, k) @ B (b, k, p)``: ``A[b, i, l]`` meets ``B[b, l, j]`` only."""
        bound = call.bound()
        A, B = bound.get(a), bound.get(b)
        if not (_carries_sets(A) and _carries_sets(B)):
            return
        ga, gb = _contraction_groups(tuple(A.shape), tuple(B.shape))
        if ga is None:  # an unexpected geometry: elements feeding one output element interact
            self.add_cross(self._through(call, rule, out_sets, a), self._through(call, rule, out_sets, b))
            return
        ngroups = int(max(ga.max(initial=-1), gb.max(initial=-1))) + 1
        Ua = S.gather_union(A.sets, ga, np.arange(A.numel()), ngroups)
        Ub = S.gather_union(B.sets, gb, np.arange(B.numel()), ngroups)
        self.add_cross(Ua, Ub)

    def _multilinear(self, call: Call, out_sets: list) -> None:
        """``prod``: distinct elements of one product interact, an element never with itself.

        ``(i, j)`` is missing from the op's contribution exactly when both inputs occur in a single
        element of a product, the same one: counts ``U^T U - E^T E`` with ``U`` the per-product
        unions and ``E`` the entries unique to their product decide it.
        """
        bound = call.bound()
        x = bound.get("self")
        if not _carries_sets(x):
            return
        groups, ngroups = group_ids(tuple(x.shape), _dims(bound.get("dim"), x.dim()))
        G = x.sets
        rows = np.repeat(np.arange(G.shape[0]), np.diff(G.indptr))
        keys = groups[rows].astype(np.int64) * self.n + G.indices
        _, inv, counts = np.unique(keys, return_inverse=True, return_counts=True)
        unique_in_group = (counts[inv] == 1).astype(np.int64)
        U = S.gather_union(G, groups, np.arange(G.shape[0]), ngroups).astype(np.int64)
        # copies: G's arrays belong to live (shared) set matrices, and eliminate_zeros compacts in place
        E = sp.csr_matrix((unique_in_group, G.indices.copy(), G.indptr.copy()), shape=G.shape)
        E.eliminate_zeros()
        D = ((U.T @ U) - (E.T @ E)).tocsr()
        D.data = D.data > 0
        D.eliminate_zeros()
        self.second_order.add(D.astype(bool))


def _contraction_groups(sa: tuple, sb: tuple):
    """For ``A @ B`` (1-D, 2-D or batched 3-D operands): the contracted index ``(batch, l)`` of
    every element of ``A`` and of ``B``; ``(None, None)`` for another geometry."""
    if not (1 <= len(sa) <= 3 and 1 <= len(sb) <= 3):
        return None, None
    k = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    ba = sa[0] if len(sa) == 3 else 1
    bb = sb[0] if len(sb) == 3 else 1
    if k != kb or (len(sa) == 3 and len(sb) == 3 and ba != bb):
        return None, None
    ia = np.arange(int(np.prod(sa)), dtype=np.int64)
    ib = np.arange(int(np.prod(sb)), dtype=np.int64)
    ga = ia % k
    if len(sa) == 3:
        ga = ga + (ia // (sa[1] * k)) * k
    if len(sb) == 1:
        gb = ib
    else:
        p = sb[-1]
        gb = (ib // p) % k
        if len(sb) == 3:
            gb = gb + (ib // (k * p)) * k
    if len(sa) == 3 and len(sb) < 3 or len(sb) == 3 and len(sa) < 3:
        return None, None
    return ga, gb


def hessian_pattern(f: Callable, x: torch.Tensor, *, local: bool = False, strict: bool = False,
                    return_info: bool = False):
    """The Hessian sparsity pattern of the scalar function ``f`` as a frozen, symmetric
    :class:`asd.patterns.SparsityPattern` with ``input_shape = output_shape = x.shape``.

    Arguments as for :func:`hessian_sparsity`, which returns the same structure as a scipy array.
    With ``return_info=True`` the result is ``(pattern, info)``, ``info`` a
    :class:`asd.detection.torch_tracer.TraceInfo`.
    """
    check_input(x)
    n = x.numel()
    y, tracer = trace(f, x, local=local, strict=strict, tracer_cls=HessianTracer)
    if not isinstance(y, torch.Tensor):
        raise InputError(f"the function returned {type(y).__name__}; hessian_sparsity needs a function "
                         "returning a tensor with one element (sum or reduce a vector objective)")
    if y.is_complex() or not y.is_floating_point():
        raise InputError(f"the function returned a tensor of dtype {y.dtype}; its Hessian needs a real "
                         "floating-point output")
    if y.numel() != 1:
        raise InputError(f"the function returned a tensor of shape {tuple(y.shape)}; hessian_sparsity "
                         "needs a scalar (one element) output: reduce it (e.g. .sum()), or use "
                         "jacobian_sparsity for a vector function")
    grad = traced_sets(y, tracer)
    if grad.nnz:
        H = tracer.pattern()
        if grad.nnz < n and H.nnz:
            idx = np.unique(grad.indices)
            Dk = sp.csr_matrix((np.ones(len(idx), dtype=bool), (idx, idx)), shape=(n, n))
            H = S._canonical(Dk @ H @ Dk)
    else:
        H = S.empty(n, n)
    P = pattern_of_sets(H, tuple(x.shape), tuple(x.shape))
    return (P, tracer.info()) if return_info else P


def hessian_sparsity(f: Callable, x: torch.Tensor, *, local: bool = False, strict: bool = False) -> sp.csr_array:
    """Sparsity pattern of the Hessian of the scalar function ``f`` at (``local=True``) or around ``x``.

    Parameters
    ----------
    f
        A function of one tensor returning a tensor with one element (a scalar objective).
    x
        The input; only its shape, dtype and device matter under global tracing.
    local
        Trace with ``x``'s values: value-dependent ops (``relu``, ``max``, ``where`` with a computed
        mask) then give the pattern at this point, which can be sparser than the global one.
    strict
        Raise :class:`asd.errors.UnsupportedOpError` on an op without a rule instead of warning.

    Returns
    -------
    scipy.sparse.csr_array
        Symmetric boolean pattern of shape ``(x.numel(), x.numel())`` in row-major flattening.
    """
    return hessian_pattern(f, x, local=local, strict=strict).to_scipy()
