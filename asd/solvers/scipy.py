"""SciPy's ``least_squares`` and ``minimize`` with exact sparse Jacobians and Hessians from asd.

The functions take and return numpy arrays (as SciPy does) and evaluate the PyTorch function in
float64 on the CPU; the prepared operators are built once, so each SciPy callback runs only the
compressed products and one gather.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.optimize as so
import scipy.sparse as sp
import torch

from ..operators import SparseHessian, SparseJacobian


def _wrap(f: Callable, shape, dtype=torch.float64):
    def fn(z: np.ndarray) -> torch.Tensor:
        return f(torch.as_tensor(z, dtype=dtype).reshape(shape))
    return fn


def _csr(op, values: torch.Tensor) -> sp.csr_array:
    """Values in the operator's CSR order (its coloring's canonical pattern) as a SciPy matrix."""
    c = op.coloring
    return sp.csr_array((values.detach().cpu().numpy(), c.indices, c.indptr), shape=tuple(c.shape))


def least_squares(fun: Callable, x0, **kwargs) -> so.OptimizeResult:
    """``scipy.optimize.least_squares`` with ``jac`` given as an exact sparse Jacobian.

    ``fun`` is a PyTorch function of one tensor shaped like ``x0`` returning a tensor of residuals.
    Keyword arguments go to SciPy, except ``asd_options`` (a dict for :class:`asd.SparseJacobian`).
    The default method is ``"trf"`` with ``tr_solver="lsmr"``, which uses the sparse Jacobian.
    """
    opts = kwargs.pop("asd_options", {})
    x0 = torch.as_tensor(x0, dtype=torch.float64)
    g = _wrap(fun, x0.shape)
    J = SparseJacobian(lambda v: fun(v).reshape(-1), x0, **opts)

    def residual(z):
        return g(z).detach().reshape(-1).numpy()

    def jac(z):
        return _csr(J, J.values(torch.as_tensor(z, dtype=torch.float64).reshape(x0.shape)))

    kwargs.setdefault("method", "trf")
    kwargs.setdefault("tr_solver", "lsmr")
    return so.least_squares(residual, x0.reshape(-1).numpy(), jac=jac, **kwargs)


def minimize(fun: Callable, x0, *, method: str = "trust-constr", **kwargs) -> so.OptimizeResult:
    """``scipy.optimize.minimize`` with the exact gradient and sparse Hessian from asd.

    ``fun`` is a scalar PyTorch function of one tensor shaped like ``x0``. The gradient and the
    Hessian come from one prepared :class:`asd.SparseHessian`; methods that take ``hess``
    (``"trust-constr"``, ``"Newton-CG"``, ``"trust-krylov"``, ...) receive the sparse Hessian.
    ``asd_options`` (a dict) goes to :class:`asd.SparseHessian`.
    """
    opts = kwargs.pop("asd_options", {})
    x0 = torch.as_tensor(x0, dtype=torch.float64)
    H = SparseHessian(fun, x0, **opts)
    cache: dict = {}

    def evaluate(z):
        key = z.tobytes()
        if cache.get("key") != key:
            value, grad, hess = H.value_grad_hessian(torch.as_tensor(z, dtype=torch.float64).reshape(x0.shape))
            cache.update(key=key, value=float(value), grad=grad.detach().reshape(-1).numpy(),
                         hess=_csr(H, hess.values()))
        return cache

    def f(z):
        return evaluate(z)["value"]

    def jac(z):
        return evaluate(z)["grad"]

    def hess(z):
        return evaluate(z)["hess"]

    takes_hess = method.lower() in ("trust-constr", "newton-cg", "trust-krylov", "trust-exact", "trust-ncg", "dogleg")
    if takes_hess:
        kwargs.setdefault("hess", hess)
    return so.minimize(f, x0.reshape(-1).numpy(), jac=jac, method=method, **kwargs)
