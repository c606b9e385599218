"""The public functions of asd."""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from .detection.jacobian import check_input
from .cache import CACHE, cache_key
from .operators import SparseHessian, SparseJacobian


def prepare_jacobian(f: Callable, x: torch.Tensor, **options) -> SparseJacobian:
    """Detect, color and prepare the sparse Jacobian of ``f`` for inputs shaped like ``x``.

    See :class:`asd.SparseJacobian` for the options. The returned operator is callable on new
    inputs of the same shape, dtype and device and returns ``torch.sparse_csr`` Jacobians.
    """
    return SparseJacobian(f, x, **options)


def sparse_jacobian(f: Callable, x: torch.Tensor, *, mode: str = "auto", **options) -> torch.Tensor:
    """The Jacobian of ``f`` at ``x`` as a ``torch.sparse_csr`` tensor.

    Parameters
    ----------
    f
        Function of one tensor returning one tensor.
    x
        Input of any shape; the Jacobian has shape ``(f(x).numel(), x.numel())`` in row-major
        flattening, and ``x``'s dtype and device.
    mode
        ``"auto"``, ``"forward"`` or ``"reverse"``.
    **options
        ``coloring``, ``order``, ``batch_size``, ``compile``, ``local``, ``strict``, ``pattern``
        (see :class:`asd.SparseJacobian`), and ``cache`` (default ``True``).

    Notes
    -----
    The prepared operator is kept in a bounded cache keyed on ``f`` and ``x``'s shape, dtype and
    device (and the options), so a repeated call skips detection and coloring. Patterns detected
    with ``local=True`` hold at one point only and are never cached. ``asd.clear_cache()``
    empties the cache.
    """
    options["mode"] = mode
    return _cached("jacobian", SparseJacobian, f, x, options)(x)


def prepare_hessian(f: Callable, x: torch.Tensor, **options) -> SparseHessian:
    """Detect, color and prepare the sparse Hessian of the scalar function ``f``.

    See :class:`asd.SparseHessian` for the options. The returned operator is callable on new
    inputs of the same shape, dtype and device and returns symmetric ``torch.sparse_csr`` Hessians
    (both triangles stored).
    """
    return SparseHessian(f, x, **options)


def _cached(kind: str, cls, f: Callable, x: torch.Tensor, options: dict):
    check_input(x)
    use_cache = options.pop("cache", True) and not options.get("local", False) and "pattern" not in options
    if not use_cache:
        return cls(f, x, **options)
    return CACHE.get_or_create(cache_key(kind, f, x, options), lambda: cls(f, x, **options))


def sparse_hessian(f: Callable, x: torch.Tensor, **options) -> torch.Tensor:
    """The Hessian of the scalar function ``f`` at ``x`` as a symmetric ``torch.sparse_csr`` tensor.

    Parameters
    ----------
    f
        Function of one tensor returning a tensor with one element.
    x
        Input of any shape; the Hessian has shape ``(x.numel(), x.numel())``, ``x``'s dtype and device.
    **options
        ``coloring`` (``"star"`` or ``"acyclic"``; default: star unless acyclic saves colors),
        ``order``, ``hvp``, ``batch_size``, ``compile``, ``local``, ``strict``, ``pattern`` (see
        :class:`asd.SparseHessian`) and ``cache`` (default ``True``, as for :func:`sparse_jacobian`).
    """
    return _cached("hessian", SparseHessian, f, x, options)(x)


def gradient_and_hessian(f: Callable, x: torch.Tensor, **options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(f(x), grad f(x), sparse Hessian)`` from one batched forward-over-reverse evaluation.

    The combination Newton and interior-point solvers need; options and caching as for
    :func:`sparse_hessian`.
    """
    return _cached("hessian", SparseHessian, f, x, options).value_grad_hessian(x)


def clear_cache() -> None:
    """Forget every cached prepared operator."""
    CACHE.clear()


def to_scipy(t: torch.Tensor) -> sp.csr_array:
    """A ``torch.sparse_csr`` (or COO) tensor as a ``scipy.sparse.csr_array`` on the host."""
    if t.layout == torch.sparse_coo:
        t = t.coalesce().to_sparse_csr()
    if t.layout != torch.sparse_csr:
        raise TypeError(f"expected a sparse CSR or COO tensor, got layout {t.layout}")
    t = t.detach().cpu()
    return sp.csr_array((t.values().numpy(), t.col_indices().numpy().astype(np.int64),
                         t.crow_indices().numpy().astype(np.int64)), shape=tuple(t.shape))
