"""SciPy's ``least_squares`` and ``minimize`` with exact sparse Jacobians and Hessians from asd.

The functions take and return numpy arrays (as SciPy does) and evaluate the PyTorch function in
float64 on the CPU; the prepared operators are built once, so each SciPy callback runs only the
compressed products and one gather.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.optimize as so
import torch

from ..errors import InputError
from ..operators import SparseJacobian
from ..scipy import csr, numpy_arguments


def _wrap(f: Callable, shape, dtype=torch.float64):
    def fn(z: np.ndarray, *args, **kwargs) -> torch.Tensor:
        return f(torch.as_tensor(z, dtype=dtype).reshape(shape), *args, **kwargs)
    return fn


def _scipy_args(args) -> tuple:
    """SciPy's ``args=``: a tuple of extra arguments, or a single one."""
    return args if isinstance(args, tuple) else (args,)


def _asd_computes(kwargs: dict, name: str, fun: str) -> None:
    if name in kwargs:
        raise InputError(f"{fun}: {name}= is what asd computes; leave it out (for your own {name}, call "
                         f"scipy.optimize.{fun.split('.')[-1]} directly)")


def least_squares(fun: Callable, x0, **kwargs) -> so.OptimizeResult:
    """``scipy.optimize.least_squares`` with ``jac`` given as an exact sparse Jacobian.

    ``fun`` is a PyTorch function of one tensor shaped like ``x0`` returning a tensor of residuals
    (``fun(x, *args, **kwargs)`` with SciPy's ``args=``/``kwargs=``, the Jacobian's extra arguments too).
    Keyword arguments go to SciPy, except ``asd_options`` (a dict for :class:`asd.SparseJacobian`).
    The default method is ``"trf"`` with ``tr_solver="lsmr"``, which uses the sparse Jacobian.
    """
    opts = kwargs.pop("asd_options", {})
    _asd_computes(kwargs, "jac", "asd.solvers.least_squares")
    if kwargs.get("method") == "lm":
        raise InputError("asd.solvers.least_squares: method='lm' (MINPACK) takes only dense Jacobians; use "
                         "method='trf' or 'dogbox' for asd's sparse one, or scipy.optimize.least_squares with "
                         "jac=asd.scipy.jac(fun, x0, dense=True)")
    x0 = torch.as_tensor(np.asarray(x0), dtype=torch.float64)
    if "args" in kwargs:
        kwargs["args"] = _scipy_args(kwargs["args"])
    _torch_arg = numpy_arguments()
    args = tuple(_torch_arg(a) for a in kwargs.get("args", ()))
    fkw = {k: _torch_arg(v) for k, v in (kwargs.get("kwargs", None) or {}).items()}
    g = _wrap(fun, x0.shape)
    J = SparseJacobian(lambda v, *a, **k: fun(v, *a, **k).reshape(-1), x0, args=args, kwargs=fkw, **opts)

    def residual(z, *a, **k):
        a, k = tuple(_torch_arg(v) for v in a), {n: _torch_arg(v) for n, v in k.items()}
        return g(z, *a, **k).detach().reshape(-1).numpy()

    def jac(z, *a, **k):
        a, k = tuple(_torch_arg(v) for v in a), {n: _torch_arg(v) for n, v in k.items()}
        return csr(J, J.values(torch.as_tensor(z, dtype=torch.float64).reshape(x0.shape), *a, **k))

    kwargs.setdefault("method", "trf")
    kwargs.setdefault("tr_solver", "lsmr")
    return so.least_squares(residual, x0.reshape(-1).numpy(), jac=jac, **kwargs)


#: methods of ``scipy.optimize.minimize`` by what they take besides the gradient
SPARSE_HESS_METHODS = ("trust-constr", "newton-cg")      # a scipy.sparse Hessian
HESSP_METHODS = ("trust-ncg", "trust-krylov")            # Hessian-vector products
DENSE_HESS_METHODS = ("trust-exact", "dogleg")           # factorize a dense Hessian
GRADIENT_FREE = ("nelder-mead", "powell", "cobyla", "cobyqa")
#: the largest n for which a dense Hessian is formed for DENSE_HESS_METHODS
MAX_DENSE_HESSIAN = 4000


def minimize(fun: Callable, x0, *, method: str = "trust-constr", **kwargs) -> so.OptimizeResult:
    """``scipy.optimize.minimize`` with the exact gradient and the sparse Hessian from asd.

    ``fun`` is a scalar PyTorch function of one tensor shaped like ``x0``. Each method gets what it
    takes: the gradient (``jac``) for every gradient-based method; the sparse Hessian for
    ``trust-constr`` and ``Newton-CG``; Hessian-vector products from the cached sparse Hessian for
    ``trust-ncg`` and ``trust-krylov``; a dense Hessian for ``trust-exact`` and ``dogleg`` (for
    ``n <= MAX_DENSE_HESSIAN``). Value and gradient come from one evaluation per point, the Hessian
    only when the method asks for it, once per point. SciPy's ``args=`` are ``fun``'s extra
    arguments (``fun(x, *args)``) for every callable. ``asd_options`` (a dict) goes to
    :class:`asd.SparseHessian`.
    """
    from .. import scipy as asd_scipy

    opts = kwargs.pop("asd_options", {})
    _asd_computes(kwargs, "jac", "asd.solvers.minimize")
    x0 = torch.as_tensor(np.asarray(x0), dtype=torch.float64)
    n = x0.numel()
    if "args" in kwargs:
        kwargs["args"] = _scipy_args(kwargs["args"])
    s = asd_scipy._Scalar(fun, x0, 0, kwargs.get("args", ()), torch.float64, "cpu", opts)
    name = method.lower() if isinstance(method, str) else ""
    if name in GRADIENT_FREE:  # the value alone: no gradient evaluated (f may not even be differentiable)
        return so.minimize(s.value, x0.reshape(-1).numpy(), method=method, **kwargs)
    if not isinstance(method, str):  # a custom method may ask for jac: value and gradient from one evaluation
        return so.minimize(s.value_and_grad, x0.reshape(-1).numpy(), method=method, jac=True, **kwargs)
    if name in SPARSE_HESS_METHODS:
        kwargs.setdefault("hess", s.hessian)
    elif name in HESSP_METHODS:
        kwargs.setdefault("hessp", s.hessp)
    elif name in DENSE_HESS_METHODS:
        if n > MAX_DENSE_HESSIAN:
            raise InputError(f"method={method!r} factorizes a dense Hessian, impractical for n={n}; use "
                             "'trust-krylov' (Hessian-vector products) or 'trust-constr' (sparse Hessian)")
        kwargs.setdefault("hess", lambda z, *a: s.kept_hessian(z, *a).toarray())
    # value and gradient in one callback: SciPy keeps the pair for its point, whatever f's state does
    return so.minimize(s.value_and_grad, x0.reshape(-1).numpy(), method=method, jac=True, **kwargs)
