"""Krylov solver objects: ``CG``, ``BiCGStab``, ``MINRES``, ``GMRES`` and ``LSMR``.

They run the iterations of :mod:`asd.linalg.krylov` in torch on A's device, with the recurrence
scalars kept there and one convergence test (one host transfer) every ``check_every`` iterations;
iteration counts are therefore multiples of ``check_every`` (or ``maxiter``).  On ``meta``, where
no test can be read, a solve runs one block (``min(check_every, maxiter)`` iterations): the
shapes it propagates are those of any longer run.  The stopping rule
is scipy's, per right-hand side: ``||b - op(A) x|| <= max(rtol ||b||, atol)``; :class:`LSMR` also
converges on a least-squares solution of an inconsistent system.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional, Union

import torch

from asd.errors import InputError
from asd.linalg import _kernels as K
from asd.linalg import krylov
from asd.linalg._sparse import Pattern, values_of
from asd.linalg.base import SolveInfo, Solver, SolverState, check_count, check_tolerance

__all__ = ["CG", "BiCGStab", "MINRES", "GMRES", "LSMR", "KrylovState", "Preconditioner"]

Preconditioner = Union[None, Callable[[torch.Tensor], torch.Tensor], torch.Tensor]
Op = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, eq=False)
class KrylovState(SolverState):
    """A's operator, the prepared preconditioner ``precond(r, transposed)`` (or ``None``) and
    ``norm``, A's Frobenius norm where the solver's stopping rule needs it (LSMR; else NaN)."""

    precond: Optional[Callable[[torch.Tensor, bool], torch.Tensor]] = None
    norm: float = math.nan


def _prepare_preconditioner(M: Preconditioner, P: Pattern, vals: torch.Tensor):
    if M is None:
        return None
    if isinstance(M, torch.Tensor):
        PM, vm = values_of(M.detach(), "preconditioner")
        vm = vm.detach()
        if (PM.n_rows, PM.n_cols) != (P.n_rows, P.n_rows):
            raise InputError(f"preconditioner of shape {tuple(M.shape)} does not match A of shape "
                             f"{P.shape}")
        if vm.device != P.device:
            raise InputError(f"preconditioner is on {vm.device} but A is on {P.device}; move it "
                             f"with .to(A.device)")
        if vm.dtype != vals.dtype:
            raise InputError(f"preconditioner is {vm.dtype} but A is {vals.dtype}; cast it with "
                             f".to(A.dtype)")
        return lambda r, t: K.spmm(PM, vm, r.reshape(-1, 1), t).reshape(-1)
    if callable(M):
        return lambda r, t: _checked_output(M(r), r)
    raise InputError(f"preconditioner must be a sparse tensor or a callable r -> M r, got "
                     f"{type(M).__name__}")


def _checked_output(z, r: torch.Tensor) -> torch.Tensor:
    """A callable preconditioner's ``z = M(r)``, which must be a tensor shaped like ``r``, of its
    dtype and on its device."""
    if (not isinstance(z, torch.Tensor) or z.shape != r.shape or z.dtype != r.dtype
            or z.device != r.device):
        got = (f"shape {tuple(z.shape)}, {z.dtype} on {z.device}" if isinstance(z, torch.Tensor)
               else f"a {type(z).__name__}")
        raise InputError(f"preconditioner must map the residual r (a torch.Tensor of shape "
                         f"{tuple(r.shape)}, {r.dtype} on {r.device}) to M r of the same shape, "
                         f"dtype and device, but returned {got}")
    return z


@dataclass(frozen=True)
class _Krylov(Solver):
    """Shared options and the per-column loop of the Krylov solvers."""

    rtol: float = 1e-6
    atol: float = 0.0
    maxiter: Optional[int] = None
    preconditioner: Preconditioner = field(default=None, compare=False, repr=False)
    check_every: int = 10

    def __post_init__(self):
        check_tolerance(self.rtol, "rtol", below_one=True)
        check_tolerance(self.atol, "atol", below_one=False)
        check_count(self.maxiter, "maxiter", allow_none=True)
        check_count(self.check_every, "check_every")

    def _prepare(self, P: Pattern, vals: torch.Tensor) -> KrylovState:
        return KrylovState(self, P, vals, False,
                           _prepare_preconditioner(self.preconditioner, P, vals))

    @abstractmethod
    def _iterate(self, state: KrylovState, A: Op, AT: Op, b, x, tol: float, maxiter: int,
                 M: Optional[Op]):
        """One right-hand side: ``(x, iterations, final residual norm, converged)``."""

    def _run(self, state: SolverState, Bm: torch.Tensor,
             X0: Optional[torch.Tensor]) -> tuple[torch.Tensor, SolveInfo]:
        P, t = state.pattern, state.transposed
        v = state.values.detach()
        A = lambda x: K.spmm(P, v, x.reshape(-1, 1), t).reshape(-1)        # noqa: E731
        AT = lambda x: K.spmm(P, v, x.reshape(-1, 1), not t).reshape(-1)   # noqa: E731
        M = (lambda r: state.precond(r, t)) if state.precond is not None else None
        maxiter = self.maxiter if self.maxiter is not None else 10 * max(state.shape)
        if Bm.device.type == "meta":
            maxiter = min(maxiter, self.check_every)
        cols, stats = [], []
        with torch.no_grad():
            for c in range(Bm.shape[1]):
                b = Bm[:, c]
                (bn,) = krylov.read_back(torch.linalg.vector_norm(b))
                tol = max(self.rtol * bn, self.atol)
                x = X0[:, c].clone() if X0 is not None else b.new_zeros(state.shape[1])
                x, it, rn, ok = self._iterate(state, A, AT, b, x, tol, maxiter, M)
                cols.append(x)
                stats.append((ok, it, rn, tol))
        X = torch.stack(cols, 1)
        info = SolveInfo(self.name, all(s[0] for s in stats), max(s[1] for s in stats),
                         max(s[2] for s in stats), max(s[3] for s in stats),
                         tuple(s[:3] for s in stats))
        return X, info


@dataclass(frozen=True)
class _SquareKrylov(_Krylov):
    """A solver of square systems: runs ``_iteration`` (a loop of :mod:`asd.linalg.krylov`) and has
    converged when the residual meets the tolerance."""

    _iteration: ClassVar[Callable]

    def _options(self) -> dict:
        """Extra keyword arguments of ``_iteration``."""
        return {}

    def _iterate(self, state, A, AT, b, x, tol, maxiter, M):
        x, it, rn = self._iteration(A, b, x, tol, maxiter, M, self.check_every, **self._options())
        return x, it, rn, rn <= tol


@dataclass(frozen=True)
class CG(_SquareKrylov):
    """Conjugate gradients for symmetric positive definite A (preconditioner SPD too)."""

    _iteration = staticmethod(krylov.cg)


@dataclass(frozen=True)
class BiCGStab(_SquareKrylov):
    """BiCGSTAB for general square A (right preconditioning)."""

    _iteration = staticmethod(krylov.bicgstab)


@dataclass(frozen=True)
class MINRES(_SquareKrylov):
    """MINRES for symmetric (possibly indefinite) A with an SPD preconditioner."""

    _iteration = staticmethod(krylov.minres)


@dataclass(frozen=True)
class GMRES(_SquareKrylov):
    """Restarted GMRES for general square A (right preconditioning; ``maxiter`` counts inner
    iterations, ``restart`` is the Krylov space size between restarts)."""

    _iteration = staticmethod(krylov.gmres)
    restart: int = 30

    def __post_init__(self):
        super().__post_init__()
        check_count(self.restart, "restart")

    def _options(self) -> dict:
        return {"restart": self.restart}


@dataclass(frozen=True)
class LSMR(_Krylov):
    """LSMR for ``min ||A x - b||`` with any (square or rectangular) A, no preconditioner.

    Started from zero, it gives the minimum-norm least-squares solution (for a rank-deficient A
    too).  It converges when the residual reaches the tolerance,
    ``||b - A x|| <= max(rtol ||b||, atol)``, or, for an inconsistent system, at a least-squares
    solution of relative backward error ``rtol``, ``||A^T r|| <= rtol ||A|| ||r||`` (scipy's
    ``lsmr`` test with ``atol = rtol``). A breakdown of its bidiagonalization (a rank-deficient
    A's Krylov space exhausted) stops it with its iterate, judged by the same tests.
    """

    least_squares: ClassVar[bool] = True
    remedy: ClassVar[str] = "raise maxiter, loosen rtol/atol or scale the columns of A"

    def __post_init__(self):
        super().__post_init__()
        if self.preconditioner is not None:
            raise InputError("LSMR takes no preconditioner; scale the columns of A instead")

    def _prepare(self, P: Pattern, vals: torch.Tensor) -> KrylovState:
        (norm,) = krylov.read_back(torch.linalg.vector_norm(vals.detach()))
        return KrylovState(self, P, vals, False, None, norm)

    def _iterate(self, state, A, AT, b, x, tol, maxiter, M):
        return krylov.lsmr(A, AT, b, x, tol, maxiter, self.check_every, state.norm, self.rtol)
