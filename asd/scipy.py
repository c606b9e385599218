"""SciPy interop: asd derivatives as the callables SciPy's solvers take.

Each factory prepares one operator for a PyTorch function and returns a plain callable that
accepts numpy arrays and returns what SciPy expects (``scipy.sparse.csr_array`` Jacobians and
Hessians, numpy gradients and Hessian-vector products)::

    jac = asd.scipy.jac(F, y0, argnum=1)            # F(t, y), for solve_ivp(fun, ..., jac=jac)
    sol = solve_ivp(asd.scipy.fun(F, argnum=1), (0, 1), y0, method="BDF", jac=jac)
    least_squares(asd.scipy.fun(r), x0, jac=asd.scipy.jac(r, x0))
    minimize(asd.scipy.fun(f), x0, jac=asd.scipy.grad(f, x0), hess=asd.scipy.hess(f, x0), method="trust-constr")
    minimize(asd.scipy.fun(f), x0, jac=asd.scipy.grad(f, x0), hessp=asd.scipy.hessp(f, x0), method="trust-krylov")
    root(asd.scipy.fun(F), x0, jac=asd.scipy.jac(F, x0, dense=True))   # MINPACK takes dense Jacobians

``argnum`` says which argument of ``f`` is differentiated (``solve_ivp`` calls ``jac(t, y)``:
``argnum=1``); the other arguments are passed through unchanged (numpy scalars and arrays are
turned into tensors of the variable's dtype). The function is evaluated in float64 on the CPU
unless ``dtype``/``device`` say otherwise.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from .cache import state_fingerprint
from .operators import SparseHessian, SparseJacobian
from .options import check_bool

__all__ = ["fun", "jac", "grad", "hess", "hessp", "csr"]


def csr(op, values: torch.Tensor) -> sp.csr_array:
    """An operator's values (CSR order of its pattern) as a ``scipy.sparse.csr_array``."""
    P = op.coloring.pattern
    return sp.csr_array((values.detach().cpu().numpy(), P.indices.copy(), P.indptr.copy()), shape=P.shape)


def _layout(a: np.ndarray) -> tuple:
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype


def numpy_arguments(device="cpu") -> Callable:
    """A converter of SciPy's extra arguments to what a PyTorch ``f`` takes: a numpy array as a
    tensor on ``device``, a numpy float as a float, anything else as it is. A tensor that shares the
    array's memory (on the CPU) is the same tensor for the same array at every call: an operator then
    sees the same arguments, not new ones to check, and an in-place change of the array reaches it.
    A copy (another device) is made anew at each call, so that it never holds old values."""
    seen: dict = {}

    def convert(a):
        if isinstance(a, np.ndarray):
            hit = seen.get(id(a))
            # the array is kept (its id is not reused meanwhile); what it stands for is checked: its
            # memory, shape, strides and dtype can change in place (a.shape = ..., a.dtype = ...)
            if hit is not None and hit[0] is a and hit[2] == _layout(a):
                return hit[1]
            t = torch.as_tensor(a, device=device)
            if t.device.type == "cpu" and np.may_share_memory(a, t.numpy()):
                seen[id(a)] = (a, t, _layout(a))
            return t
        return float(a) if isinstance(a, np.floating) else a
    return convert


class _Adapter:
    """Calls ``f`` with the differentiated argument at ``argnum`` and the others as given."""

    def __init__(self, f: Callable, argnum: int, shape, dtype, device):
        if not isinstance(argnum, int) or isinstance(argnum, bool) or argnum < 0:
            raise TypeError(f"argnum must be a non-negative int (the position of the variable), got {argnum!r}")
        self.f, self.argnum, self.shape, self.dtype, self.device = f, argnum, tuple(shape), dtype, device
        self.other = numpy_arguments(device)

    def tensor(self, z) -> torch.Tensor:
        return torch.as_tensor(np.asarray(z), dtype=self.dtype, device=self.device).reshape(self.shape)

    def split(self, call_args: tuple):
        if len(call_args) <= self.argnum:
            raise TypeError(f"expected at least {self.argnum + 1} positional arguments (the variable at argnum="
                            f"{self.argnum}), got {len(call_args)}")
        z = call_args[self.argnum]
        others = tuple(self.other(a) for i, a in enumerate(call_args) if i != self.argnum)
        return z, others

    def of_variable(self, z: torch.Tensor, *others):
        k = self.argnum
        return self.f(*others[:k], z, *others[k:])


def _example(x0, dtype, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x0), dtype=dtype, device=device)


def fun(f: Callable, *, argnum: int = 0, dtype=torch.float64, device="cpu") -> Callable:
    """``f`` (a PyTorch function) as a numpy function: ``fun(*args) -> np.ndarray`` (a float for a
    0-d output), with the variable at ``argnum``."""
    ad = _Adapter(f, argnum, (-1,), dtype, device)

    def numpy_f(*args):
        z, others = ad.split(args)
        out = ad.of_variable(torch.as_tensor(np.asarray(z), dtype=dtype, device=device), *others)
        out = out.detach().cpu().numpy()
        return float(out) if out.ndim == 0 else out
    return numpy_f


def jac(f: Callable, x0, *, argnum: int = 0, args: tuple = (), dtype=torch.float64, device="cpu",
        dense: bool = False, **options) -> Callable:
    """A Jacobian callable for SciPy: ``jac(*call_args) -> scipy.sparse.csr_array`` of ``f`` with
    respect to the argument at ``argnum`` (shaped like ``x0``). ``args`` are example values of the
    other arguments, used to detect the pattern (default: ``0.0`` for each argument before
    ``argnum``, such as ``solve_ivp``'s ``t``; a function with other extra arguments needs examples
    of them here); at call time SciPy passes the actual ones. ``dense=True`` returns the same Jacobian as a dense numpy
    array, for the solvers that take no sparse one (``root``'s MINPACK methods ``hybr`` and ``lm``,
    ``solve_ivp``'s ``LSODA``); it is still computed sparsely. ``options`` go to
    :class:`asd.SparseJacobian`."""
    check_bool("dense", dense)
    x = _example(x0, dtype, device)
    ad = _Adapter(f, argnum, x.shape, dtype, device)
    others = tuple(ad.other(a) for a in args) if args else ((0.0,) * argnum)
    op = SparseJacobian(lambda z, *o: ad.of_variable(z, *o).reshape(-1), x, args=others, **options)

    def jacobian(*call_args):
        z, o = ad.split(call_args)
        J = csr(op, op.values(ad.tensor(z), *o))
        return J.toarray() if dense else J
    jacobian.operator = op
    return jacobian


class _Unkeyable(Exception):
    """An extra argument whose value cannot be compared by content (results are then not reused)."""


def _tensor_key(t: torch.Tensor) -> tuple:
    t = t.detach()
    if t.layout == torch.sparse_coo:
        return ("coo", tuple(t.shape), _tensor_key(t._indices()), _tensor_key(t._values()))
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return (str(t.layout), tuple(t.shape), _tensor_key(t.crow_indices()), _tensor_key(t.col_indices()),
                _tensor_key(t.values()))
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return (str(t.layout), tuple(t.shape), _tensor_key(t.ccol_indices()), _tensor_key(t.row_indices()),
                _tensor_key(t.values()))
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.cpu().resolve_conj().resolve_neg()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.to(torch.float32)
    return ("tensor", str(t.dtype), tuple(t.shape), t.contiguous().numpy().tobytes())


def _key_of(a):
    """What identifies an extra argument's value, by content all the way down (``repr`` abbreviates
    large arrays and shows plain objects by identity); :class:`_Unkeyable` for anything else."""
    if a is None or isinstance(a, (bool, int, str, bytes)):
        return (type(a).__name__, a)
    if isinstance(a, (float, complex)):
        return (type(a).__name__, repr(a))  # -0.0 is not 0.0
    if isinstance(a, np.generic):
        return ("np", str(a.dtype), a.tobytes())
    if isinstance(a, np.ndarray) and a.dtype != object:
        return ("ndarray", str(a.dtype), a.shape, np.ascontiguousarray(a).tobytes())
    if isinstance(a, torch.Tensor):
        return _tensor_key(a)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__,) + tuple(_key_of(v) for v in a)
    if isinstance(a, dict):
        return ("dict",) + tuple((_key_of(k), _key_of(v)) for k, v in a.items())
    raise _Unkeyable(type(a).__name__)


class _Scalar:
    """Value and gradient of a scalar ``f`` at the last ``x`` they were asked at, and its Hessian at
    the last ``x`` it was asked at, each computed once and only when asked for (L-BFGS-B never pays
    for a Hessian). The two are kept apart: a trust-region method that evaluates ``f`` at a trial
    point and rejects it asks for the Hessian at the old point again, which is still there. A kept
    result answers only while ``x``, the extra arguments and ``f``'s state are the same."""

    def __init__(self, f: Callable, x0, argnum: int, args: tuple, dtype, device, options: dict):
        x = _example(x0, dtype, device)
        self.ad = _Adapter(f, argnum, x.shape, dtype, device)
        self.others0 = tuple(self.ad.other(a) for a in args)
        self.x0, self.options, self._op = x, options, None
        self._vg = self._hess = None  # (key, value, gradient), (key, Hessian)

    @property
    def op(self) -> SparseHessian:
        if self._op is None:
            # f is the adapter's method, not a closure over this object: the operator it keeps would
            # close a reference cycle (kept until the garbage collector runs)
            self._op = SparseHessian(self.ad.of_variable, self.x0, args=self.others0, **self.options)
        return self._op

    def _at(self, call_args):
        """``(key, x, others)``; ``key`` is ``None`` (nothing reused) when an argument cannot be
        compared by content, or when ``f``'s state cannot be summarized whole
        (:func:`asd.cache.state_fingerprint`: the version counters, storages and contents of the
        tensors ``f`` reads, which a solver's caller may change between two solves; a tensor too
        large to read at every call, an object of the user's own class: then every callback
        evaluates anew, and ``hessp`` by exact Hessian-vector products)."""
        z, others = self.ad.split(call_args) if call_args else (None, ())
        state, complete = state_fingerprint(self.ad.f)
        try:
            key = (_key_of(np.asarray(z)), tuple(_key_of(a) for a in others), state) if complete else None
        except _Unkeyable:
            key = None
        return key, self.ad.tensor(z), others or self.others0

    def value(self, *call_args) -> float:
        """``f``'s value alone (for the gradient-free methods): the kept one at the same point, else
        ``f`` evaluated without its gradient."""
        key, x, others = self._at(call_args)
        if key is not None and self._vg is not None and self._vg[0] == key:
            return self._vg[1]
        return float(self.ad.of_variable(x, *others).detach().reshape(()))

    def value_and_grad(self, *call_args):
        key, x, others = self._at(call_args)
        if key is None or self._vg is None or self._vg[0] != key:
            g = lambda v: self.ad.of_variable(v, *others).reshape(())  # noqa: E731
            grad, value = torch.func.grad_and_value(g)(x)
            self._vg = (key, float(value), grad.detach().reshape(-1).cpu().numpy())
        # a copy: a caller (or an optimizer) that edits the array it was handed must not change
        # what a later call at the same point returns
        return self._vg[1], self._vg[2].copy()

    def hessian(self, *call_args) -> sp.csr_array:
        """The Hessian at ``call_args``, a matrix of the caller's own (see :meth:`value_and_grad`)."""
        return self.kept_hessian(*call_args).copy()

    def hessp(self, z, p, *others):
        """The Hessian at ``(z, *others)`` times ``p``: one sparse product with the Hessian kept for
        that point (made once per point); where only ``f``'s state moved since it was made (a counter
        ``f`` keeps), one exact Hessian-vector product instead of a new sparse Hessian per ``p``."""
        call_args = others[:self.ad.argnum] + (z,) + others[self.ad.argnum:]
        key, x, rest = self._at(call_args)
        p = np.asarray(p, dtype=float).reshape(-1)
        kept = self._hess
        if key is None or (kept is not None and kept[0] != key and kept[0] is not None and kept[0][:2] == key[:2]):
            v = torch.as_tensor(p, dtype=x.dtype, device=x.device).reshape(x.shape)
            xr = x.detach().clone().requires_grad_(True)
            with torch.enable_grad():
                (g,) = torch.autograd.grad(self.ad.of_variable(xr, *rest).reshape(()), xr, create_graph=True)
                # a gradient that does not depend on x (f linear there) has a zero Hessian
                hv = torch.autograd.grad(g, xr, grad_outputs=v)[0] if g.requires_grad else torch.zeros_like(xr)
            hv = hv.detach().reshape(-1).cpu().numpy().astype(np.float64)
            if np.isfinite(hv).all():  # (double backward gives NaN where the sparse Hessian's products are finite)
                return hv
        return self.kept_hessian(*call_args) @ p

    def kept_hessian(self, *call_args) -> sp.csr_array:
        """The Hessian at ``call_args`` as kept for the next call: for products only, never handed out."""
        key, x, others = self._at(call_args)
        if key is None or self._hess is None or self._hess[0] != key:
            self._hess = (key, csr(self.op, self.op.values(x, *others)))
        return self._hess[1]


def grad(f: Callable, x0, *, argnum: int = 0, args: tuple = (), dtype=torch.float64, device="cpu") -> Callable:
    """``grad(*call_args) -> np.ndarray``: the gradient of the scalar ``f`` (``jac=`` of ``minimize``)."""
    s = _Scalar(f, x0, argnum, args, dtype, device, {})
    return lambda *a: s.value_and_grad(*a)[1]


def hess(f: Callable, x0, *, argnum: int = 0, args: tuple = (), dtype=torch.float64, device="cpu",
         **options) -> Callable:
    """``hess(*call_args) -> scipy.sparse.csr_array``: the sparse Hessian of the scalar ``f``."""
    s = _Scalar(f, x0, argnum, args, dtype, device, options)
    return s.hessian


def hessp(f: Callable, x0, *, argnum: int = 0, args: tuple = (), dtype=torch.float64, device="cpu",
          **options) -> Callable:
    """``hessp(x, p, *args) -> np.ndarray``: the Hessian times ``p`` from the sparse Hessian at ``x``
    (computed once per ``x``, then one sparse product per ``p``; where ``f``'s state cannot be
    summarized whole, one exact Hessian-vector product per call instead)."""
    s = _Scalar(f, x0, argnum, args, dtype, device, options)

    def product(*call_args):
        if len(call_args) < 2:
            raise TypeError("hessp is called as hessp(x, p, *args)")
        rest = call_args[:argnum] + call_args[argnum + 2:]
        return s.hessp(call_args[argnum], call_args[argnum + 1], *rest)
    return product
