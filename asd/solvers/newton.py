"""Newton's method for square nonlinear systems F(x) = 0 with exact sparse Jacobians and
:mod:`asd.linalg` solver objects for the steps."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..errors import ConvergenceWarning, InputError
from ..linalg import LU, SingularMatrixError, Solver
from ..operators import SparseJacobian


@dataclass
class NewtonResult:
    """Outcome of :func:`newton`: solvers report, they don't throw.

    ``status`` is ``"converged"``, ``"maxiter"``, ``"stagnated"`` (no step reduces the residual:
    no solution nearby, or the tolerance is below what the precision can reach), ``"diverged"``
    (the residual became infinite or NaN, or ran away in undamped steps: :data:`DIVERGING_STEPS`)
    or ``"singular"`` (a singular Jacobian).
    """

    x: torch.Tensor
    converged: bool
    iterations: int
    residual_norm: float
    history: list = field(default_factory=list)
    jacobian: SparseJacobian | None = None
    status: str = "converged"
    tol: float = 0.0


#: an undamped iteration is declared divergent when the residual rose at each of the last
#: DIVERGING_STEPS steps and stands DIVERGING_FACTOR times above the smallest one seen (an iterate
#: running away, as for x^(1/3) from any x0); a climb that stays within the factor can still turn
#: and converge, and is left to run
DIVERGING_STEPS = 8
DIVERGING_FACTOR = 1e6


def default_tolerance(dtype: torch.dtype, scale: float = 1.0) -> float:
    """What the rounding of ``dtype`` lets a residual reach where ``f``'s terms are of size
    ``scale``: ``min(1e3 eps, sqrt(eps))`` times ``max(1, scale)``, and at least ``1e-10`` (the
    float64 default for terms of order one). :func:`newton` applies it to each equation, at the scale
    of that row's terms ``(|J| |x|)_i`` at the latest Jacobian: never the initial residual, whose size
    says nothing about how far from a root an iterate still is, nor another row's scale."""
    eps = float(torch.finfo(dtype).eps)
    return max(1e-10, min(1e3 * eps, math.sqrt(eps)) * max(1.0, scale))


def _row_tolerances(J: torch.Tensor, x: torch.Tensor, *, floor: bool = False) -> torch.Tensor | None:
    """:func:`default_tolerance` of each row of a sparse CSR ``J`` at ``x``: at the size of its terms
    ``(|J| |x|)_i``, or with ``floor=True`` at ``||J_i||_1 ||x||_inf`` (what rounding may leave of a row
    whose intermediates are as large as the largest unknown: the residual a stagnated iteration is
    accepted at); ``None`` where a scale is not finite (no scale to judge by)."""
    vals = J.values().detach().abs()
    crow, col = J.crow_indices(), J.col_indices()
    m = crow.numel() - 1
    rows = torch.repeat_interleave(torch.arange(m, device=crow.device), crow.diff())
    xa = x.detach().reshape(-1).abs().to(vals.dtype)
    if floor:
        big = float(xa.max()) if xa.numel() else 0.0
        scale = torch.zeros(m, dtype=vals.dtype, device=vals.device).index_add_(0, rows, vals) * big
    else:
        scale = torch.zeros(m, dtype=vals.dtype, device=vals.device).index_add_(0, rows, vals * xa[col])
    if not bool(torch.isfinite(scale).all()):
        return None
    eps = float(torch.finfo(x.dtype).eps)
    return (min(1e3 * eps, math.sqrt(eps)) * scale.clamp_min(1.0)).clamp_min(1e-10)


def newton(f: Callable, x0, *, tol: float | None = None, maxiter: int = 50, damping: bool = True,
           solver: Solver | None = None, refactor_every: int = 1, **options) -> NewtonResult:
    """Solve ``f(x) = 0`` for a square system by Newton's method with sparse linear solves.

    Parameters
    ----------
    f
        Function of one tensor returning a tensor with as many elements as ``x0``.
    x0
        Starting point: a tensor (its shape, dtype and device are kept), or a numpy array or list
        (float64 unless it is a float32 array).
    tol
        Stop when ``||f(x)||_inf <= tol``. Default: each equation within :func:`default_tolerance` of
        the dtype at the scale of its terms ``(|J| |x|)_i`` (the latest Jacobian, the current ``x``;
        ``1e-10`` in float64 for terms of order one); the default stops before ``maxiter`` only where
        the Newton step at ``x`` (a Jacobian taken there, solved to the solver's tolerance) is also
        within ``sqrt(eps) ||x||_inf``, and then takes that step where it lowers the residual: a
        residual that is small only because ``f``'s values are small for its units (``1e-12 * g(x)``)
        does not stop the iteration. It so evaluates one Jacobian more than the steps it takes. A
        run that reaches ``maxiter`` (a multiple root, an inexact solver) or stagnates (no damped
        step reduces the residual: an ill-conditioned Jacobian at its rounding floor) counts as
        converged on the residual, stagnation also with each row within the tolerance at
        ``||J_i||_1 ||x||_inf`` (its rounding floor where intermediates are as large as the largest
        unknown); a singular Jacobian where the residual is within tolerance (a double root) too;
        each only where the residual has also fallen to ``sqrt(eps)`` of the initial one (or to 0):
        a residual within the tolerance's floor only because ``f``'s values are small for its units
        (a run stopped after a step or two, at a singular Jacobian at ``x0``, or stalled by a solver
        that failed) is not a root. The result's ``tol`` is the tolerance of the row furthest from
        its own.
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
        Non-convergence gives ``converged=False``, a ``status`` saying why, and a
        :class:`asd.ConvergenceWarning`. Stagnation and divergence stop the iteration at once.
    """
    if isinstance(refactor_every, np.integer):
        refactor_every = int(refactor_every)
    if isinstance(maxiter, np.integer):
        maxiter = int(maxiter)
    if isinstance(refactor_every, bool) or not isinstance(refactor_every, int) or refactor_every < 1:
        raise InputError(f"refactor_every must be a positive integer, got {refactor_every!r}")
    solver = LU() if solver is None else solver
    if not isinstance(solver, Solver):
        raise InputError(f"solver must be an asd.linalg solver object such as asd.linalg.LU(), got "
                         f"{type(solver).__name__}")
    if not isinstance(x0, torch.Tensor):
        arr = np.asarray(x0)
        if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
            raise InputError(f"x0 must be a tensor, a numpy array or a list of numbers, got {type(x0).__name__}")
        x0 = torch.as_tensor(arr, dtype=torch.float32 if arr.dtype == np.float32 else torch.float64)
    if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 0:
        raise InputError(f"maxiter must be a non-negative integer, got {maxiter!r}")
    x = x0.detach().clone()
    r = f(x).reshape(-1)
    if r.numel() != x.numel():
        raise InputError(f"newton needs a square system: f returned {r.numel()} values for {x.numel()} unknowns; "
                         "use asd.solvers.least_squares for over- or underdetermined systems")
    J = SparseJacobian(f, x, **options)
    norm = float(r.abs().max()) if r.numel() else 0.0
    auto_tol = tol is None
    Jk = None  # the latest Jacobian, whose rows scale the default's per-row tolerances

    def within(r: torch.Tensor, norm: float, x: torch.Tensor, floor: bool = False) -> bool:
        """Whether the residual ``r`` at ``x`` is within tolerance: ``tol``, or by default each row
        within its own at ``x`` (``floor``: the looser one a stagnated iteration is accepted at)."""
        nonlocal tol
        rows = _row_tolerances(Jk, x, floor=floor) if auto_tol and Jk is not None else None
        if rows is None:
            return norm <= tol
        worst = int(torch.argmax(r.detach().abs().reshape(-1) / rows)) if rows.numel() else 0
        tol = float(rows[worst]) if rows.numel() else tol  # the tolerance of the row furthest from its own
        return bool((r.detach().abs().reshape(-1) <= rows).all())

    if auto_tol:
        tol = default_tolerance(x.dtype)
    elif not isinstance(tol, (int, float)) or isinstance(tol, bool) or not tol >= 0:
        raise InputError(f"tol must be a non-negative number, got {tol!r}")
    eps = float(torch.finfo(x.dtype).eps) if x.is_floating_point() else 2.0 ** -52

    def small_step(dx: torch.Tensor, x: torch.Tensor) -> bool:
        """The default's test for stopping early: Newton's step from ``x`` within ``sqrt(eps)
        ||x||_inf`` (no scaling of ``f`` changes it; at ``x = 0`` only a zero step passes). A residual
        within tolerance alone says nothing where ``f``'s values are small for its units
        (``1e-12 * g(x)``)."""
        if not dx.numel():
            return True
        return bool(float(dx.detach().abs().max()) <= math.sqrt(eps) * float(x.detach().abs().max()))

    history = [norm]

    def fell(norm: float) -> bool:
        """Whether the residual fell to ``sqrt(eps)`` of the initial one, or to 0: what a point the
        default accepts without the step test (at ``maxiter``, stagnated, at a singular Jacobian)
        must show besides a residual within tolerance, whose floor says nothing where ``f``'s values
        are small for its units."""
        return norm == 0.0 or norm <= math.sqrt(eps) * history[0]

    it = 0
    state, age = None, 0
    status = "maxiter" if math.isfinite(norm) else "diverged"  # f(x0) not finite: nothing to iterate from
    runaway = False  # diverged by a steady climb of the residual, not to infinity
    stepped = False  # converged by the default's two tests (the residual and the step at x)
    residual_only = False  # converged by the residual where no step can be taken (a singular Jacobian)
    while status != "diverged":
        # an explicit tol: the residual alone; the default also takes the Newton step at x, so a point
        # is judged by a Jacobian taken there
        if not auto_tol and (within(r, norm, x) or it >= maxiter):
            break
        fresh = state is None or age >= refactor_every
        try:
            with torch.no_grad():
                if fresh:
                    Jx = J(x)
                    state, age = solver.init(Jx), 0
                    Jk = Jx
                step, info = solver.compute(state, -r.detach(), warn=False)
        except SingularMatrixError as exc:
            if auto_tol and within(r, norm, x) and fell(norm):  # no step to judge by: the residual (a double root)
                residual_only = True
                break
            warnings.warn(f"asd.newton: singular Jacobian at iteration {it + 1} ({exc})", ConvergenceWarning,
                          stacklevel=2)
            status = "singular"
            break
        dx = step.reshape(x.shape)
        if auto_tol and info.converged and within(r, norm, x) and small_step(dx, x):
            # the step is taken as well where it does not raise the residual: its Jacobian and solve
            # are paid, and it leaves x far closer than the sqrt(eps) its size was judged by
            if it < maxiter and bool((dx != 0).any()):
                x_new = x + dx
                r_new = f(x_new).reshape(-1)
                new_norm = float(r_new.abs().max())
                if new_norm < norm:
                    it += 1
                    x, r, norm = x_new, r_new, new_norm
                    history.append(norm)
            stepped = True
            break
        if auto_tol and it >= maxiter:
            break
        it += 1
        age += 1
        if not info.converged:
            warnings.warn(f"asd.newton: the {info.solver} solve of step {it} stopped at residual "
                          f"{info.residual:.3e} > {info.tolerance:.3e}; the step is inexact", ConvergenceWarning,
                          stacklevel=2)
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
        if not math.isfinite(new_norm):
            status, runaway = "diverged", False
            break
        if damping and not new_norm < norm:
            status = "stagnated"               # no step along the Newton direction reduces the residual
            break
        x, r, norm = x_new, r_new, new_norm
        history.append(norm)
        recent = history[-DIVERGING_STEPS - 1:]
        if (len(recent) > DIVERGING_STEPS and all(b > a for a, b in zip(recent, recent[1:]))
                and norm > DIVERGING_FACTOR * min(history)):
            status, runaway = "diverged", True
            break
    # the default stops early only on both tests; a run that ends at maxiter or stagnates (an
    # ill-conditioned Jacobian, a multiple root, an inexact linear solve) is judged by the residual
    judged = not auto_tol or fell(norm)  # an explicit tol: the residual alone
    converged = stepped or residual_only or (judged and status in ("maxiter", "stagnated") and within(r, norm, x)) or (
        judged and status == "stagnated" and auto_tol and within(r, norm, x, floor=True))
    if converged:
        status = "converged"
    else:
        why = {"maxiter": f"after {it} iterations",
               "stagnated": f"at iteration {it}: no damped step reduces the residual (no solution nearby, or "
                            f"tol={tol:.1e} is below what {x.dtype} can reach)",
               "diverged": ("before the first step: f(x0) is not finite" if not it else
                            f"at iteration {it}: the residual grew at each of the last {DIVERGING_STEPS} steps, "
                            f"to {DIVERGING_FACTOR:.0e} times its smallest value"
                            if runaway else f"at iteration {it}: the residual is no longer finite"),
               "singular": f"at iteration {it}: singular Jacobian"}[status]
        if status in ("maxiter", "stagnated") and not judged and within(r, norm, x, floor=status == "stagnated"):
            said = (f"||f(x)||_inf = {norm:.3e}, within tol = {tol:.1e} but only {norm / history[0]:.1e} of the "
                    f"initial residual {history[0]:.3e}, and no small Newton step confirms a root: f's values may be "
                    "small for its units rather than x near a root (scale f, or pass tol=)")
        else:
            said = f"||f(x)||_inf = {norm:.3e} > tol = {tol:.1e}"
        warnings.warn(f"asd.newton stopped {why} with {said}", ConvergenceWarning, stacklevel=2)
    return NewtonResult(x, converged, it, norm, history, J, status, tol)
