"""The public functions of asd."""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from .detection.jacobian import check_input
from .cache import CACHE, cache_key
from .errors import CheckError, InputError, StalePatternWarning
from .checks import custom_function_hint
from .backends.traced import inside_transform
from .operators import SparseHessian, SparseJacobian, example_input
from .options import check_bool


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
        ``coloring``, ``order``, ``batch_size``, ``compile``, ``local``, ``strict``, ``pattern``,
        ``check``, ``args``/``kwargs`` (``f``'s extra arguments: ``f(x, *args, **kwargs)``; see
        :class:`asd.SparseJacobian`), and ``cache`` (default ``True``).

    Notes
    -----
    The prepared operator is kept in a bounded cache (:mod:`asd.cache`) keyed on ``f`` (a plain
    function by its code, so a lambda written anew in a loop finds it), a fingerprint of what ``f``
    reads, ``x``'s shape, dtype, device and ``requires_grad``, the grad mode and the options, so a
    repeated call skips detection and coloring. Every hit is validated by the cross-mode probe
    (:mod:`asd.checks`); a stale entry is prepared again with an :class:`asd.StalePatternWarning`.
    Patterns detected with ``local=True`` hold at one point only and are never cached.
    ``asd.clear_cache()`` empties the cache.
    """
    options["mode"] = mode
    op, values = _cached("jacobian", SparseJacobian, f, x, options)
    return op.decompressor.csr(values)


def prepare_hessian(f: Callable, x: torch.Tensor, **options) -> SparseHessian:
    """Detect, color and prepare the sparse Hessian of the scalar function ``f``.

    See :class:`asd.SparseHessian` for the options. The returned operator is callable on new
    inputs of the same shape, dtype and device and returns symmetric ``torch.sparse_csr`` Hessians
    (both triangles stored).
    """
    return SparseHessian(f, x, **options)


def _cached(kind: str, cls, f: Callable, x: torch.Tensor, options: dict, evaluate=None):
    """The (cached) operator for ``f`` at ``x`` and its evaluation ``evaluate(op, x)`` (default: the
    CSR values). A cache hit is validated by the cross-mode probe; when it fails, the operator is
    prepared again with a :class:`asd.StalePatternWarning`."""
    x = example_input(x)
    check_input(x)
    args, kwargs = options.pop("args", ()), options.pop("kwargs", None) or {}
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple of f's extra arguments, got {type(args).__name__}")
    call = evaluate or (lambda op, z, *a, **k: op.values(z, *a, **k))

    def evaluate(op, z):
        return call(op, z, *args, **kwargs)

    cache = check_bool("cache", options.pop("cache", True))
    if cls is SparseHessian and options.get("reuse") is True:  # the default: one cache entry for both spellings
        del options["reuse"]
    if not cache or options.get("local", False) or "pattern" in options:
        if cls is SparseHessian:  # evaluated once: the coloring may favour preparing fast (a star one)
            options.setdefault("reuse", False)
        op = cls(f, x, args=args, kwargs=kwargs, **options)
        return op, evaluate(op, x)
    key = cache_key(kind, f, x, options)
    op, hit = CACHE.get_or_create(key, f, lambda: cls(f, x, args=args, kwargs=kwargs, **options))
    if not hit:
        try:
            return op, evaluate(op, x)
        except CheckError:  # its first call failed its check: a later call prepares anew, without a stale warning
            CACHE.discard(key, op)
            raise
    if inside_transform(x):
        # a hit is validated by the probe, which cannot run inside a transform (nor can detection, for a miss)
        raise InputError(f"asd.sparse_{kind} validates a cached operator with products of its own, which cannot run "
                         "inside a torch.func transform (vmap, grad, jacrev, jvp): prepare the operator outside, e.g. "
                         f"op = asd.prepare_{kind}(f, x), and call op.values(x) inside the transform")
    if op.f is not f:  # the same code written anew (a lambda in a loop): same structure, this function
        op = op.rebind(f)
        CACHE.replace(key, f, op)
    try:
        # (the operator screens substitution's rounding at every call itself)
        result = evaluate(op, x)
        values = result if isinstance(result, torch.Tensor) else result[-1].values()
        # checked with this call's arguments: the operator's own are those it was prepared with
        report = op.check(x, values, args=args, kwargs=kwargs)
        reason = None if report.ok else str(report)
    except (InputError, CheckError) as exc:  # the output changed size; the probe of a call with other arguments
        if isinstance(exc, CheckError) and not op._checked and custom_function_hint(op.trace_info):
            # a first check that never passed (another thread's first call fails it too): the custom
            # Function's derivative, not a stale entry
            CACHE.discard(key, op)
            raise
        reason = str(exc)
    if reason is None:
        return op, result
    warnings.warn(f"asd: the cached {kind} operator of {getattr(f, '__qualname__', f)!r} no longer matches the "
                  f"function ({reason}); preparing it again", StalePatternWarning, stacklevel=3)
    fresh = cls(f, x, args=args, kwargs=kwargs, **options)
    result = evaluate(fresh, x)
    values = result if isinstance(result, torch.Tensor) else result[-1].values()
    report = fresh.check(x, values, args=args, kwargs=kwargs)
    if not report.ok:
        hint = custom_function_hint(fresh.trace_info) or "the two AD modes of PyTorch disagree on this function: "
        raise CheckError(f"the freshly prepared {kind} disagrees with its cross-mode check ({report}); {hint}"
                         "try another mode= / hvp=")
    CACHE.replace(key, f, fresh)
    return fresh, result


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
        ``order``, ``hvp``, ``batch_size``, ``compile``, ``local``, ``strict``, ``pattern``,
        ``reuse`` (see :class:`asd.SparseHessian`) and ``cache`` (default ``True``, as for
        :func:`sparse_jacobian`). Where no operator is kept (``cache=False``, ``local=True`` or
        ``pattern=``), the operator is prepared with ``reuse=False``: a large pattern of a cheap
        function then takes star, which is faster to prepare and evaluate once.
    """
    op, values = _cached("hessian", SparseHessian, f, x, options)
    return op.decompressor.csr(values)


def gradient_and_hessian(f: Callable, x: torch.Tensor, **options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(f(x), grad f(x), sparse Hessian)`` from one batched forward-over-reverse evaluation.

    The combination Newton and interior-point solvers need; options and caching as for
    :func:`sparse_hessian`.
    """
    return _cached("hessian", SparseHessian, f, x, options, lambda op, z, *a, **k: op.value_grad_hessian(z, *a, **k))[1]


def clear_cache() -> None:
    """Forget every cached prepared operator and every cached structure (prepared decompression
    plans, transposes of sparse constants, ``asd.linalg``'s sparse structures, the colorings kept by
    pattern content, the tracer's memos of data-movement ops and of meta outputs)."""
    from . import linalg
    from .backends.sparse_constants import clear_transposes
    from .coloring import clear_memo as clear_colorings
    from .decompression.device import clear_prepared
    from .detection.rules.movement import clear_memo as clear_movement
    from .detection.torch_tracer import clear_memos as clear_tracer_memos

    CACHE.clear()
    clear_prepared()
    clear_transposes()
    clear_colorings()
    clear_movement()
    clear_tracer_memos()
    linalg.clear_cache()


def to_scipy(t: torch.Tensor) -> sp.csr_array:
    """A ``torch.sparse_csr`` (or COO) 2-D tensor as a ``scipy.sparse.csr_array`` on the host, with
    arrays of its own: SciPy's in-place operations (``eliminate_zeros``, ``S *= 2``) leave ``t`` as
    it was."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_scipy converts a torch sparse tensor, got {type(t).__name__}"
                        + ("; a numpy array is converted with scipy.sparse.csr_array(a)" if isinstance(t, np.ndarray)
                           else ""))
    if t.dim() != 2:
        raise InputError(f"to_scipy converts a 2-D sparse matrix, got a {t.dim()}-D tensor of shape {tuple(t.shape)}; "
                         "convert the matrices of a batch one at a time")
    if t.layout == torch.sparse_coo:
        t = t.coalesce().to_sparse_csr()
    if t.layout != torch.sparse_csr:
        raise TypeError(f"expected a sparse CSR or COO tensor, got layout {t.layout}")
    t = t.detach().cpu()
    return sp.csr_array((t.values().numpy().copy(), t.col_indices().numpy().astype(np.int64),
                         t.crow_indices().numpy().astype(np.int64)), shape=tuple(t.shape))


def to_cupy(t: torch.Tensor):
    """A ``torch.sparse_csr`` 2-D CUDA tensor as a ``cupyx.scipy.sparse.csr_matrix`` on the same
    GPU, through DLPack: the values are shared, not copied (writing into the result's ``data``
    writes into ``t``'s values); the index arrays are CuPy's own int32 copies, so CuPy's in-place
    index operations never rewrite ``t``'s. A COO tensor is converted to CSR first (its values are
    then a copy). Needs CuPy (``pip install asd[cuda]``).

    ``t`` must not require grad (CuPy's writes would bypass autograd): pass ``t.detach()``.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_cupy converts a torch sparse tensor, got {type(t).__name__}")
    if t.dim() != 2 or t.layout not in (torch.sparse_csr, torch.sparse_coo) or t.dense_dim() != 0:
        raise InputError(f"to_cupy converts a 2-D sparse CSR or COO matrix with scalar values, got a {t.dim()}-D "
                         f"{t.layout} tensor; a dense CUDA tensor goes to CuPy with cupy.from_dlpack(t)")
    if t.device.type != "cuda":
        raise InputError(f"to_cupy converts a CUDA tensor, got one on {t.device}; use asd.to_scipy(t) for a host "
                         "matrix, or move it first with t.to('cuda')")
    if t.requires_grad:
        raise InputError("to_cupy shares t's values with CuPy, whose writes autograd would not see: pass t.detach()")
    if t.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        raise InputError(f"to_cupy: CuPy's sparse matrices hold float32/float64/complex values, got {t.dtype}; "
                         "convert with t.to(torch.float32) first")
    try:
        import cupy
        import cupyx.scipy.sparse as csp
    except ImportError as exc:
        raise ImportError("asd.to_cupy needs CuPy: pip install asd[cuda] (or the cupy-cudaXXx wheel matching "
                          "your CUDA)") from exc
    if t.layout == torch.sparse_coo:
        t = t.coalesce().to_sparse_csr()
    if max(t.shape) >= 2**31 or t.values().numel() >= 2**31:
        raise InputError(f"to_cupy: CuPy's CSR matrices hold int32 indices; a {tuple(t.shape)} matrix with "
                         f"{t.values().numel()} entries does not fit")
    with cupy.cuda.Device(t.device.index if t.device.index is not None else torch.cuda.current_device()):
        values = cupy.from_dlpack(t.values())
        col = cupy.from_dlpack(t.col_indices()).astype(cupy.int32, copy=True)
        crow = cupy.from_dlpack(t.crow_indices()).astype(cupy.int32, copy=True)
        return csp.csr_matrix((values, col, crow), shape=tuple(t.shape), copy=False)
