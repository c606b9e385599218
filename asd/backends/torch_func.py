"""Batched Jacobian- and Hessian-vector products through ``torch.func``.

One :class:`Products` object evaluates a function's compressed derivative for a fixed batch of
seed vectors: ``vmap`` over ``jvp`` (forward, one column per seed), over the pullback of one
``vjp`` (reverse, one row per seed), or over ``jvp`` of ``grad`` (Hessian-vector products,
forward-over-reverse) or ``vjp`` of ``jvp`` (reverse-over-forward). Seeds are processed in chunks
of ``batch_size`` to bound memory, and the whole batched evaluation can go through
``torch.compile`` (one compilation per shape, eager fallback with a warning when it fails).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch.func import grad, grad_and_value, jvp, vjp, vmap

from ..errors import InputError
from .sparse_constants import SparseConstantMode

KINDS = ("jvp", "vjp", "hvp", "hvp_rev", "value_grad_hvp")


def flatten_function(f: Callable, shape: torch.Size) -> Callable:
    """``f`` as a function of a flat vector returning a flat vector."""

    def g(v: torch.Tensor) -> torch.Tensor:
        y = f(v.reshape(shape))
        if not isinstance(y, torch.Tensor):
            raise InputError(f"the function returned {type(y).__name__}; it must return a tensor")
        return y.reshape(-1)

    return g


def scalar_function(f: Callable, shape: torch.Size) -> Callable:
    """``f`` as a function of a flat vector returning a 0-d tensor."""

    def g(v: torch.Tensor) -> torch.Tensor:
        y = f(v.reshape(shape))
        if not isinstance(y, torch.Tensor) or y.numel() != 1:
            raise InputError("a Hessian needs a function returning a tensor with exactly one element")
        return y.reshape(())

    return g


def _batched(kind: str, g: Callable) -> Callable:
    if kind == "jvp":
        def run(x, seeds):
            return vmap(lambda s: jvp(g, (x,), (s,))[1])(seeds)
    elif kind == "vjp":
        def run(x, seeds):
            _, pull = vjp(g, x)
            return vmap(lambda s: pull(s)[0])(seeds)
    elif kind == "hvp":
        dg = grad(g)

        def run(x, seeds):
            return vmap(lambda s: jvp(dg, (x,), (s,))[1])(seeds)
    elif kind == "value_grad_hvp":
        # forward-over-reverse with the primal kept: (f(x), grad f(x), H @ seeds) in one evaluation
        gv = grad_and_value(g)

        def run(x, seeds):
            (gr, val), (hs, _) = vmap(lambda s: jvp(gv, (x,), (s,)), out_dims=((None, None), (0, 0)))(seeds)
            return val, gr, hs
    elif kind == "hvp_rev":
        def run(x, seeds):
            def hv(s):
                return grad(lambda v: jvp(g, (v,), (s,))[1])(x)
            return vmap(hv)(seeds)
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return run


def _is_sparse_failure(exc: Exception) -> bool:
    text = str(exc).lower()
    return "sparse" in text or "do not have strides" in text


class Products:
    """Compressed derivative products of ``g`` (flat in, flat out) for batches of seeds.

    Parameters
    ----------
    g
        The flattened function (see :func:`flatten_function` / :func:`scalar_function`).
    kind
        ``"jvp"``, ``"vjp"``, ``"hvp"`` (forward-over-reverse) or ``"hvp_rev"``.
    batch_size
        Seeds per batched call; ``None`` evaluates all seeds in one call.
    compile
        Run the batched evaluation through ``torch.compile``.
    gather
        Optional index tensor: return ``products.reshape(-1)[gather]`` instead of the products
        (direct decompression fused into the same, possibly compiled, function). Only valid when
        all seeds are evaluated in one batch.
    """

    def __init__(self, g: Callable, kind: str, *, batch_size: int | None = None, compile: bool = False,
                 gather: torch.Tensor | None = None):
        if batch_size is not None and batch_size < 1:
            raise InputError(f"batch_size must be a positive integer or None, got {batch_size}")
        self.kind = kind
        self.batch_size = batch_size
        self.gather = gather
        self._g = g
        run = _batched(kind, g)
        if gather is not None:
            def run_gathered(x, seeds, _run=run, _idx=gather):
                return _run(x, seeds).reshape(-1).index_select(0, _idx)
            self._eager = run_gathered
        else:
            self._eager = run
        self._compiled = None
        self.compile = compile
        self.compile_failed: str | None = None
        # whether f applies constant torch sparse matrices (then products run in SparseConstantMode);
        # None until the first evaluation finds out
        self.sparse_constants: bool | None = None
        if compile:
            self._compiled = torch.compile(self._eager, dynamic=False)

    def _call(self, fn: Callable, x: torch.Tensor, seeds: torch.Tensor):
        if self.sparse_constants:
            with SparseConstantMode():
                return fn(x, seeds)
        try:
            out = fn(x, seeds)
        except Exception as exc:  # noqa: BLE001 - only sparse-layout failures are retried
            if self.sparse_constants is None and _is_sparse_failure(exc):
                self.sparse_constants = True
                try:
                    with SparseConstantMode():
                        return fn(x, seeds)
                except Exception as exc2:  # noqa: BLE001
                    if _is_sparse_failure(exc2):
                        raise InputError(
                            "the function uses a torch sparse tensor in a way torch.func cannot "
                            f"differentiate ({str(exc2).splitlines()[0][:120]}). Constant sparse "
                            "matrices are supported in products A @ u (CSR/COO) when they are built "
                            "outside the function (e.g. captured in a closure), not inside it.") from exc2
                    raise
            raise
        self.sparse_constants = False
        return out

    def _run(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        if self._compiled is not None:
            try:
                return self._call(self._compiled, x, seeds)
            except InputError:
                raise
            except Exception as exc:  # noqa: BLE001 - any compiler failure falls back to eager
                self.compile_failed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                self._compiled = None
                warnings.warn(f"asd: torch.compile failed ({self.compile_failed}); evaluating eagerly",
                              RuntimeWarning, stacklevel=3)
        return self._call(self._eager, x, seeds)

    def __call__(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        """Products for every row of ``seeds`` (shape ``(k, len)``), stacked along dim 0."""
        k = seeds.shape[0]
        if k == 0:
            return seeds.new_zeros((0,))
        if self.batch_size is None or k <= self.batch_size:
            return self._run(x, seeds)
        if self.gather is not None:
            raise ValueError("a fused gather needs all seeds in one batch (batch_size >= number of seeds)")
        parts = [self._run(x, seeds[i:i + self.batch_size]) for i in range(0, k, self.batch_size)]
        return torch.cat(parts)
