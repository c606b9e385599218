"""Newton's method for square nonlinear systems F(x) = 0 with exact sparse Jacobians."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from ..errors import ConvergenceWarning, InputError
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
           **options) -> NewtonResult:
    """Solve ``f(x) = 0`` for a square system by Newton's method with sparse LU steps.

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
    **options
        Passed to :class:`asd.SparseJacobian` (``mode``, ``order``, ``compile``, ...).

    Returns
    -------
    NewtonResult
        Non-convergence gives ``converged=False`` and a :class:`asd.ConvergenceWarning`.
    """
    x = x0.detach().clone()
    r = f(x).reshape(-1)
    if r.numel() != x.numel():
        raise InputError(f"newton needs a square system: f returned {r.numel()} values for {x.numel()} unknowns; "
                         "use asd.solvers.least_squares for over- or underdetermined systems")
    J = SparseJacobian(f, x, **options)
    c = J.coloring  # values come in the canonical CSR order of its pattern
    norm = float(r.abs().max())
    history = [norm]
    it = 0
    while norm > tol and it < maxiter:
        it += 1
        vals = J.values(x).detach().cpu().numpy()
        A = sp.csc_array(sp.csr_array((vals, c.indices, c.indptr), shape=tuple(c.shape)))
        try:
            step = spla.spsolve(A, -r.detach().cpu().numpy())
        except RuntimeError as exc:  # singular factor
            warnings.warn(f"asd.newton: singular Jacobian at iteration {it} ({exc})", ConvergenceWarning, stacklevel=2)
            break
        if not np.all(np.isfinite(step)):
            warnings.warn(f"asd.newton: singular Jacobian at iteration {it}", ConvergenceWarning, stacklevel=2)
            break
        dx = torch.as_tensor(step, dtype=x.dtype, device=x.device).reshape(x.shape)
        t = 1.0
        for _ in range(30 if damping else 1):
            x_new = x + t * dx
            r_new = f(x_new).reshape(-1)
            new_norm = float(r_new.abs().max())
            if not damping or new_norm < norm:
                break
            t *= 0.5
        x, r, norm = x_new, r_new, new_norm
        history.append(norm)
    converged = norm <= tol
    if not converged:
        warnings.warn(f"asd.newton stopped after {it} iterations with ||f(x)||_inf = {norm:.3e} > tol = {tol:.1e}",
                      ConvergenceWarning, stacklevel=2)
    return NewtonResult(x, converged, it, norm, history, J)
