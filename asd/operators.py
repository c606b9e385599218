"""Prepared sparse derivative operators and the pattern cache.

A prepared operator holds everything that does not depend on the input's values: the sparsity
pattern, the coloring with its decompression plan, the seed matrices and the index tensors on the
input's device. Calling it runs only the batched derivative products and one decompression.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from .backends.torch_func import Products, flatten_function, scalar_function
from .decompression import Decompressor
from .detection.jacobian import check_input
from .errors import InputError

JACOBIAN_COLORINGS = ("column", "row", "bidirectional")
HESSIAN_COLORINGS = ("star", "acyclic")
MODES = ("auto", "forward", "reverse")
HVP_MODES = ("forward_over_reverse", "reverse_over_forward")
MAX_GPU_SUBSTITUTION_LEVELS = 64


def seed_matrix(colors: np.ndarray, ncolors: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Seeds as rows: ``S[c, j] = 1`` where ``colors[j] == c`` (negative colors are not seeded)."""
    colors_t = torch.as_tensor(np.asarray(colors, dtype=np.int64))
    S = torch.zeros((ncolors, len(colors_t)), dtype=dtype)
    j = torch.nonzero(colors_t >= 0).reshape(-1)
    S[colors_t[j], j] = 1
    return S.to(device)


def canonical_pattern(pattern) -> sp.csr_array:
    """A user-given pattern as a bool CSR array with sorted indices and no duplicates."""
    P = sp.csr_array(pattern)
    P.sum_duplicates()
    P.sort_indices()
    return sp.csr_array((np.ones(P.nnz, dtype=bool), P.indices.astype(np.int64), P.indptr.astype(np.int64)),
                        shape=P.shape)


def _check_call_input(x, shape, dtype, device, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{what} expects a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise InputError(f"{what} was prepared for inputs of shape {tuple(shape)}, got {tuple(x.shape)}; "
                         "prepare a new operator for this shape")
    if x.dtype != dtype:
        raise InputError(f"{what} was prepared for dtype {dtype}, got {x.dtype}; convert with x.to({dtype})")
    if x.device != device:
        raise InputError(f"{what} was prepared for device {device}, got {x.device}; move x with x.to('{device}')")


class _SparseOperator:
    """Evaluation shared by the prepared operators: batched products, fused or separate decompression."""

    _what = "this operator"

    def _bind_input(self, f: Callable, x: torch.Tensor) -> None:
        """Validate ``x`` and record the function and the input metadata calls must match."""
        check_input(x)
        self.f = f
        self.shape, self.dtype, self.device = tuple(x.shape), x.dtype, x.device
        self.timings: dict[str, float] = {}

    def _setup(self, g: Callable, seeds: list, coloring, x: torch.Tensor, batch_size, compile) -> None:
        self._seeds = seeds
        self._unfused: dict = {}
        self._decompress = Decompressor(coloring, x.device)
        # one batch, direct plan: the gather runs inside the (possibly compiled) product function
        self._fused = (len(seeds) == 1 and self._decompress.index is not None
                       and (batch_size is None or batch_size >= seeds[0][1].shape[0]))
        gather = self._decompress.index if self._fused else None
        self._products = {kind: Products(g, kind, batch_size=batch_size, compile=compile, gather=gather)
                          for kind, _ in seeds}

    def _check(self, x) -> None:
        _check_call_input(x, self.shape, self.dtype, self.device, self._what)

    @property
    def ncolors(self) -> int:
        """Number of batched products per evaluation."""
        return int(self.coloring.ncolors)

    def compressed(self, x: torch.Tensor) -> torch.Tensor:
        """The flat compressed product (batch-first layout of the coloring's plan)."""
        self._check(x)
        xf = x.reshape(-1)
        parts = []
        for kind, seeds in self._seeds:
            if seeds.shape[0]:
                products = self._products[kind]
                if products.gather is not None:  # the fused path returns values: evaluate unfused
                    if kind not in self._unfused:
                        self._unfused[kind] = Products(products._g, kind, batch_size=products.batch_size)
                    products = self._unfused[kind]
                parts.append(products(xf, seeds).reshape(-1))
        if not parts:
            return xf.new_zeros(0)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """Only the stored values (CSR order of :attr:`pattern`): for solvers that keep a fixed structure."""
        if self._fused:
            self._check(x)
            kind, seeds = self._seeds[0]
            return self._products[kind](x.reshape(-1), seeds)
        return self._decompress.values(self.compressed(x))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The derivative at ``x`` as a ``torch.sparse_csr`` tensor."""
        return self._decompress.csr(self.values(x))


class SparseJacobian(_SparseOperator):
    """A reusable sparse Jacobian of ``f`` for inputs shaped like ``x``.

    Parameters
    ----------
    f
        Function of one tensor returning one tensor.
    x
        Example input: fixes shape, dtype and device (and, with ``local=True``, the point at which
        the pattern is detected).
    mode
        ``"forward"`` (column coloring, batched JVPs), ``"reverse"`` (row coloring, batched VJPs)
        or ``"auto"`` (the one with fewer colors; on a tie reverse when evaluating eagerly, as one
        VJP batch shares one forward pass, and forward with ``compile=True``, where compiled JVPs
        are the faster).
    coloring
        Overrides ``mode`` with an explicit problem: ``"column"``, ``"row"`` or ``"bidirectional"``
        (rows and columns together, one batch of JVPs plus one of VJPs).
    order
        Vertex order of the greedy coloring (see :data:`asd.coloring.ORDERS`, or ``"best"``).
    batch_size
        Colors per batched call (bounds memory); ``None`` evaluates all colors at once.
    compile
        Evaluate through ``torch.compile`` (falls back to eager with a warning if it fails).
    local
        Detect the pattern at ``x`` with its values (valid at that point only).
    strict
        Raise on ops without a sparsity rule instead of tracing them conservatively.
    pattern
        A known sparsity pattern (anything ``scipy.sparse.csr_array`` accepts); skips detection.

    Attributes
    ----------
    pattern : scipy.sparse.csr_array
    coloring : asd.Coloring
    ncolors : int
    mode : str
    timings : dict
        Seconds spent in ``detection`` and ``coloring`` while preparing.
    """

    _what = "this SparseJacobian"

    def __init__(self, f: Callable, x: torch.Tensor, *, mode: str = "auto", coloring: str | None = None,
                 order: str = "natural", batch_size: int | None = None, compile: bool = False,
                 local: bool = False, strict: bool = False, pattern=None):
        from .coloring import color
        from .detection.jacobian import jacobian_sparsity

        self._bind_input(f, x)
        if mode not in MODES:
            raise InputError(f"mode must be one of {MODES}, got {mode!r}")
        if coloring is not None and coloring not in JACOBIAN_COLORINGS:
            raise InputError(f"a Jacobian coloring must be one of {JACOBIAN_COLORINGS}, got {coloring!r}")

        t0 = time.perf_counter()
        if pattern is None:
            pattern = jacobian_sparsity(f, x, local=local, strict=strict)
        else:
            pattern = canonical_pattern(pattern)
            if pattern.shape[1] != x.numel():
                raise InputError(f"the given pattern has {pattern.shape[1]} columns but x has {x.numel()} elements")
            with torch.no_grad():
                y = f(x)
            m = y.numel() if isinstance(y, torch.Tensor) else None
            if m != pattern.shape[0]:
                raise InputError(f"the given pattern has {pattern.shape[0]} rows but f(x) has "
                                 f"{m if m is not None else 'no tensor'} elements")
        self.pattern = pattern
        t1 = time.perf_counter()
        self.timings["detection"] = t1 - t0

        if coloring is None:
            if mode == "forward":
                coloring = "column"
            elif mode == "reverse":
                coloring = "row"
        if coloring is None:  # auto
            col = color(pattern, "column", order=order)
            row = color(pattern, "row", order=order)
            prefer_col = col.ncolors < row.ncolors or (col.ncolors == row.ncolors and compile)
            result = col if prefer_col else row
        else:
            result = color(pattern, coloring, order=order)
        self.coloring = result
        self.timings["coloring"] = time.perf_counter() - t1
        self.mode = {"column": "forward", "row": "reverse", "bidirectional": "bidirectional"}[result.problem]

        g = flatten_function(f, x.shape)
        if result.problem == "column":
            seeds = [("jvp", seed_matrix(result.colors, result.ncolors, x.dtype, x.device))]
        elif result.problem == "row":
            seeds = [("vjp", seed_matrix(result.colors, result.ncolors, x.dtype, x.device))]
        else:
            row_colors, col_colors = result.colors
            nr, nc = result.nrow_colors, result.ncol_colors
            seeds = [("jvp", seed_matrix(col_colors, nc, x.dtype, x.device)),
                     ("vjp", seed_matrix(row_colors, nr, x.dtype, x.device))]
        self._setup(g, seeds, result, x, batch_size, compile)

    def __repr__(self) -> str:
        m, n = self.pattern.shape
        return (f"SparseJacobian(shape=({m}, {n}), nnz={self.pattern.nnz}, mode={self.mode!r}, "
                f"ncolors={self.ncolors})")


class SparseHessian(_SparseOperator):
    """A reusable sparse Hessian of the scalar function ``f`` for inputs shaped like ``x``.

    Parameters
    ----------
    f
        Function of one tensor returning a tensor with one element.
    x
        Example input: fixes shape, dtype and device.
    coloring
        ``"star"`` (direct decompression), ``"acyclic"`` (fewer colors, substitution) or ``None``:
        star, unless acyclic needs fewer colors (and, off the CPU, its substitution has at most
        ``MAX_GPU_SUBSTITUTION_LEVELS`` sequential levels).
    order
        Vertex order of the coloring (see :data:`asd.coloring.ORDERS`, or ``"best"``).
    hvp
        ``"forward_over_reverse"`` (``jvp`` of ``grad``, the default) or ``"reverse_over_forward"``
        (``grad`` of ``jvp``: often faster eagerly, but PyTorch's double-backward formulas of a few
        ops (``cumprod`` at a zero) give NaN where forward-over-reverse is exact).
    batch_size, compile, local, strict, pattern
        As for :class:`SparseJacobian`.

    Attributes
    ----------
    pattern : scipy.sparse.csr_array
        Symmetric pattern, both triangles.
    coloring : asd.Coloring
    ncolors : int
    timings : dict
    """

    _what = "this SparseHessian"

    def __init__(self, f: Callable, x: torch.Tensor, *, coloring: str | None = None, order: str = "natural",
                 hvp: str = "forward_over_reverse", batch_size: int | None = None, compile: bool = False,
                 local: bool = False, strict: bool = False, pattern=None):
        from .coloring import color
        from .detection.hessian import hessian_sparsity

        self._bind_input(f, x)
        if coloring is not None and coloring not in HESSIAN_COLORINGS:
            raise InputError(f"a Hessian coloring must be one of {HESSIAN_COLORINGS}, got {coloring!r}")
        if hvp not in HVP_MODES:
            raise InputError(f"hvp must be one of {HVP_MODES}, got {hvp!r}")
        t0 = time.perf_counter()
        if pattern is None:
            pattern = hessian_sparsity(f, x, local=local, strict=strict)
        else:
            pattern = canonical_pattern(pattern)
            if pattern.shape != (x.numel(), x.numel()):
                raise InputError(f"a Hessian pattern must be ({x.numel()}, {x.numel()}), got {pattern.shape}")
        self.pattern = pattern
        t1 = time.perf_counter()
        self.timings["detection"] = t1 - t0
        if coloring is None:
            star = color(pattern, "star", order=order)
            acyclic = color(pattern, "acyclic", order=order)
            # off the CPU, substitution runs level by level: worth it only for shallow trees
            shallow = x.device.type == "cpu" or acyclic.plan.nlevels <= MAX_GPU_SUBSTITUTION_LEVELS
            result = acyclic if acyclic.ncolors < star.ncolors and shallow else star
        else:
            result = color(pattern, coloring, order=order)
        self.coloring = result
        self.timings["coloring"] = time.perf_counter() - t1
        self.hvp = hvp
        self._g = scalar_function(f, x.shape)
        seeds = [("hvp" if hvp == "forward_over_reverse" else "hvp_rev",
                  seed_matrix(result.colors, result.ncolors, x.dtype, x.device))]
        self._setup(self._g, seeds, result, x, batch_size, compile)
        self._with_grad = None
        self._batch_size, self._compile = batch_size, compile

    def value_grad_hessian(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(f(x), grad f(x), Hessian)`` from one batched forward-over-reverse evaluation.

        The gradient has ``x``'s shape; the Hessian is ``torch.sparse_csr``.
        """
        self._check(x)
        if self._with_grad is None:
            self._with_grad = Products(self._g, "value_grad_hvp", compile=self._compile)
        _, seeds = self._seeds[0]
        xf = x.reshape(-1)
        if seeds.shape[0] == 0:
            value, grad = torch.func.grad_and_value(self._g)(xf)[::-1]
            return value, grad.reshape(self.shape), self._decompress.csr(xf.new_zeros(0))
        k = seeds.shape[0] if self._batch_size is None else self._batch_size
        parts, value, grad = [], None, None
        for i in range(0, seeds.shape[0], k):
            value, grad, hs = self._with_grad(xf, seeds[i:i + k])
            parts.append(hs.reshape(-1))
        H = self._decompress(torch.cat(parts) if len(parts) > 1 else parts[0])
        return value, grad.reshape(self.shape), H

    def __repr__(self) -> str:
        n = self.pattern.shape[0]
        return (f"SparseHessian(shape=({n}, {n}), nnz={self.pattern.nnz}, coloring={self.coloring.problem!r}, "
                f"ncolors={self.ncolors})")


class PatternCache:
    """A bounded LRU cache of prepared operators keyed on the function and the input's metadata."""

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        self._data: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get_or_create(self, key, create: Callable):
        try:
            op = self._data.pop(key)
            self.hits += 1
        except KeyError:
            self.misses += 1
            op = create()
        except TypeError:  # unhashable option: no caching
            self.misses += 1
            return create()
        self._data[key] = op
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return op

    def clear(self) -> None:
        self._data.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


CACHE = PatternCache()


def cache_key(kind: str, f: Callable, x: torch.Tensor, options: dict):
    return (kind, f, tuple(x.shape), x.dtype, str(x.device), tuple(sorted(options.items())))
