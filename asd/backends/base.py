"""The backend protocol and the machinery every torch backend shares.

A backend evaluates the compressed products of a coloring::

    state = backend.init(g, x, coloring, batch_size=..., compile=...)
    compressed = backend.compute(state, x)         # flat, batch-first (the plan's layout)
    values = backend.values(state, x, decompressor)  # CSR values of the stored entries

``g`` is the user's function on flat vectors (see :func:`flatten_function` and
:func:`scalar_function`), ``x`` a flat input. Backends are immutable option holders; everything
that depends on the function, the input's dtype/device and the coloring lives in the state.
A new backend is one file with one :class:`Backend` subclass.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch

from ..coloring.result import (AcyclicColoring, BiColoring, ColumnColoring, ColumnSeeds, RowColoring, RowSeeds,
                               StarColoring)
from ..errors import InputError, TransformUnsupported
from .sparse_constants import SparseConstantMode
from .traced import under_transform

#: the types of ``seed_blocks()`` of asd's own coloring classes, in order (tests check them against
#: ``seed_blocks()``)
_SEED_BLOCK_TYPES = {ColumnColoring: (ColumnSeeds,), RowColoring: (RowSeeds,), StarColoring: (ColumnSeeds,),
                     AcyclicColoring: (ColumnSeeds,), BiColoring: (ColumnSeeds, RowSeeds)}


def seed_block_types(coloring) -> tuple:
    """The types of ``coloring.seed_blocks()``, in order, without building the seed matrices (for a
    class other than asd's own the blocks are built)."""
    types = _SEED_BLOCK_TYPES.get(type(coloring))
    return types if types is not None else tuple(type(b) for b in coloring.seed_blocks())


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


def check_output_size(m: int, expected: int) -> None:
    """The function's output must keep the size the operator was prepared for."""
    if m != expected:
        raise InputError(f"f(x) now has {m} elements but the operator was prepared for {expected}; the "
                         "function changed since it was prepared: prepare a new operator")


def _is_sparse_failure(exc: Exception) -> bool:
    text = str(exc).lower()
    return "sparse" in text or "do not have strides" in text


class BatchedProducts:
    """Runs ``fn(x, seeds) -> products`` for chunks of seed rows, optionally compiled.

    The function is compiled with ``torch.compile`` when asked (eager fallback with a warning
    when compilation fails). Functions that apply constant torch sparse matrices are detected on
    the first evaluation and then always run under :class:`SparseConstantMode`.

    Parameters
    ----------
    fn
        ``fn(x, seeds)`` with ``seeds`` of shape ``(k, len)``, returning a tensor with ``k`` rows
        (or, with ``chunked=False``, anything).
    seeds
        All seed rows.
    batch_size
        Seed rows per call; ``None`` evaluates all of them at once.
    compile
        Run ``fn`` through ``torch.compile``; ``"reduce-overhead"``: and replay the compiled
        products of a CUDA input as a captured CUDA graph (:mod:`asd.backends.cudagraph`).
    trace
        A :class:`~asd.backends.traced.Tracing` that records ``fn`` as a graph of ATen operations
        after the first calls and replays it while its guard holds (eager evaluation only).
    """

    def __init__(self, fn: Callable, seeds: torch.Tensor, *, batch_size: int | None = None,
                 compile: bool | str = False, trace=None):
        self.seeds = seeds
        self.batch_size = batch_size
        self._eager = fn
        self.tracing = trace
        if trace is not None:
            # the seed rows are this object's own and never written: a compiled graph is specialized
            # on them when they come in one chunk (chunks of one shape share one graph otherwise)
            trace.constant_seeds = batch_size is None or batch_size >= int(seeds.shape[0])
            if compile:
                trace.compile = True  # compile the recorded graph; the transforms only if that fails
                trace.cuda_graphs = compile == "reduce-overhead"
        # torch.compile of the transforms: the fallback when no graph can be recorded, made at
        # first use (creating it imports Dynamo: about 1 s of every compiled operator's preparation)
        self._compile_transforms = compile
        self._compiled_fn = None
        self._compile_checked = False
        self.compile_failed: str | None = None
        self.sparse_constants: bool | None = None

    @property
    def _compiled(self):
        if self._compile_transforms and self._compiled_fn is None:
            self._compiled_fn = torch.compile(self._eager, dynamic=False)
        return self._compiled_fn

    @_compiled.setter
    def _compiled(self, fn) -> None:
        self._compiled_fn = fn
        if fn is None:
            self._compile_transforms = False

    @property
    def nseeds(self) -> int:
        return int(self.seeds.shape[0])

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
                        raise TransformUnsupported(
                            "the function uses a torch sparse tensor in a way torch.func cannot "
                            f"differentiate ({str(exc2).splitlines()[0][:120]}). Constant sparse "
                            "matrices are supported in products A @ u (CSR/COO) when they are built "
                            "outside the function (e.g. captured in a closure), not inside it.") from exc2
                    raise
            raise
        self.sparse_constants = False
        return out

    def run(self, x: torch.Tensor, seeds: torch.Tensor):
        """``fn(x, seeds)`` for one chunk, compiled when possible."""
        # before the first call has shown whether f uses sparse constants (None), a compiled
        # operator records its graph at once: a function make_fx cannot record disables tracing
        if self.tracing is not None and self.sparse_constants is not True:
            out = self.tracing.run(self._eager, x, seeds)
            if out is not None:
                return out
            if self.tracing.layout_unstable:  # not torch.compile, whose guards miss it as well
                return self._call(self._eager, x, seeds)
            if self.tracing.compile_refused is not None:
                if self._compile_transforms:  # once: the reason stays in tracing.compile_refused
                    self._compiled = None
                    what = ("the compiled graph failed at a later call" if self.tracing.failed_later
                            else "the products were not compiled")
                    warnings.warn(f"asd: {what} ({self.tracing.compile_refused}); evaluating them without "
                                  "compilation", RuntimeWarning, stacklevel=3)
                return self._call(self._eager, x, seeds)
            if self.tracing.compile and not self.tracing.unrecordable:
                # a call the compiled graph does not answer (one recording gradients): the transforms,
                # not torch.compile, which meets what the compiled graph was refused for
                return self._call(self._eager, x, seeds)
        if self._compiled is not None and under_transform(x):
            # torch.compile's kernels would drop a forward tangent: the transforms evaluate such a call
            return self._call(self._eager, x, seeds)
        if self._compiled is not None:
            try:
                out = self._call(self._compiled, x, seeds)
                if not self._compile_checked:
                    return self._checked_compile(out, x, seeds)
                return out
            except InputError:
                raise
            except Exception as exc:  # noqa: BLE001 - any compiler failure falls back to eager
                # f's own error at this x (the uncompiled products raise too) is raised, compilation kept
                out = self._call(self._eager, x, seeds)
                self.compile_failed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                self._compiled = None
                warnings.warn(f"asd: torch.compile failed ({self.compile_failed}); evaluating eagerly",
                              RuntimeWarning, stacklevel=3)
                return out
        return self._call(self._eager, x, seeds)

    def _checked_compile(self, out: torch.Tensor, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        """The first result of torch.compile's products, checked against the uncompiled ones (its
        kernels share Inductor's blind spots, such as a tensor's lazy negation bit): where they
        differ, the uncompiled products from now on, with a warning."""
        from .compile_cache import _close, parts_agree

        want = self._call(self._eager, x, seeds)
        self._compile_checked = True  # (only once both ran: a failure above leaves the next call checked)
        if parts_agree(out, want, _close):
            return out
        self.compile_failed = "its products differ from the uncompiled ones"
        self._compiled = None
        warnings.warn("asd: torch.compile's products differ from the uncompiled ones; evaluating without "
                      "compilation", RuntimeWarning, stacklevel=4)
        return want

    def chunks(self):
        """The seed rows in chunks of ``batch_size``."""
        k = self.nseeds
        step = k if self.batch_size is None else self.batch_size
        return [self.seeds[i:i + step] for i in range(0, k, max(step, 1))]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Products for every seed row, stacked along dim 0 (flattened)."""
        if self.nseeds == 0:
            return x.new_zeros((0,))
        parts = [self.run(x, s).reshape(-1) for s in self.chunks()]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass(frozen=True, eq=False)
class ProductState:
    """The state of a single-direction backend: the function and its batched products."""

    g: Callable
    products: BatchedProducts


class Backend(ABC):
    """The protocol: ``init`` once per prepared operator, ``compute`` on every call."""

    #: a short description of the evaluation strategy (``op.strategy``)
    name: str = "backend"
    #: the AD building blocks the products use (see :data:`asd.detection.ad_gaps.MODES`)
    modes: frozenset = frozenset()

    def ad_modes(self, coloring) -> frozenset:
        """The AD modes (:data:`asd.detection.ad_gaps.MODES`) this backend uses for ``coloring``:
        a mode where one of ``f``'s ops has a wrong PyTorch formula rules the backend out."""
        return self.modes

    @abstractmethod
    def init(self, g: Callable, x: torch.Tensor, coloring, *, batch_size: int | None = None,
             compile: bool = False, trace: Callable | None = None):
        """Everything the evaluation needs that does not depend on ``x``'s values. ``trace``, when
        given, makes a :class:`~asd.backends.traced.Tracing` for each batched function."""

    @abstractmethod
    def compute(self, state, x: torch.Tensor) -> torch.Tensor:
        """The flat compressed product at the flat input ``x`` (the plan's batch-first layout)."""

    def values(self, state, x: torch.Tensor, decompressor) -> torch.Tensor:
        """The values of the stored entries (CSR order) at ``x``."""
        return decompressor.values(self.compute(state, x))


class SingleDirection(Backend):
    """A backend whose products use one seed block of one type (``seed_type``)."""

    seed_type: type = object

    @abstractmethod
    def batched(self, g: Callable, coloring) -> Callable:
        """``fn(x, seeds) -> products`` (one row per seed) for the flat function ``g``; it raises
        :class:`~asd.errors.InputError` when ``g``'s output no longer has the coloring's size."""

    def seed_rows(self, coloring, x: torch.Tensor) -> torch.Tensor:
        every = coloring.seed_blocks(x.dtype, x.device)
        blocks = [b for b in every if isinstance(b, self.seed_type)]
        if len(blocks) != 1 or len(every) != 1:
            raise InputError(f"{type(self).__name__} evaluates {self.seed_type.__name__} of a one-sided "
                             f"coloring, not a {type(coloring).__name__}")
        return blocks[0].matrix

    def init(self, g, x, coloring, *, batch_size=None, compile=False, trace=None) -> ProductState:
        return ProductState(g, BatchedProducts(self.batched(g, coloring), self.seed_rows(coloring, x),
                                               batch_size=batch_size, compile=compile,
                                               trace=trace() if trace else None))

    def compute(self, state: ProductState, x: torch.Tensor) -> torch.Tensor:
        return state.products(x)
