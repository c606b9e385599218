"""IPOPT through cyipopt (optional: ``pip install cyipopt-wheels`` or ``cyipopt``).

:class:`IpoptProblem` supplies IPOPT with the objective gradient, the constraint Jacobian and the
Hessian of the Lagrangian in fixed sparse structures computed once by asd.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..cache import state_fingerprint
from ..checks import checks_forced
from ..errors import InputError
from ..operators import SparseHessian, SparseJacobian


def _cyipopt():
    try:
        import cyipopt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("asd.solvers.ipopt needs cyipopt: `pip install cyipopt-wheels` (bundles Ipopt) or "
                          "install Ipopt and `pip install cyipopt`") from exc
    return cyipopt


#: options that only one of the two operators takes, routed to it when given to IpoptProblem
_JACOBIAN_ONLY = ("mode",)
_HESSIAN_ONLY = ("hvp",)
#: options whose meaning differs between the operators: they must be given per operator
_PER_OPERATOR = ("coloring", "pattern", "backend", "args", "kwargs")


class IpoptProblem:
    """minimize f(x) subject to cl <= c(x) <= cu and lb <= x <= ub, with exact sparse derivatives.

    Parameters
    ----------
    f
        Scalar objective, a PyTorch function of a float64 vector.
    c
        Constraints, a PyTorch function of the same vector returning a vector, or ``None`` for a
        problem with bounds only.
    x0
        Starting point (1-D); fixes the structures.
    jacobian_options, hessian_options
        Options of the constraint Jacobian (:class:`asd.SparseJacobian`) and of the Lagrangian
        Hessian (:class:`asd.SparseHessian`), e.g. ``coloring=``, ``pattern=``, ``compile=True``.
    **options
        Options for both operators (``order``, ``batch_size``, ``compile``, ``strict``, ``check``);
        ``mode`` goes to the Jacobian and ``hvp`` to the Hessian. ``coloring`` and ``pattern`` mean
        different things for the two and must be given in ``jacobian_options``/``hessian_options``.
    """

    def __init__(self, f: Callable, c: Callable | None, x0, *, jacobian_options: dict | None = None,
                 hessian_options: dict | None = None, **options):
        for name in _PER_OPERATOR:
            if name in options:
                raise InputError(f"{name}= means different things for the constraint Jacobian and the Lagrangian "
                                 f"Hessian: pass it in jacobian_options={{{name!r}: ...}} or "
                                 f"hessian_options={{{name!r}: ...}}")
        jac_opts = {k: v for k, v in options.items() if k not in _HESSIAN_ONLY}
        hess_opts = {k: v for k, v in options.items() if k not in _JACOBIAN_ONLY}
        jac_opts.update(jacobian_options or {})
        hess_opts.update(hessian_options or {})
        x0 = torch.as_tensor(np.asarray(x0), dtype=torch.float64).reshape(-1)
        self.f, self.c, self.n = f, c, x0.numel()
        self.m = 0 if c is None else int(c(x0).numel())
        self.jac = None if c is None else SparseJacobian(lambda v: c(v).reshape(-1), x0, **jac_opts)

        def lagrangian(v, sigma, lam):
            value = sigma * f(v).reshape(())
            return value if c is None else value + (lam * c(v).reshape(-1)).sum()

        # the structure of the Lagrangian: every multiplier structurally nonzero
        self.hess = SparseHessian(lagrangian, x0, args=(1.0, torch.ones(self.m, dtype=torch.float64)), **hess_opts)
        # the multipliers enter linearly, by the construction above: their values never change the
        # pattern, so the calls with IPOPT's multipliers need no probe for them
        self.hess._trust_arg_values = not checks_forced()
        P = self.hess.coloring.pattern
        lower = np.nonzero(P.rows >= P.indices)[0]  # IPOPT wants the lower triangle
        self._lower = torch.from_numpy(lower)
        self._hrows, self._hcols = P.rows[lower], P.indices[lower]
        if self.jac is not None:
            J = self.jac.coloring.pattern
            self._jrows, self._jcols = J.rows, J.indices
        else:
            self._jrows = self._jcols = np.zeros(0, dtype=np.int64)
        self._at = None  # (x bytes, value, gradient) of the last objective evaluation

    @staticmethod
    def _t(x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x, dtype=np.float64))

    def _value_grad(self, x):
        """``(key, value, gradient)`` at ``x``, kept for the next call while ``x`` and ``f``'s state
        (:func:`asd.cache.state_fingerprint`) are the same; evaluated anew at every call where that
        state cannot be summarized whole."""
        state, complete = state_fingerprint(self.f)
        key = (np.asarray(x, dtype=np.float64).tobytes(), state) if complete else None  # None: never reused
        if key is None or self._at is None or self._at[0] != key:
            grad, value = torch.func.grad_and_value(lambda v: self.f(v).reshape(()))(self._t(x))
            self._at = (key, float(value), grad.detach().numpy())
        return self._at

    # -- the cyipopt callback interface --------------------------------------------------------
    def objective(self, x):
        return self._value_grad(x)[1]

    def gradient(self, x):
        return self._value_grad(x)[2].copy()  # the caller's own: an edit must not change a later call

    def constraints(self, x):
        if self.c is None:
            return np.zeros(0)
        return self.c(self._t(x)).reshape(-1).detach().numpy()

    def jacobianstructure(self):
        return self._jrows, self._jcols

    def jacobian(self, x):
        if self.jac is None:
            return np.zeros(0)
        return self.jac.values(self._t(x)).detach().numpy()

    def hessianstructure(self):
        return self._hrows, self._hcols

    def hessian(self, x, lagrange, obj_factor):
        lam = torch.as_tensor(np.asarray(lagrange, dtype=np.float64))
        values = self.hess.values(self._t(x), float(obj_factor), lam)
        return values.detach().index_select(0, self._lower).numpy()

    def solve(self, x0, lb=None, ub=None, cl=None, cu=None, **ipopt_options):
        """Run IPOPT; returns ``(x, info)`` as cyipopt does."""
        cyipopt = _cyipopt()
        inf = 2e19
        lb = np.full(self.n, -inf) if lb is None else np.asarray(lb, dtype=float)
        ub = np.full(self.n, inf) if ub is None else np.asarray(ub, dtype=float)
        cl = np.zeros(self.m) if cl is None else np.asarray(cl, dtype=float)
        cu = np.zeros(self.m) if cu is None else np.asarray(cu, dtype=float)
        if len(lb) != self.n or len(ub) != self.n or len(cl) != self.m or len(cu) != self.m:
            raise InputError(f"bounds must have n={self.n} (lb, ub) and m={self.m} (cl, cu) entries")
        problem = cyipopt.Problem(n=self.n, m=self.m, problem_obj=self, lb=lb, ub=ub, cl=cl, cu=cu)
        for key, value in ipopt_options.items():
            problem.add_option(key, value)
        return problem.solve(np.asarray(x0, dtype=float).reshape(-1))
