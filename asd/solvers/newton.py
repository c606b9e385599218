"""Newton's method for square nonlinear systems F(x) = 0 with exact sparse Jacobians and
:mod:`asd.linalg` solver objects for the steps."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import ConvergenceWarning, InputError
from ..linalg import LU, SingularMatrixError, Solver
from ..operators import SparseJacobian


@dataclass
class NewtonResult:
    """Outcome of :func:`newton`: solvers report, they don't throw."""

    x: torch.Tensor
    converged: bool
    iterations: int
    residual_norm: float
    history: list = field(default_factory=list)
    jacobian: SparseJacobian | None = None


def newton(f: Callable, x0: torch.Tensor, *, tol: float = 1e-10, maxiter: int = 50, damping: bool = True,
           solver: Solver | None = None, refactor_every: int = 1, **options) -> NewtonResult:
    """Solve ``f(x) = 0`` for a square system by Newton's method with sparse linear solves.

    Parameters
    ----------
    f
        Function of one tensor returning a tensor with as many elements as ``x0``.
    x0
        Starting point (its shape, dtype and device are kept).
    tol
        Stop when ``||f(x)||_inf <= tol``.
    maxiter
        Maximum number of Newton steps.
    damping
        Halve the step until the residual norm decreases (at most 30 halvings).
    solver
        An :mod:`asd.linalg` solver object for the Newton steps (default ``asd.linalg.LU()``);
        ``solver.init`` factorizes the Jacobian, ``solver.compute`` solves with it.
    refactor_every
        Evaluate and factorize the Jacobian every this many steps and reuse the factorization in
        between (the chord method; 1 is Newton's method).  A reused factorization whose step
        fails to reduce the residual is refreshed at once.
    **options
        Passed to :class:`asd.SparseJacobian` (``mode``, ``order``, ``compile``, ...).

    Returns
    -------
    NewtonResult
        Non-convergence gives ``converged=False`` and a :class:`asd.ConvergenceWarning`.
    """
    if isinstance(refactor_every, bool) or not isinstance(refactor_every, int) or refactor_every < 1:
        raise InputError(f"refactor_every must be a positive integer, got {refactor_every!r}")
    solver = LU() if solver is None else solver
    if not isinstance(solver, Solver):
        raise InputError(f"solver must be an asd.linalg solver object such as asd.linalg.LU(), got "
                         f"{type(solver).__name__}")
    x = x0.detach().clone()
    r = f(x).reshape(-1)
    if r.numel() != x.numel():
        raise InputError(f"newton needs a square system: f returned {r.numel()} values for {x.numel()} unknowns; "
                         "use asd.solvers.least_squares for over- or underdetermined systems")
    J = SparseJacobian(f, x, **options)
    norm = float(r.abs().max())
    history = [norm]
    it = 0
    state, age = None, 0
    while norm > tol and it < maxiter:
        it += 1
        fresh = state is None or age >= refactor_every
        try:
            with torch.no_grad():
                if fresh:
                    state, age = solver.init(J(x)), 0
                step, info = solver.compute(state, -r.detach(), warn=False)
        except SingularMatrixError as exc:
            warnings.warn(f"asd.newton: singular Jacobian at iteration {it} ({exc})", ConvergenceWarning, stacklevel=2)
            break
        age += 1
        if not info.converged:
            warnings.warn(f"asd.newton: the {info.solver} solve of step {it} stopped at residual "
                          f"{info.residual:.3e} > {info.tolerance:.3e}; the step is inexact", ConvergenceWarning,
                          stacklevel=2)
        dx = step.reshape(x.shape)
        t = 1.0
        for _ in range(30 if damping else 1):
            x_new = x + t * dx
            r_new = f(x_new).reshape(-1)
            new_norm = float(r_new.abs().max())
            if not damping or new_norm < norm:
                break
            t *= 0.5
        if not fresh and not new_norm < norm:
            state = None                       # stale factorization: refresh instead of stepping
            continue
        x, r, norm = x_new, r_new, new_norm
        history.append(norm)
    converged = norm <= tol
    if not converged:
        warnings.warn(f"asd.newton stopped after {it} iterations with ||f(x)||_inf = {norm:.3e} > tol = {tol:.1e}",
                      ConvergenceWarning, stacklevel=2)
    return NewtonResult(x, converged, it, norm, history, J)
