"""Jacobian and Hessian sparsity patterns of JAX functions, from their jaxprs."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
import scipy.sparse as sp

from ..detection import sets as S
from ..errors import InputError
from . import rules  # noqa: F401  (fills the rule table)
from .interpreter import Interpreter, Val, differentiable

__all__ = ["jacobian_sparsity", "hessian_sparsity", "check_input"]


def check_input(x, what: str = "x") -> None:
    """Raise :class:`InputError` unless ``x`` is a real floating-point JAX (or numpy) array."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise InputError(f"{what} must be a JAX array, got {type(x).__name__}; wrap it with jnp.asarray")
    if jax.dtypes.issubdtype(x.dtype, np.complexfloating):
        raise InputError(f"{what} has complex dtype {x.dtype}; asd differentiates real functions: split the "
                         "input into real and imaginary parts")
    if not jax.dtypes.issubdtype(x.dtype, np.floating):
        raise InputError(f"{what} has dtype {x.dtype}; derivatives need a floating-point input: pass "
                         f"{what}.astype(jnp.float64) (with jax_enable_x64) or jnp.float32")


def _normalize(x, argnums):
    """(arguments tuple, selected argument indices, whether to return a tuple)."""
    if not isinstance(x, (tuple, list)):
        if argnums not in (None, 0, (0,)):
            raise InputError(f"argnums={argnums!r} needs x to be a tuple of arrays")
        return (x,), (0,), False
    xs = tuple(x)
    if not xs:
        raise InputError("x is an empty tuple; pass at least one array")
    if argnums is None:
        selected, as_tuple = tuple(range(len(xs))), True
    elif isinstance(argnums, int):
        selected, as_tuple = (argnums,), False
    else:
        selected, as_tuple = tuple(argnums), True
    for i in selected:
        if not -len(xs) <= i < len(xs):
            raise InputError(f"argnums entry {i} is out of range for {len(xs)} inputs")
    selected = tuple(i % len(xs) for i in selected)
    if len(set(selected)) != len(selected):
        raise InputError(f"argnums={argnums!r} names an argument twice; list each argument once")
    return xs, selected, as_tuple


def trace(f: Callable, xs: tuple, selected: tuple, *, local: bool, strict: bool, hessian: bool = False):
    """Interpret ``jax.make_jaxpr(f)(*xs)`` with the leaves of the arguments ``selected`` traced
    (their elements numbered consecutively, in order). Returns (output Vals, interpreter, column
    offsets of the selected arguments)."""
    leaves_of = [jax.tree_util.tree_leaves(a) for a in xs]
    for i in selected:
        if not leaves_of[i]:
            raise InputError(f"input {i} holds no array")
        for leaf in leaves_of[i]:
            check_input(leaf, "x" if len(xs) == 1 and len(leaves_of[i]) == 1 else f"input {i}")
    sizes = [sum(int(np.size(leaf)) for leaf in leaves_of[i]) for i in selected]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(offsets[-1])
    closed = jax.make_jaxpr(lambda *a: f(*a))(*xs)  # a fresh wrapper: not JAX's kept trace of f (stale globals)
    ins, col = [], {i: int(offsets[k]) for k, i in enumerate(selected)}
    for i, leaves in enumerate(leaves_of):
        for leaf in leaves:
            if i in col:
                size = int(np.size(leaf))
                start = col[i]
                col[i] += size
                block = S._csr(np.arange(size + 1, dtype=S.INDEX), np.arange(start, start + size, dtype=S.INDEX),
                               (size, n))
                ins.append(Val(np.shape(leaf), leaf.dtype, block, leaf if local else None))
            else:
                ins.append(Val.of(leaf))
    interp = Interpreter(n, local=local, strict=strict, hessian=hessian)
    outs = interp.run(closed.jaxpr, [Val.of(c) for c in closed.consts], ins)
    return outs, interp, offsets


def output_sets(outs: list[Val], n: int) -> sp.csr_matrix:
    """Rows of all output leaves, concatenated in ``tree_flatten`` order (each leaf row-major)."""
    if not outs:
        raise InputError("the function returned no array; it must return an array or a pytree of arrays")
    mats = []
    for i, v in enumerate(outs):
        if not differentiable(v.dtype) or jax.dtypes.issubdtype(v.dtype, np.complexfloating):
            where = "" if len(outs) == 1 else f" (output leaf {i})"
            raise InputError(f"the function returned an array of dtype {v.dtype}{where}; its Jacobian needs a "
                             "real floating-point output (integer and boolean outputs have zero derivative: "
                             "leave them out, or convert with .astype(float))")
        mats.append(v.sets if v.sets is not None else S.empty(v.size, n))
    return S.vstack(mats) if len(mats) > 1 else mats[0]


def _csr_array(M: sp.csr_matrix) -> sp.csr_array:
    return sp.csr_array((np.ones(M.nnz, dtype=bool), M.indices.astype(np.int64), M.indptr.astype(np.int64)),
                        shape=M.shape)


def jacobian_sparsity(f: Callable, x, *, argnums=None, local: bool = False, strict: bool = False):
    """Sparsity pattern of the Jacobian of the JAX function ``f`` at (``local=True``) or around ``x``.

    Parameters
    ----------
    f
        A function of one array (or of several: ``f(*x)`` when ``x`` is a tuple) returning an
        array or a pytree of arrays. Output leaves are flattened with ``jax.tree_util`` and their
        rows concatenated in that order, each leaf row-major.
    x
        The input array, or a tuple of inputs (each an array or a pytree of arrays, whose leaves'
        elements are numbered in ``tree_leaves`` order). Only shapes and dtypes matter under
        global detection.
    argnums
        With a tuple ``x``: which inputs to differentiate with respect to (an int gives one
        pattern, a tuple a tuple of patterns; default: all, as a tuple). The others are constants.
    local
        Detect with ``x``'s values: ``max``, ``min``, ``select_n`` (``jnp.where``), ``clamp``,
        ``reduce_max``, ``sort`` and ``cond`` then follow what they pick at this point.
    strict
        Raise :class:`asd.errors.UnsupportedOpError` on a primitive without a rule instead of
        warning (:class:`asd.UnsupportedOpWarning`) and assuming it dense.

    Returns
    -------
    scipy.sparse.csr_array or tuple of them
        Boolean pattern of shape ``(number of output elements, x.size)``.
    """
    return _jacobian(f, x, argnums, local, strict)[0]


def _jacobian(f: Callable, x, argnums, local: bool, strict: bool):
    """``(jacobian_sparsity(...), whether f holds a custom_vjp function)``: JAX differentiates those
    in reverse mode only."""
    xs, selected, as_tuple = _normalize(x, argnums)
    outs, interp, offsets = trace(f, xs, selected, local=local, strict=strict)
    sets = output_sets(outs, interp.n)
    if len(selected) == 1 and not as_tuple:
        return _csr_array(sets), interp.custom_vjp
    sets = sets.tocsc()
    blocks = tuple(_csr_array(S._canonical(sets[:, int(offsets[k]):int(offsets[k + 1])]))
                   for k in range(len(selected)))
    return (blocks if as_tuple else blocks[0]), interp.custom_vjp


def hessian_sparsity(f: Callable, x, *, local: bool = False, strict: bool = False) -> sp.csr_array:
    """Sparsity pattern of the Hessian of the scalar JAX function ``f`` at (``local=True``) or around ``x``.

    The second-order semantics are those of :func:`asd.hessian_sparsity`: linear primitives add
    nothing, ``mul`` adds only cross terms between its operands, ``dot_general`` only the pairs
    it multiplies, other nonlinear primitives every pair of dependencies of an output element.

    Parameters
    ----------
    f
        A function of one array returning an array with one element.
    x
        The input array; only its shape and dtype matter under global detection.
    local, strict
        As for :func:`jacobian_sparsity`.

    Returns
    -------
    scipy.sparse.csr_array
        Symmetric boolean pattern of shape ``(x.size, x.size)``.
    """
    check_input(x)
    outs, interp, _ = trace(f, (x,), (0,), local=local, strict=strict, hessian=True)
    if len(outs) != 1 or outs[0].size != 1:
        shapes = [v.shape for v in outs]
        raise InputError(f"the function returned arrays of shapes {shapes}; hessian_sparsity needs one scalar "
                         "(one element) output: reduce it (e.g. .sum()), or use jacobian_sparsity")
    if not jax.dtypes.issubdtype(outs[0].dtype, np.floating):
        raise InputError(f"the function returned dtype {outs[0].dtype}; its Hessian needs a real floating-point "
                         "output")
    n = interp.n
    grad = outs[0].sets
    if grad is None:
        return _csr_array(S.empty(n, n))
    H = interp.hessian.pattern()
    if grad.nnz < n and H.nnz:  # a row of the Hessian vanishes where the gradient does
        keep = np.zeros(n, dtype=bool)
        keep[grad.indices] = True
        D = sp.diags(keep, dtype=bool, format="csr")
        H = S._canonical(D @ H @ D)
    return _csr_array(H)
