"""Prepared sparse derivative operators for JAX functions.

Preparing detects the pattern (or takes the user's), colors it and builds ONE jitted function
from ``x`` to the stored values in CSR order: the compressed JVPs/VJPs/HVPs (``jax.vmap``,
chunked by ``batch_size``) with the decompression (a gather, or the level-by-level substitution
of an acyclic coloring) fused in. Calling the operator runs only that function.
"""

from __future__ import annotations

import numbers
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
import torch
from jax.experimental import sparse as jsparse

from ..coloring import symmetric_pattern
from ..coloring.choose import choose_hessian, choose_jacobian
from ..checks import DEFECT_FACTOR, DEFECT_TRIALS, ROW_FLOOR_POWER, _rows_agree, tolerance_of
from ..decompression.plans import SubstitutionPlan
from ..decompression.precision import judge_substitution
from ..errors import CheckError, InputError
from ..operators import HESSIAN_COLORINGS, JACOBIAN_COLORINGS, MODES
from ..patterns import SparsityPattern, as_pattern
from . import _coloring as C
from .detection import _jacobian, check_input, hessian_sparsity
from .evaluation import batched, decompressor, jacobian_products

#: the default Hessian coloring takes acyclic only when its substitution has at most this many
#: sequential levels (each level is one iteration of a loop inside the jitted call)
MAX_SUBSTITUTION_LEVELS = 64


def _device_of(x):
    devs = getattr(x, "devices", None)
    return next(iter(devs())) if callable(devs) else jax.devices()[0]


def _frozen(f: Callable, x) -> tuple[Callable, object]:
    """``f`` as it stands at preparation, and the shape of its output: its jaxpr at ``x``'s shape and
    dtype, evaluated with copies of the numpy arrays it captures. Every later trace of the operator's
    functions (a jitted call traced again for a committed or weakly typed input, the first
    :meth:`SparseHessian.value_grad_hessian`, the check's product) then evaluates the function the
    pattern was detected for, never what its closure holds by then: a rebound global, or a numpy
    array changed in place, which JAX's constants may alias (both found by an adversarial review)."""
    from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

    # a fresh wrapper: JAX keeps its trace of a function object, which would hold a global or an
    # attribute as it was at an earlier trace of f (a new operator of a changed f read the old one)
    closed, out_shape = jax.make_jaxpr(lambda v: f(v), return_shape=True)(x)
    # numpy arrays are copied (an in-place change would reach the constant); JAX arrays are
    # immutable, and a copy would hold every captured array twice (device memory)
    consts = [np.copy(c, subok=True) if isinstance(c, np.ndarray) else c for c in closed.consts]
    run = jaxpr_as_fun(ClosedJaxpr(closed.jaxpr, consts))
    tree = jax.tree_util.tree_structure(out_shape)

    def frozen(v):
        return jax.tree_util.tree_unflatten(tree, run(v))

    frozen.float_dtypes = _float_dtypes(closed.jaxpr)
    return frozen, out_shape


def _float_dtypes(jaxpr) -> frozenset:
    """The floating (and complex) dtypes a jaxpr computes, inside its sub-jaxprs too (``cond``,
    ``scan``, ``pjit``, custom rules)."""
    seen: set = set()

    def walk(j) -> None:
        for eqn in j.eqns:
            for v in eqn.outvars:
                dt = getattr(getattr(v, "aval", None), "dtype", None)
                if dt is not None and jnp.issubdtype(dt, jnp.inexact):
                    seen.add(np.dtype(dt))
            bits = eqn.params.get("mantissa_bits", 0) if eqn.primitive.name == "reduce_precision" else None
            if bits is not None and bits < jnp.finfo(eqn.outvars[0].aval.dtype).nmant:
                # a result rounded to fewer bits than its dtype's: the known dtype of the most mantissa
                # bits not above them, at least as coarse
                known = (jnp.float32, jnp.float16, jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2)
                within = [d for d in known if jnp.finfo(d).nmant <= bits]
                seen.add(np.dtype(max(within, key=lambda d: jnp.finfo(d).nmant) if within else jnp.float8_e5m2))
            for param in eqn.params.values():
                for sub in (param if isinstance(param, (list, tuple)) else (param,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr)
    return frozenset(seen)


def _check_batch_size(batch_size) -> int | None:
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    return int(batch_size)


class _SparseOperator:
    _what = "this operator"
    pattern: SparsityPattern

    def _bind(self, f: Callable, x) -> None:
        check_input(x)
        x = jnp.asarray(x)
        self.f = f
        self.shape, self.dtype, self.device = tuple(x.shape), x.dtype, _device_of(x)
        self.timings: dict[str, float] = {}
        self._out_dtype = x.dtype  # f's output dtype (a Jacobian's may be coarser than x's)
        self._probe = None  # (jitted independent product, random vector) where calls are checked

    def _checking(self, check, local: bool, pattern, product: Callable, size: int, transpose: bool = False) -> None:
        """Check every call (``check``; default: a pattern traced at one point or given by the
        user, which need not hold at another point) with one independent product: ``product(x, v)``
        is the matrix times ``v`` (of ``size`` elements), or its transpose times ``v``."""
        if check is None:
            check = local or pattern is not None
        if not isinstance(check, bool):
            raise InputError(f"check must be True, False or None, got {check!r}")
        self.check = check
        if check:
            v = np.random.default_rng(0x5EED).uniform(-1.0, 1.0, size)
            self._probe = (jax.jit(product), jax.device_put(jnp.asarray(v, dtype=self.dtype), self.device), transpose)

    def _verify(self, x, values) -> None:
        """Raise :class:`asd.errors.CheckError` unless the values times the probe's vector match the
        independent product at ``x``, row by row at each row's own scale (a NaN or infinite entry
        of the independent product is passed over: a formula may fail where the values are finite)."""
        if isinstance(values, jax.core.Tracer) or isinstance(x, jax.core.Tracer):
            raise InputError(f"{self._what} checks every call (check=True, the default with local=True or pattern=): "
                             "the check compares concrete values, so it cannot run under jax.jit, vmap or grad. "
                             "Prepare the operator with check=False to call it inside a transformation, or call it "
                             "outside")
        product, v, transpose = self._probe
        ref = product(x, v)
        ref_dtype = ref.dtype
        ref = np.asarray(ref, dtype=np.float64).reshape(-1)
        vals = np.asarray(values, dtype=np.float64)
        indptr, indices = np.asarray(self._indptr), np.asarray(self._indices)
        vv = np.asarray(v, dtype=np.float64)
        A = sp.csr_array((vals, indices, indptr), shape=self._shape)
        absA = sp.csr_array((np.abs(vals), indices, indptr), shape=self._shape)
        if transpose:
            A, absA = A.T, absA.T
        mine = A @ vv
        scale = absA @ np.abs(vv) + np.abs(ref)
        # values of a substitution that are not finite where the independent product is: a NaN carried
        # into entries the derivative has finite (a direct decompression's NaN is its AD mode's own,
        # 0 * inf as jax.jacrev's, and passed over below)
        lost = ~np.isfinite(mine) & np.isfinite(ref)
        if lost.any() and isinstance(getattr(self.coloring, "plan", None), SubstitutionPlan):
            row = int(np.flatnonzero(lost)[0])
            raise CheckError(
                f"{self._what} failed its check at this x: entry {row} of the values times a random vector is "
                f"{mine[row]:.6g} where an independent product gives {ref[row]:.6g}: non-finite values (a NaN or "
                "infinite derivative carried by substitution into other entries): try coloring='star'")
        # an entry that is not finite in the product only is passed over: the product's AD mode may fail
        # (0 * inf) where the values' is finite; one not finite on both sides has no finite line to compare
        keep = np.isfinite(ref) & np.isfinite(mine) & np.isfinite(scale)
        if not keep.any():
            return
        # the precision of the values: the output's where it is coarser than x's (float32 from float64)
        eps = max(float(jnp.finfo(t).eps) for t in (self.dtype, self._out_dtype, values.dtype, ref_dtype))
        rows = np.flatnonzero(keep)
        tol = tolerance_of(eps)
        verdict = _rows_agree(*(torch.from_numpy(a[rows]) for a in (mine, ref, scale)), tol,
                              eps ** ROW_FLOOR_POWER)  # the torch probe's row-by-row rule
        passed = False
        if not verdict.ok:
            row = int(rows[verdict.row])
            defect = self._linearity_defect(x, ref, rows)
            # passed where the differences are, entry by entry, at the rounding the product itself
            # shows at this x; then re-probed as a pass by the row floor is
            passed = defect is not None and bool(
                (np.abs(mine - ref)[rows] <= DEFECT_FACTOR * defect + tol * scale[rows]).all())
        if verdict.ok or passed:
            # entries that passed only by the row floor (or the rounding), probed again with a vector that
            # vanishes on their stored entries' columns: the values' side is then exactly 0 there, and so
            # is the rounding of their stored entries; any product there is an entry the pattern misses
            suspect = keep & (np.abs(mine - ref) > tol * scale)
            if not suspect.any():
                return
            w = np.random.default_rng(0x5EED + 1).uniform(-1.0, 1.0, vv.shape[0])
            w[A.tocsr()[np.flatnonzero(suspect)].indices] = 0  # A's stored entries, explicit zeros included
            if not w.any():
                return
            ref = np.asarray(product(x, jax.device_put(jnp.asarray(w, dtype=v.dtype), self.device)),
                             dtype=np.float64).reshape(-1)
            mine = A @ w
            bad = suspect & np.isfinite(ref) & (np.abs(ref - mine) > tol * scale)
            if not bad.any():
                return
            row = int(np.flatnonzero(bad)[0])
        raise CheckError(
            f"{self._what} failed its check at this x: entry {row} of the values times a random vector is "
            f"{mine[row]:.6g}, an independent product gives {ref[row]:.6g}. The sparsity pattern (traced at "
            "another point, or given) does not hold here: prepare the operator at this point, or pass "
            "local=False")

    def _linearity_defect(self, x, ref: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
        """``|P(v + b) - P(v) - P(b)|`` at ``rows`` for the probe's product ``P`` (``P(v)``:
        ``ref``), entry by entry the largest over :data:`asd.checks.DEFECT_TRIALS` random ``b``:
        zero in exact arithmetic, so the rounding the product shows at ``x``, cancellation within
        ``f`` included (a Hessian that vanishes identically is a few ulps of far larger terms);
        ``None`` where it is not finite."""
        product, v, _ = self._probe
        rng = np.random.default_rng(0x5EED + 2)
        worst = np.zeros(len(rows))
        for _ in range(DEFECT_TRIALS):
            b = jax.device_put(jnp.asarray(rng.uniform(-1.0, 1.0, v.shape[0]), dtype=v.dtype), self.device)
            pb = np.asarray(product(x, b), dtype=np.float64).reshape(-1)
            pvb = np.asarray(product(x, v + b), dtype=np.float64).reshape(-1)
            defect = np.abs(pvb - ref - pb)[rows]
            if not np.isfinite(defect).all():
                return None
            worst = np.maximum(worst, defect)
        return worst

    def _detect(self, detect: Callable, given, conform: Callable) -> None:
        t0 = time.perf_counter()
        self.pattern = as_pattern(detect()) if given is None else conform(as_pattern(given, name="pattern"))
        self.timings["detection"] = time.perf_counter() - t0

    def _finish(self, coloring, products: Callable, batch_size, *, constants: bool) -> None:
        """Build the jitted call from the coloring and ``products(x, blocks, seeds, batch_size) -> flat buffer``.

        With ``constants`` the seeds and the decompression arrays are constants of the jitted
        function (closed over, on the input's device), so XLA folds the linear part of the products
        on the 0/1 seed rows at compile time (Jacobians: about twice as fast a call for a slightly
        longer compile); otherwise they are arguments (Hessians: the seeds meet ``x`` at once and
        folding only lengthens the compile and slows the call).
        """
        self.coloring = coloring
        blocks = C.seed_blocks(coloring)
        dec, dec_arrays = decompressor(C.decompression(coloring))
        put = lambda a: jax.device_put(a, self.device)  # noqa: E731
        self._seeds = [put(jnp.asarray(b.seeds, dtype=self.dtype)) for b in blocks]
        self._dec_arrays = tuple(put(jnp.asarray(a, dtype=jnp.int32 if a.size < 2**31 else jnp.int64))
                                 for a in dec_arrays)
        indptr, indices, shape = C.structure(coloring)
        self._indptr = put(jnp.asarray(indptr, dtype=jnp.int32))
        self._indices = put(jnp.asarray(indices, dtype=jnp.int32))
        self._shape = shape
        nnz = len(indices)
        empty = not blocks or C.ncolors(coloring) == 0
        self._args = () if constants else (self._seeds, self._dec_arrays)
        dtype = self.dtype  # the jitted functions must not hold the operator (a reference cycle)

        def compressed(x, seeds):
            return products(x, blocks, seeds, batch_size)

        def values(x, seeds, arrays):
            return jnp.zeros(nnz, dtype) if empty else dec(compressed(x, seeds), *arrays)

        self._compressed = jax.jit(self._bound(compressed, constants, self._seeds))
        self._values = jax.jit(self._bound(values, constants, self._seeds, self._dec_arrays))

    def _compile_now(self, x) -> None:
        """Compile the values at the prepared point, so that preparing pays the compile time (the
        operator's functions evaluate ``f`` as it stood at preparation: see :func:`_frozen`)."""
        jax.block_until_ready(self._values(x, *self._args))

    @staticmethod
    def _bound(fn: Callable, constants: bool, *args) -> Callable:
        """``fn`` itself, or ``x -> fn(x, *args)`` with ``args`` closed over (jit constants)."""
        return (lambda x: fn(x, *args)) if constants else fn

    @property
    def ncolors(self) -> int:
        """Number of compressed products per evaluation."""
        return C.ncolors(self.coloring)

    def _check(self, x):
        if not hasattr(x, "shape") or tuple(x.shape) != self.shape:
            raise InputError(f"{self._what} was prepared for inputs of shape {self.shape}, got "
                             f"{getattr(x, 'shape', type(x).__name__)}; prepare a new operator for this shape")
        if x.dtype != self.dtype:
            raise InputError(f"{self._what} was prepared for dtype {self.dtype}, got {x.dtype}; convert with "
                             f"x.astype({self.dtype})")
        return x

    def compressed(self, x) -> jax.Array:
        """The flat, batch-first compressed products at ``x``."""
        return self._compressed(self._check(x), *self._args[:1])

    def values(self, x) -> jax.Array:
        """The stored values at ``x`` in the CSR order of :attr:`pattern` (one jitted call; with
        :attr:`check`, one independent product more)."""
        x = self._check(x)
        vals = self._values(x, *self._args)
        if self._screen(vals):  # colored again: this call evaluated anew
            vals = self._values(x, *self._args)
        if self._probe is not None:
            self._verify(x, vals)
        return vals

    def _screen(self, values) -> bool:
        """Judge a call's values beyond the probe; ``True`` where the operator changed its coloring
        because of them."""
        return False

    def __call__(self, x) -> jsparse.BCSR:
        """The derivative at ``x`` as a ``jax.experimental.sparse.BCSR`` matrix."""
        return jsparse.BCSR((self.values(x), self._indices, self._indptr), shape=self._shape)


class SparseJacobian(_SparseOperator):
    """A reusable sparse Jacobian of the JAX function ``f`` for inputs shaped like ``x``.

    Parameters
    ----------
    f
        Function of one array returning one array.
    x
        Example input: fixes shape, dtype and device (and, with ``local=True``, the point at which
        the pattern is detected).
    mode
        ``"forward"`` (column coloring, JVPs), ``"reverse"`` (row coloring, VJPs) or ``"auto"``
        (the one with fewer colors; forward on a tie; reverse where ``f`` holds a ``custom_vjp``
        function, which JAX differentiates in reverse mode only).
    coloring
        Overrides ``mode``: ``"column"``, ``"row"`` or ``"bidirectional"`` (JVPs and VJPs).
    order
        Vertex order of the coloring (see :data:`asd.coloring.ORDERS`, or ``"best"``).
    batch_size
        Seeds per vectorized chunk (bounds memory); ``None``: all at once.
    local, strict
        As for :func:`asd.jax.jacobian_sparsity`.
    pattern
        A known sparsity pattern (skips detection).
    check
        Compare every call with one independent product (a JVP, or a VJP where ``f`` has reverse
        mode only) and raise :class:`asd.errors.CheckError` where they differ. ``None`` (default):
        only for a pattern that need not hold at the call's ``x`` (``local=True`` or ``pattern=``).

    Attributes
    ----------
    pattern : asd.SparsityPattern
    coloring : asd.Coloring
    ncolors : int
    mode : str
    timings : dict
    """

    _what = "this SparseJacobian"

    def __init__(self, f: Callable, x, *, mode: str = "auto", coloring: str | None = None, order: str = "natural",
                 batch_size: int | None = None, local: bool = False, strict: bool = False, pattern=None,
                 check: bool | None = None):
        self._bind(f, x)
        if mode not in MODES:
            raise InputError(f"mode must be one of {MODES}, got {mode!r}")
        if coloring is not None and coloring not in JACOBIAN_COLORINGS:
            raise InputError(f"a Jacobian coloring must be one of {JACOBIAN_COLORINGS}, got {coloring!r}")
        batch_size = _check_batch_size(batch_size)
        x = jnp.asarray(x)
        f, y = _frozen(f, x)
        if not hasattr(y, "shape"):
            raise InputError(f"f must return one array, got {type(y).__name__}")
        self.out_shape = tuple(y.shape)
        if jnp.issubdtype(y.dtype, jnp.inexact):
            self._out_dtype = y.dtype
        m = int(np.prod(self.out_shape, dtype=np.int64))

        def conform(P: SparsityPattern) -> SparsityPattern:
            if P.shape != (m, x.size):
                raise InputError(f"the given pattern has shape {P.shape} but the Jacobian is ({m}, {x.size})")
            return P

        reverse_only = []

        def detect():
            P, custom_vjp = _jacobian(f, x, None, local, strict)
            reverse_only.append(custom_vjp)
            return P

        self._detect(detect, pattern, conform)
        problem = coloring or {"forward": "column", "reverse": "row"}.get(mode)
        if problem is None and (reverse_only[0] if reverse_only else not _has_forward_mode(f, x)):
            problem = "row"
        elif problem is None and not _has_reverse_mode(f, x):
            problem = "column"  # a while_loop inside: JAX differentiates it in forward mode only
        t0 = time.perf_counter()
        result = choose_jacobian(self.pattern, problem, order, prefer="column")  # jitted JVPs win ties
        self.timings["coloring"] = time.perf_counter() - t0
        self.mode = {"column": "forward", "row": "reverse"}.get(result.problem, result.problem)
        shape = self.shape

        def g(v):
            return f(v.reshape(shape)).reshape(-1)

        self._finish(result, lambda v, blocks, seeds, bs: jacobian_products(g, v.reshape(-1), blocks, seeds, bs),
                     batch_size, constants=True)
        if self.mode == "reverse" and not _has_forward_mode(g, x.reshape(-1)):
            def pulled(v, u):
                y, pull = jax.vjp(g, v.reshape(-1))
                return pull(u.astype(y.dtype))[0]

            self._checking(check, local, pattern, pulled, m, transpose=True)
        else:
            self._checking(check, local, pattern, lambda v, t: jax.jvp(g, (v.reshape(-1),), (t,))[1], x.size)
        self._compile_now(x)

    def __repr__(self) -> str:
        m, n = self.pattern.shape
        return f"SparseJacobian(shape=({m}, {n}), nnz={self.pattern.nnz}, mode={self.mode!r}, ncolors={self.ncolors})"


def _has_forward_mode(f: Callable, x) -> bool:
    """Whether JAX can push a JVP through ``f`` (a ``custom_vjp`` function inside has reverse mode
    only): traced abstractly, nothing is computed."""
    try:
        # batched, as the products are (an unbatched JVP of some custom_vjp functions traces)
        jax.eval_shape(lambda v: jax.vmap(lambda t: jax.jvp(f, (v,), (t,))[1])(v[None]), x)
    except TypeError as exc:
        return "custom_vjp" not in str(exc)
    except Exception:  # noqa: BLE001 - anything else is f's own error, which the evaluation reports
        return True
    return True


def _has_reverse_mode(f: Callable, x) -> bool:
    """Whether JAX can pull a VJP back through ``f`` (a ``lax.while_loop`` has forward mode only):
    traced abstractly, nothing is computed."""
    try:
        jax.eval_shape(lambda v: jax.vjp(f, v)[1](jnp.zeros_like(f(v)))[0], x)
    except ValueError as exc:
        return "Reverse-mode differentiation does not work" not in str(exc)
    except NotImplementedError:  # a primitive without a transpose rule (select_and_gather_add, ...)
        return False
    except Exception:  # noqa: BLE001 - anything else is f's own error, which the evaluation reports
        return True
    return True


def _hvp_products(g: Callable, with_value: bool = False):
    def products(v, blocks, seeds, batch_size):
        (S,) = seeds
        x = v.reshape(-1)
        if with_value:
            # not a linearization of value_and_grad: that needs a JVP of g itself, which a custom_vjp
            # function inside g does not have (the gradient's JVP runs through its rule)
            grad, hvp = jax.linearize(jax.grad(g), x)
            return g(x), grad, batched(hvp, S, batch_size).reshape(-1)
        _, hvp = jax.linearize(jax.grad(g), x)
        return batched(hvp, S, batch_size).reshape(-1)

    return products


class SparseHessian(_SparseOperator):
    """A reusable sparse Hessian of the scalar JAX function ``f`` for inputs shaped like ``x``.

    Parameters
    ----------
    f
        Function of one array returning an array with one element.
    x
        Example input: fixes shape, dtype and device.
    coloring
        ``"star"`` (direct decompression), ``"acyclic"`` (fewer colors, substitution inside the
        jitted call) or ``None``: star unless acyclic needs fewer colors with at most
        :data:`MAX_SUBSTITUTION_LEVELS` substitution levels (and ``x`` is float64: substitution
        accumulates rounding on small entries).
    order, batch_size, local, strict, pattern, check
        As for :class:`SparseJacobian` (the independent product is a Hessian-vector product).
    """

    _what = "this SparseHessian"

    def __init__(self, f: Callable, x, *, coloring: str | None = None, order: str = "natural",
                 batch_size: int | None = None, local: bool = False, strict: bool = False, pattern=None,
                 check: bool | None = None):
        self._bind(f, x)
        if coloring is not None and coloring not in HESSIAN_COLORINGS:
            raise InputError(f"a Hessian coloring must be one of {HESSIAN_COLORINGS}, got {coloring!r}")
        batch_size = _check_batch_size(batch_size)
        x = jnp.asarray(x)
        n = x.size
        f, y = _frozen(f, x)
        leaves = jax.tree_util.tree_leaves(y)
        if len(leaves) != 1 or int(np.prod(leaves[0].shape, dtype=np.int64)) != 1:
            raise InputError(f"f must return one array with one element (a scalar), got {y}")

        def conform(P: SparsityPattern) -> SparsityPattern:
            if P.shape != (n, n):
                raise InputError(f"a Hessian pattern must be ({n}, {n}), got {P.shape}")
            return symmetric_pattern(P)

        self._detect(lambda: hessian_sparsity(f, x, local=local, strict=strict), pattern, conform)
        t0 = time.perf_counter()
        # float64 throughout: x's dtype, and no coarser one inside f (a float32 model on float64
        # parameters has float32's rounding in its products, which substitution would accumulate)
        eps64 = np.finfo(np.float64).eps
        # (jnp.finfo: numpy's refuses bfloat16 and the float8 types)
        exact = self.dtype == jnp.float64 and all(jnp.finfo(d).eps <= eps64 for d in f.float_dtypes)
        # an explicit acyclic coloring on such an f: its rounding bounded at the coarsest dtype's eps
        coarse = [d for d in f.float_dtypes if jnp.finfo(d).eps > jnp.finfo(self.dtype).eps]
        # (its eps: JAX has float types torch has not, float4_e2m1fn among them)
        self._arithmetic = float(max(jnp.finfo(d).eps for d in coarse)) if coarse else None
        result = choose_hessian(self.pattern, coloring, order, exact_arithmetic=exact,
                                max_levels=MAX_SUBSTITUTION_LEVELS)
        self.timings["coloring"] = time.perf_counter() - t0
        shape = self.shape

        def g(v):
            return jnp.reshape(jax.tree_util.tree_leaves(f(v.reshape(shape)))[0], ())

        self._g = g
        self._batch_size = batch_size
        self._with_grad = None
        self._finish(result, _hvp_products(g), batch_size, constants=False)
        self._checking(check, local, pattern, lambda v, t: jax.jvp(jax.grad(g), (v.reshape(-1),), (t,))[1], n)
        # substitution's rounding is bounded at every call unless check=False; an operator that
        # chose acyclic itself may color again (star)
        self._screening = check is not False
        self._rechoose = order if coloring is None else None
        self._compile_now(x)

    def _screen(self, values) -> bool:
        """As :meth:`asd.SparseHessian._screen`: substitution's rounding
        (:func:`asd.decompression.precision.substitution_excess`) beyond what a check tolerates
        warns (:class:`asd.PrecisionWarning`), and an operator that chose acyclic colors again with star."""
        if not isinstance(self.coloring.plan, SubstitutionPlan) or not self._screening:
            return False
        if isinstance(values, jax.core.Tracer):
            return False  # under the user's jax.jit: no values to judge (the next eager call is screened)
        def recolor() -> int:
            result = choose_hessian(self.pattern, "star", self._rechoose, exact_arithmetic=True, max_levels=None)
            self._finish(result, _hvp_products(self._g), self._batch_size, constants=False)
            self._with_grad = None
            self._rechoose = None
            return self.ncolors

        switched = judge_substitution(self.coloring.plan, self.coloring.pattern, torch.from_numpy(np.array(values)),
                                      self.ncolors, None if self._rechoose is None else recolor, stacklevel=4,
                                      arithmetic=self._arithmetic)
        return switched

    def value_grad_hessian(self, x):
        """``(f(x), grad f(x), Hessian as BCSR)`` from one jitted forward-over-reverse evaluation."""
        self._check(x)
        if self._with_grad is None:
            products = _hvp_products(self._g, with_value=True)
            dec, _ = decompressor(C.decompression(self.coloring))
            nnz = len(C.structure(self.coloring)[1])
            ncol = self.ncolors
            bs = self._batch_size
            g = self._g  # not the operator: run is kept by it

            def run(v, seeds, arrays):
                if ncol == 0:
                    val, grad = jax.value_and_grad(g)(v.reshape(-1))
                    return val, grad, jnp.zeros(nnz, v.dtype)
                val, grad, flat = products(v, None, seeds, bs)
                return val, grad, dec(flat, *arrays)

            self._with_grad = jax.jit(run)
        val, grad, vals = self._with_grad(x, self._seeds, self._dec_arrays)
        if self._screen(vals):
            return self.value_grad_hessian(x)
        if self._probe is not None:
            self._verify(x, vals)
        H = jsparse.BCSR((vals, self._indices, self._indptr), shape=self._shape)
        return val, grad.reshape(self.shape), H

    def __repr__(self) -> str:
        n = self.pattern.shape[0]
        return (f"SparseHessian(shape=({n}, {n}), nnz={self.pattern.nnz}, coloring={self.coloring.problem!r}, "
                f"ncolors={self.ncolors})")
