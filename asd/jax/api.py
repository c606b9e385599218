"""One-call entry points of :mod:`asd.jax`."""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from .operators import SparseHessian, SparseJacobian


def prepare_jacobian(f: Callable, x, **options) -> SparseJacobian:
    """A prepared :class:`~asd.jax.operators.SparseJacobian` (options as its constructor's)."""
    return SparseJacobian(f, x, **options)


def prepare_hessian(f: Callable, x, **options) -> SparseHessian:
    """A prepared :class:`~asd.jax.operators.SparseHessian` (options as its constructor's)."""
    return SparseHessian(f, x, **options)


def sparse_jacobian(f: Callable, x, *, mode: str = "auto", **options):
    """The Jacobian of ``f`` at ``x`` as ``jax.experimental.sparse.BCSR`` of shape
    ``(f(x).size, x.size)``: detection, coloring and one compressed evaluation. To evaluate
    repeatedly, prepare once with :func:`prepare_jacobian` and call the operator."""
    return SparseJacobian(f, x, mode=mode, **options)(_array(x))


def sparse_hessian(f: Callable, x, **options):
    """The Hessian of the scalar function ``f`` at ``x`` as ``BCSR`` of shape ``(x.size, x.size)``."""
    return SparseHessian(f, x, **options)(_array(x))


def gradient_and_hessian(f: Callable, x, **options):
    """``(f(x), grad f(x), Hessian as BCSR)`` from one compressed forward-over-reverse evaluation."""
    return SparseHessian(f, x, **options).value_grad_hessian(_array(x))


def _array(x):
    """``x`` as the operator was prepared for it: a numpy array becomes the JAX array it stands for
    (float32 where JAX's 64-bit mode is off)."""
    import jax.numpy as jnp

    return jnp.asarray(x)


def to_scipy(M) -> sp.csr_array:
    """A ``jax.experimental.sparse.BCSR`` matrix (2-D, no batch or dense dimensions) as
    ``scipy.sparse.csr_array`` (copied to the host)."""
    from jax.experimental import sparse as jsparse

    if not isinstance(M, jsparse.BCSR) or M.n_batch or M.n_dense or len(M.shape) != 2:
        raise InputError(f"to_scipy expects a 2-D jax.experimental.sparse.BCSR matrix, got {type(M).__name__}")
    return sp.csr_array((np.array(M.data), np.asarray(M.indices).astype(np.int64),
                         np.asarray(M.indptr).astype(np.int64)), shape=tuple(M.shape))
