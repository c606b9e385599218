"""IPOPT through cyipopt (optional: ``pip install cyipopt-wheels`` or ``cyipopt``).

:class:`IpoptProblem` supplies IPOPT with the objective gradient, the constraint Jacobian and the
Hessian of the Lagrangian in fixed sparse structures computed once by asd.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..errors import InputError
from ..operators import SparseHessian, SparseJacobian


def _cyipopt():
    try:
        import cyipopt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("asd.solvers.ipopt needs cyipopt: `pip install cyipopt-wheels` (bundles Ipopt) or "
                          "install Ipopt and `pip install cyipopt`") from exc
    return cyipopt


class IpoptProblem:
    """minimize f(x) subject to cl <= c(x) <= cu and lb <= x <= ub, with exact sparse derivatives.

    Parameters
    ----------
    f
        Scalar objective, a PyTorch function of a float64 vector.
    c
        Constraints, a PyTorch function of the same vector returning a vector.
    x0
        Starting point (1-D).
    """

    def __init__(self, f: Callable, c: Callable, x0, **options):
        x0 = torch.as_tensor(x0, dtype=torch.float64).reshape(-1)
        self.f, self.c, self.n = f, c, x0.numel()
        self.m = int(c(x0).numel())
        self.jac = SparseJacobian(lambda v: c(v).reshape(-1), x0, **options)
        # Lagrangian Hessian: the multipliers are read at call time from this holder
        self._sigma = torch.ones((), dtype=torch.float64)
        self._lam = torch.zeros(self.m, dtype=torch.float64)

        def lagrangian(v):
            return self._sigma * f(v) + (self._lam * c(v).reshape(-1)).sum()

        # structure of the Lagrangian: every multiplier structurally nonzero
        self._lam.fill_(1.0)
        self.hess = SparseHessian(lagrangian, x0, **options)
        self._lam.zero_()
        hc = self.hess.coloring
        rows = np.repeat(np.arange(self.n), np.diff(hc.indptr))
        self._lower = rows >= hc.indices  # IPOPT wants the lower triangle
        self._hrows, self._hcols = rows[self._lower], hc.indices[self._lower]
        jc = self.jac.coloring
        self._jrows = np.repeat(np.arange(self.m), np.diff(jc.indptr))
        self._jcols = jc.indices

    def _t(self, x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=torch.float64)

    # -- the cyipopt callback interface --------------------------------------------------------
    def objective(self, x):
        return float(self.f(self._t(x)))

    def gradient(self, x):
        return torch.func.grad(lambda v: self.f(v).reshape(()))(self._t(x)).numpy()

    def constraints(self, x):
        return self.c(self._t(x)).reshape(-1).detach().numpy()

    def jacobianstructure(self):
        return self._jrows, self._jcols

    def jacobian(self, x):
        return self.jac.values(self._t(x)).detach().numpy()

    def hessianstructure(self):
        return self._hrows, self._hcols

    def hessian(self, x, lagrange, obj_factor):
        self._lam.copy_(torch.as_tensor(np.asarray(lagrange), dtype=torch.float64))
        self._sigma.fill_(float(obj_factor))
        return self.hess.values(self._t(x)).detach().numpy()[self._lower]

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
