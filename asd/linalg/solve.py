"""``solve(A, b, solver)``: one entry point for every sparse solver, with gradients in A's pattern.

The method strings of earlier versions (``"direct"``, ``"cg"``, ...) remain as shorthands for
the solver objects (:data:`METHODS`).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from asd.errors import InputError
from asd.linalg._sparse import values_of
from asd.linalg.base import Solver, SolverState, apply_solve
from asd.linalg.direct import LU, Cholesky
from asd.linalg.iterative import CG, GMRES, LSMR, MINRES, BiCGStab, Preconditioner

__all__ = ["solve", "solver_for", "METHODS"]

METHODS: dict[str, type] = {"direct": LU, "lu": LU, "cholesky": Cholesky, "cg": CG,
                            "bicgstab": BiCGStab, "minres": MINRES, "gmres": GMRES, "lsmr": LSMR}


def solver_for(method: str, *, rtol: Optional[float] = None, atol: Optional[float] = None,
               maxiter: Optional[int] = None, M: Preconditioner = None,
               restart: Optional[int] = None) -> Solver:
    """The solver object a method string stands for (iterative options are ignored by the
    direct methods ``"direct"``/``"lu"``/``"cholesky"``)."""
    cls = METHODS.get(method) if isinstance(method, str) else None
    if cls is None:
        raise InputError(f"unknown method {method!r}; choose one of {tuple(METHODS)} or pass a "
                         f"solver object such as asd.linalg.CG(rtol=1e-8)")
    if cls in (LU, Cholesky):
        return cls()
    opts = dict(rtol=rtol, atol=atol, maxiter=maxiter)
    if M is not None:
        opts["preconditioner"] = M
    if cls is GMRES:
        opts["restart"] = restart
    return cls(**{k: v for k, v in opts.items() if v is not None})


def _matching_state(state: SolverState, A: torch.Tensor):
    """A's flat values, after checking that ``state`` was prepared for this very matrix."""
    P, vals = values_of(A, "A")
    Q = state.pattern
    same = (not state.transposed and P.shape == Q.shape and P.nnz == Q.nnz
            and (P is Q or (torch.equal(P.crow, Q.crow) and torch.equal(P.col, Q.col)))
            and torch.equal(vals.detach(), state.values.detach()))
    if not same:
        raise InputError("solver= is a state prepared for a different matrix (pattern or values "
                         "differ from A); call solver.init(A) again")
    state.check_current()  # A's values and the state's are one tensor: compared with init's copy
    return vals


def solve(A: torch.Tensor, b: torch.Tensor, solver: Union[Solver, SolverState, str, None] = None,
          *, method: Optional[str] = None, rtol: Optional[float] = None,
          atol: Optional[float] = None, maxiter: Optional[int] = None, M: Preconditioner = None,
          restart: Optional[int] = None, x0: Optional[torch.Tensor] = None,
          return_info: bool = False, warn: bool = True):
    """Solve ``A x = b`` for sparse ``A`` with gradients on A's stored entries.

    Parameters
    ----------
    A : torch.Tensor
        Sparse COO or CSR, ``(n, n)`` or batched ``(B, n, n)`` (solved as one block-diagonal
        system); rectangular ``(n, m)`` for :class:`LSMR` (least squares / minimum norm).
    b : torch.Tensor
        Dense and finite: ``(n,)``, ``(n, k)``, ``(B, n)`` or ``(B, n, k)``.
    solver : Solver, SolverState or str, optional
        A solver object (default ``LU()``): :class:`LU`, :class:`Cholesky`, :class:`CG`,
        :class:`BiCGStab`, :class:`MINRES`, :class:`GMRES`, :class:`LSMR`; or a state from
        ``solver.init(A)`` to reuse its factorization (it must have been prepared for this A);
        or a method string, as ``method=``.
    method : str, optional
        Shorthand: ``"direct"``/``"lu"``, ``"cholesky"``, ``"cg"``, ``"bicgstab"``,
        ``"minres"``, ``"gmres"``, ``"lsmr"``, configured by ``rtol``, ``atol``, ``maxiter``,
        ``M`` (preconditioner) and ``restart`` (see :func:`solver_for`).  With a solver object
        these options belong to the object.
    x0 : torch.Tensor, optional
        Iterative solvers' starting guess shaped like ``x`` (a constant for autograd).
    return_info : bool
        Also return the :class:`SolveInfo` of the forward solve.
    warn : bool
        Emit :class:`~asd.errors.ConvergenceWarning` when a solve (forward or the adjoint solve
        of the backward pass) stops short of its tolerance.  Solvers never raise on that.

    Returns
    -------
    torch.Tensor or (torch.Tensor, SolveInfo)
        ``x`` shaped like ``b`` (``m`` rows for a rectangular A).  Backward: one adjoint solve
        with ``A^T`` through the same solver state (LU reuses its factors), ``grad b = A^{-T} g``
        and ``grad A = -(A^{-T} g) x^T`` on A's stored entries, in A's layout.
    """
    options = dict(rtol=rtol, atol=atol, maxiter=maxiter, M=M, restart=restart)
    if isinstance(solver, str):
        if method is not None:
            raise InputError("pass the method either positionally or as method=, not both")
        solver, method = None, solver
    if method is not None:
        if solver is not None:
            raise InputError("pass either solver= or method=, not both")
        solver = solver_for(method, **options)
    elif any(v is not None for v in options.values()):
        raise InputError(f"rtol/atol/maxiter/M/restart configure a method string; with a solver "
                         f"object set them on it, e.g. asd.linalg.CG(rtol=1e-8, maxiter=500) "
                         f"(got {', '.join(k for k, v in options.items() if v is not None)})")
    if solver is None:
        solver = LU()
    if isinstance(solver, SolverState):
        vals = _matching_state(solver, A)
        x, info = apply_solve(solver, vals, b, x0, warn)
    elif isinstance(solver, Solver):
        state = solver.init(A)
        x, info = apply_solve(state, state.values, b, x0, warn)
    else:
        raise InputError(f"solver must be an asd.linalg solver object (LU(), CG(), ...), a state "
                         f"from solver.init(A) or a method string, got {type(solver).__name__}")
    return (x, info) if return_info else x

