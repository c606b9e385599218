"""Solver objects: the interface, their prepared state, :class:`SolveInfo`, and the one
implicit-function backward shared by every solver.

A solver is an immutable description (method and options).  ``state = solver.init(A)`` does the
expensive, right-hand-side independent work (a factorization, a prepared operator and
preconditioner) and can serve any number of ``solver.compute(state, b) -> (x, info)`` calls.
``solver.transpose(state)`` is the state of ``A^T``; it shares the factorization, and the
backward pass runs its adjoint solve through it.

Backward (implicit function theorem): with ``M = op(A)``, ``x = M^+ b``, ``r = b - M x`` and
incoming gradient ``g``, the adjoint solve ``q = M^{+T} g`` gives ``grad b = q`` and

    grad M = -q x^T  +  r (M^+ q)^T            (the second term only for tall least squares)
                     +  (M^{+T} x) (g - M^+ M g)^T   (only for wide, minimum-norm solves)

sampled at A's stored entries.  For square nonsingular ``A`` this is ``-(A^{-T} g) x^T``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch

from asd.errors import ConvergenceWarning, InputError
from asd.linalg import _kernels as K
from asd.linalg._device import all_finite, is_meta
from asd.linalg._sparse import (Pattern, _raw_values, check_dense, check_dtypes, from_columns, to_columns,
                                values_of)
from asd.linalg.products import _SDDMM, _SpMM

__all__ = ["SolveInfo", "Solver", "SolverState", "SingularMatrixError"]


class SingularMatrixError(InputError):
    """A direct solver met a singular (or, for Cholesky, not positive definite) matrix."""


@dataclass(frozen=True)
class SolveInfo:
    """How a solve ended.  Solvers report, they don't throw: a solve that stops short of its
    stopping rule returns its best iterate, ``converged=False`` and a
    :class:`~asd.errors.ConvergenceWarning`.

    The stopping rules, per right-hand side:

    * Krylov solvers: ``||b - op(A) x|| <= max(rtol ||b||, atol)``.
    * :class:`~asd.linalg.LSMR` also converges on a least-squares solution of relative backward
      error ``rtol``, ``||A^T r|| <= rtol ||A|| ||r||`` (its residual then exceeds the tolerance:
      the system is inconsistent, or numerically singular).
    * Direct solvers: ``||b - op(A) x|| <= eps^(1/4) ||b||`` (``eps`` of the dtype): a larger
      residual means A is numerically singular or too ill-conditioned for the dtype (a
      backward-stable solve leaves at most ``eps cond(A) ||b||``: this flags ``cond(A)`` beyond
      about ``1e5`` in float32 and ``5e11`` in float64, and a singular A with ``b`` outside its range).

    Attributes
    ----------
    solver : str
        The solver's class name (``"LU"``, ``"CG"``, ...).
    converged : bool
        Every right-hand side met its stopping rule.
    iterations : int
        The largest iteration count over right-hand sides (0 for direct solvers).
    residual : float
        The largest final residual norm ``||b - op(A) x||`` over right-hand sides.
    tolerance : float
        The largest residual tolerance over right-hand sides: ``max(rtol ||b||, atol)``, or
        ``eps^(1/4) ||b||`` for direct solvers.
    per_column : tuple
        ``(converged, iterations, residual)`` for each right-hand side.

    On ``meta`` nothing is known about convergence: ``converged`` is False, ``residual`` and
    ``tolerance`` are NaN, and no :class:`~asd.errors.ConvergenceWarning` is emitted.
    """

    solver: str
    converged: bool
    iterations: int
    residual: float
    tolerance: float
    per_column: tuple = field(default=(), repr=False)


@dataclass(frozen=True, eq=False)
class SolverState:
    """What :meth:`Solver.init` prepared for one matrix; pass it to :meth:`Solver.compute` or to
    :func:`asd.linalg.solve` (``solver=state``) to solve with it again.

    Attributes
    ----------
    solver : Solver
        The solver that made it.
    pattern : Pattern
        A's structure.
    values : torch.Tensor
        A's flat stored values as given to ``init`` (still connected to A's autograd graph, so
        ``compute`` differentiates with respect to that A).
    transposed : bool
        The state solves with ``A^T`` (see :meth:`Solver.transpose`).
    snapshot : torch.Tensor or None
        A private copy of A's own stored values taken by ``init``: a state whose A was changed in
        place since (an optimizer step on A) is refused, as its factorization or preconditioner
        belongs to the old A.
    source : torch.Tensor or None
        The matrix given to ``init``, whose stored values :meth:`check_current` compares with the
        snapshot (``values`` is a coalesced copy for an uncoalesced COO matrix, which an update of
        A leaves as it was).
    """

    solver: "Solver"
    pattern: Pattern
    values: torch.Tensor
    transposed: bool
    snapshot: Optional[torch.Tensor] = field(default=None, kw_only=True, repr=False)
    source: Optional[torch.Tensor] = field(default=None, kw_only=True, repr=False)

    def check_current(self) -> None:
        """Raise :class:`asd.InputError` if A's stored values changed since ``init`` (compared by
        content: a write through numpy leaves no version count)."""
        if self.snapshot is None:
            return
        v = _stored_values(self.source) if self.source is not None else self.values.detach()
        if v.is_meta:
            return
        if v.shape != self.snapshot.shape or not torch.equal(v, self.snapshot):
            raise InputError("A's stored values changed in place since solver.init(A), so the prepared "
                             "factorization or preconditioner is of the old A; call solver.init(A) again")

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows of b, rows of x)`` of the (flattened, block-diagonal) system ``op(A) x = b``."""
        P = self.pattern
        return (P.n_cols, P.n_rows) if self.transposed else (P.n_rows, P.n_cols)


def _stored_values(A: torch.Tensor) -> torch.Tensor:
    """A's own stored values as they are now (an uncoalesced COO matrix's duplicates included),
    detached: what an in-place update of A (an optimizer step) changes."""
    return _raw_values(A.detach())


def check_count(value, name: str, *, allow_none: bool = False) -> None:
    """``value`` is a positive int (``None`` allowed where it means a default)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")


def check_finite_matrix(vals: torch.Tensor, name: str = "A") -> None:
    """Raise :class:`asd.InputError` if a matrix's stored values hold a NaN or inf (one read-back;
    nothing on meta)."""
    if not all_finite(vals.detach()):
        raise InputError(f"{name} has NaN or inf among its stored values; a solve needs finite {name}")


def check_finite_rhs(b: torch.Tensor, name: str = "b") -> None:
    """Raise :class:`asd.InputError` if a right-hand side holds a NaN or inf."""
    if not all_finite(b.detach()):
        raise InputError(f"{name} contains NaN or inf; the right-hand side of a solve must be finite")


def check_tolerance(value, name: str, *, below_one: bool) -> None:
    """``value`` is a finite non-negative number (below 1 for a relative tolerance)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= 0 and (value < 1 or not below_one)
    if not ok:
        rng = "in [0, 1)" if below_one else "finite and >= 0"
        raise InputError(f"{name} must be a number {rng}, got {value!r}")


class Solver(ABC):
    """Interface of the sparse linear solvers (immutable; subclasses are frozen dataclasses)."""

    least_squares: ClassVar[bool] = False     # accepts rectangular A (minimum-norm least squares)
    remedy: ClassVar[str] = "raise maxiter, loosen rtol/atol or pass a preconditioner"

    @property
    def name(self) -> str:
        return type(self).__name__

    def init(self, A: torch.Tensor) -> SolverState:
        """Prepare the solver for ``A`` (factorize, or set up the operator and preconditioner).

        Parameters
        ----------
        A : torch.Tensor
            Sparse COO or CSR, ``(n, n)`` or batched ``(B, n, n)`` (solved as one block-diagonal
            system); rectangular for least-squares solvers.

        Returns
        -------
        SolverState
            Reusable for any number of right-hand sides.
        """
        P, vals = values_of(A, "A")
        if P.n != P.m and not self.least_squares:
            raise InputError(f"A must be square for {self.name}(), got shape {P.shape}; for a "
                             f"least-squares solution use asd.linalg.LSMR()")
        check_finite_matrix(vals)
        state = self._prepare(P, vals)
        stored = _stored_values(A)
        snapshot = None if stored.is_meta else stored.clone()
        return dataclasses.replace(state, snapshot=snapshot, source=A)

    def transpose(self, state: SolverState) -> SolverState:
        """The state of ``A^T``, sharing ``state``'s factorization or prepared operator."""
        return dataclasses.replace(state, transposed=not state.transposed)

    def compute(self, state: SolverState, b: torch.Tensor, *, x0: Optional[torch.Tensor] = None,
                warn: bool = True) -> tuple[torch.Tensor, SolveInfo]:
        """Solve ``op(A) x = b`` with a prepared state.

        Parameters
        ----------
        state : SolverState
            From :meth:`init` (or :meth:`transpose`) of this solver.
        b : torch.Tensor
            Dense ``(n,)``, ``(n, k)``, ``(B, n)`` or ``(B, n, k)``, finite.
        x0 : torch.Tensor, optional
            Starting guess shaped like ``x`` (iterative solvers; a constant for autograd).
        warn : bool
            Emit :class:`~asd.errors.ConvergenceWarning` when a solve (forward or adjoint) stops
            short of its tolerance.

        Returns
        -------
        (torch.Tensor, SolveInfo)
            ``x``, differentiable with respect to ``b`` and to the A given to :meth:`init`
            (gradient on A's stored entries only).
        """
        if not isinstance(state, SolverState) or state.solver != self:
            raise InputError(f"state must come from this solver's init(A) ({self!r}), got "
                             f"{type(state).__name__}")
        state.check_current()
        return apply_solve(state, state.values, b, x0, warn)

    @abstractmethod
    def _prepare(self, P: Pattern, vals: torch.Tensor) -> SolverState:
        """Build the state for a validated matrix."""

    @abstractmethod
    def _run(self, state: SolverState, Bm: torch.Tensor,
             X0: Optional[torch.Tensor]) -> tuple[torch.Tensor, SolveInfo]:
        """Solve ``op(A) X = Bm`` for columns ``Bm`` without autograd."""


def residual_norms(state: SolverState, Bm: torch.Tensor, X: torch.Tensor) -> list[float]:
    """``||b_j - op(A) x_j||`` per column (NaN on meta)."""
    if is_meta(X):
        return [math.nan] * X.shape[1]
    R = Bm - K.spmm(state.pattern, state.values.detach(), X, state.transposed)
    return torch.linalg.vector_norm(R, dim=0).tolist()


def apply_solve(state: SolverState, vals: torch.Tensor, b: torch.Tensor,
                x0: Optional[torch.Tensor], warn: bool) -> tuple[torch.Tensor, SolveInfo]:
    """Shape handling around :class:`_ImplicitSolve`; ``vals`` carries the gradient to A."""
    P = state.pattern
    n_b, n_x = (P.m, P.n) if state.transposed else (P.n, P.m)
    check_dense(b, "b", P, n_b, what="rhs")
    check_dtypes(vals, b)
    Bm, layout = to_columns(b, P, n_b, "b")
    check_finite_rhs(b)
    X0 = None
    if x0 is not None:
        check_dense(x0, "x0", P, n_x, what="rhs")
        check_dtypes(vals, x0)
        X0, _ = to_columns(x0.detach(), P, n_x, "x0")
        if X0.shape[1] != Bm.shape[1]:
            raise InputError(f"x0 has shape {tuple(x0.shape)}, which does not match x for b of "
                             f"shape {tuple(b.shape)}")
        if n_b < n_x:
            raise InputError("x0 is not supported for an underdetermined system: its "
                             "minimum-norm solution needs a zero start")
    out: list = []
    X = _ImplicitSolve.apply(vals, Bm, state, X0, warn, out)
    return from_columns(X, layout, P, n_x), out[0]


def _run_columns(state: SolverState, Bm: torch.Tensor, X0: Optional[torch.Tensor]) -> tuple[torch.Tensor, SolveInfo]:
    """``state.solver._run``; no columns (``b`` of shape ``(n, 0)``) solve to no columns."""
    if Bm.shape[1] == 0:
        return Bm.new_zeros((state.shape[1], 0)), SolveInfo(state.solver.name, True, 0, 0.0, float("nan"), ())
    return state.solver._run(state, Bm, X0)


def _report(info: SolveInfo, remedy: str, warn: bool, adjoint: bool, meta: bool) -> None:
    if warn and not info.converged and not meta:
        what = "adjoint (backward) solve" if adjoint else "solve"
        warnings.warn(ConvergenceWarning(
            f"{info.solver} {what} did not converge: {info.iterations} iterations, residual norm "
            f"{info.residual:.3e} > tolerance {info.tolerance:.3e}; {remedy}"), stacklevel=5)


class _ImplicitSolve(torch.autograd.Function):
    """``X = op(A)^+ Bm`` by any solver state; backward by the implicit function theorem."""

    @staticmethod
    def forward(ctx, vals, Bm, state, X0, warn, out):
        X, info = _run_columns(state, Bm.detach(), X0)
        _report(info, state.solver.remedy, warn, adjoint=out is None, meta=is_meta(X))
        if out is not None:
            out.append(info)
        ctx.state, ctx.warn = state, warn
        ctx.save_for_backward(vals, Bm, X)
        return X

    @staticmethod
    def backward(ctx, G):
        vals, Bm, X = ctx.saved_tensors
        st = ctx.state
        P = st.pattern
        graph = torch.is_grad_enabled()

        def solve(s: SolverState, rhs: torch.Tensor) -> torch.Tensor:
            if graph:
                return _ImplicitSolve.apply(vals, rhs, s, None, ctx.warn, None)
            Y, info = _run_columns(s, rhs.detach(), None)
            _report(info, s.solver.remedy, ctx.warn, adjoint=True, meta=is_meta(Y))
            return Y

        def op(Y: torch.Tensor, transposed: bool) -> torch.Tensor:
            return _SpMM.apply(vals, Y, P, transposed) if graph else K.spmm(P, vals, Y, transposed)

        def outer(U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
            """``(U V^T)`` of op(A)'s shape sampled at A's stored entries."""
            if st.transposed:
                U, V = V, U
            return _SDDMM.apply(U, V, P) if graph else K.sddmm(P, U, V)

        stT = st.solver.transpose(st)
        Q = solve(stT, G)
        gv = None
        if ctx.needs_input_grad[0]:
            gv = -outer(Q, X)
            rows, cols = st.shape
            # the pseudo-inverse's derivative (Golub and Pereyra): a least-squares solver's A may be
            # rank-deficient whatever its shape (a square A with an empty row), and then both terms
            # count; a full-rank A zeroes the one its shape does not need
            pseudo = st.solver.least_squares
            if rows > cols or pseudo:                             # the least-squares residual
                R = Bm - op(X, st.transposed)
                gv = gv + outer(R, solve(st, Q))
            if rows < cols or pseudo:                             # the minimum-norm solution
                Gperp = G - solve(st, op(G, st.transposed))
                gv = gv + outer(solve(stT, X), Gperp)
        return gv, (Q if ctx.needs_input_grad[1] else None), None, None, None, None
