"""Compiled products replayed as a captured CUDA graph (``compile="reduce-overhead"``).

A compiled products graph of a small function on a GPU spends most of its call launching kernels
(B1 at N=64: a dozen kernels of a few microseconds each). :class:`CudaGraphed` captures one call
of the compiled function into a ``torch.cuda.CUDAGraph`` and replays it: one launch per call.

A captured graph reads and writes fixed addresses. So a call copies ``x`` (and seed rows that are
not the operator's own constants) into the buffers captured, replays, and returns a copy of the
output (the next replay overwrites it; results the caller holds stay as they were). The other
tensors the compiled function reads (``f``'s parameters and constants, lifted into its inputs by
:mod:`asd.backends.specialize`) are read in place: a write into them (an optimizer step) is seen
by the next replay, as by the compiled kernels. Every call checks that each of them still has the
address it was captured with (``p.data = q`` gives a tensor new memory under the same tensor
object, which the operator's value guard does not see); where one moved, the graph is captured
again (at most :data:`MAX_CAPTURES` times; then the compiled kernels are launched one by one). A
tensor whose strides changed (``W.t_()``) needs kernels compiled anew: the operator's tracing
(:mod:`asd.backends.traced`) compiles and captures again before this graph is called.

A capture is checked before it is used: its first replay, into an output poisoned with NaN, must
give what the compiled function gave on the same inputs outside the graph (no NaN left; the
values equal up to the rounding of reordered sums). Products that are not finite at the capture
are not captured. Calls on different CUDA streams are ordered by
an event: a call waits until the previous one has copied its output.
Graphs whose inputs include a tensor on another device (a CPU scalar tensor, whose value a
launch would read on the host once) are not captured.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from .compile_cache import tensor_layout

__all__ = ["CudaGraphed", "graphed", "MAX_CAPTURES"]

#: captures (the first and re-captures after a tensor moved) before the graph is given up
MAX_CAPTURES = 4


def _tensors(fn) -> list[torch.Tensor]:
    """The tensors a compiled products function reads besides ``x`` and the seeds."""
    return [t for t in getattr(fn, "extras", ()) if isinstance(t, torch.Tensor)]


def _layout(t: torch.Tensor) -> tuple:
    """The address a captured graph reads, with what compiled kernels are specialized on."""
    return (t.data_ptr(), *tensor_layout(t))


def _matches(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether a replay into an output poisoned with NaN wrote what the compiled function gave
    (``expected``, finite): no NaN left, and the values equal up to the rounding of kernels whose
    sums may run in another order (atomics): 256 units in the last place of the largest value
    (4 for 16-bit floats, which are rounded once from float32 sums)."""
    if not (isinstance(out, torch.Tensor) and out.shape == expected.shape and out.dtype == expected.dtype):
        return False
    if not bool(torch.isfinite(out).all()):
        return False
    info = torch.finfo(expected.real.dtype if expected.is_complex() else expected.dtype)
    ulps = 256 if info.bits >= 32 else 4  # 16-bit results are rounded once from float32 sums
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    return bool(((out - expected).abs() <= ulps * info.eps * (expected.abs() + scale)).all())


class CaptureError(RuntimeError):
    """The compiled products cannot be replayed from a CUDA graph."""


class CudaGraphed:
    """``fn(x, seeds)`` on CUDA tensors, replayed from a captured CUDA graph (where the caller is
    itself capturing a graph, the compiled kernels are launched into that one instead).

    Parameters
    ----------
    fn
        The compiled products (:class:`~asd.backends.compile_cache.CompiledProducts`); its
        ``extras`` are the tensors it reads by address.
    x, seeds
        Example inputs: their shapes, dtypes and device are the graph's.
    constant_seeds
        The seed rows are the operator's own, never written, and passed at every call (their
        address is captured; otherwise they are copied into a captured buffer like ``x``).
    """

    captured = True

    def __init__(self, fn: Callable, x: torch.Tensor, seeds: torch.Tensor, *, constant_seeds: bool):
        self.fn = fn
        self.extras = getattr(fn, "extras", ())
        self.device = x.device
        self._index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        self.constant_seeds = constant_seeds
        foreign = [t for t in _tensors(fn) if t.device != x.device]
        if foreign:
            raise CaptureError(f"the products read a tensor on {foreign[0].device} (x is on {x.device}): a captured "
                               "graph would keep its value")
        self.x = torch.empty_like(x, memory_format=torch.contiguous_format)
        self.seeds = seeds if constant_seeds else torch.empty_like(seeds, memory_format=torch.contiguous_format)
        self.captures = 0
        #: why the graph was given up (the compiled kernels are launched one by one since), or ``None``
        self.error: str | None = None
        self.graph = None
        self.out = None
        self.watched: list = []
        self._done = torch.cuda.Event()
        self._pending = False
        self._capture(x, seeds)

    def _capture(self, x: torch.Tensor, seeds: torch.Tensor) -> None:
        """Capture ``fn`` at ``(x, seeds)`` and check the capture; the new graph replaces the old
        one only when it passed (raises :class:`CaptureError` or the capture's own error otherwise)."""
        if self.captures >= MAX_CAPTURES:
            raise CaptureError(f"the tensors the products read moved {self.captures} times: captured again at "
                               "every call, a graph costs more than it saves")
        dev = self.device
        seed_buffer = seeds if self.constant_seeds else self.seeds
        with torch.no_grad(), torch.cuda.device(dev), torch.cuda.stream(torch.cuda.current_stream(dev)):
            outer = torch.cuda.current_stream(dev)
            if self._pending:
                outer.wait_event(self._done)
            self.x.copy_(x)
            if not self.constant_seeds:
                self.seeds.copy_(seeds)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(outer)
            with torch.cuda.stream(side):  # the first calls allocate their workspaces outside the capture
                for _ in range(2):
                    expected = self.fn(self.x, seed_buffer)
            outer.wait_stream(side)
            expected.record_stream(outer)
            expected = expected.clone()
            watched = [(t, _layout(t)) for t in _tensors(self.fn)]
            if self.constant_seeds:
                watched.append((seeds, _layout(seeds)))
            graph = torch.cuda.CUDAGraph()
            capture = torch.cuda.Stream(device=dev)
            capture.wait_stream(outer)
            with torch.cuda.graph(graph, stream=capture, capture_error_mode="thread_local"):
                out = self.fn(self.x, seed_buffer)
            outer.wait_stream(capture)
            if not isinstance(out, torch.Tensor) or not (out.is_floating_point() or out.is_complex()):
                raise CaptureError(f"the compiled products returned {getattr(out, 'dtype', type(out).__name__)}, "
                                   "not floating-point values")
            if not bool(torch.isfinite(expected).all()):
                raise CaptureError("the products are not finite at the capture: an entry the graph does not "
                                   "write could not be told apart")
            inputs = [self.x, seed_buffer, *_tensors(self.fn)]
            if any(out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in inputs):
                raise CaptureError("the captured output shares memory with an input")
            out.fill_(float("nan"))
            graph.replay()
            if not _matches(out, expected):
                raise CaptureError("the captured graph's first replay differs from the compiled products")
        self.graph, self.out, self.watched = graph, out, watched
        if self.constant_seeds:
            self.seeds = seeds
        self.captures += 1

    def __del__(self):
        # the graph's memory goes back to the allocator with it: not while a replay may still run
        try:
            if self._pending and not torch.cuda.is_current_stream_capturing():
                self._done.synchronize()
        except Exception:  # noqa: BLE001 - at interpreter exit CUDA may be gone
            pass

    def valid(self, seeds: torch.Tensor) -> bool:
        """Whether every tensor read by address is where, and laid out as, it was at the capture."""
        if self.constant_seeds and seeds is not self.seeds and _layout(seeds) != _layout(self.seeds):
            return False
        return all(_layout(t) == layout for t, layout in self.watched)

    def __call__(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        if self.error is not None or torch.cuda.is_current_stream_capturing():
            return self.fn(x, seeds)
        if not self.valid(seeds):
            try:
                self._capture(x, seeds)
            except Exception as exc:  # noqa: BLE001 - launch the compiled kernels from now on
                self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                self.graph = self.out = None
                warnings.warn(f"asd: the compiled products could not be captured again as a CUDA graph ({self.error}); "
                              "their kernels are launched one by one from now on", RuntimeWarning, stacklevel=4)
                return self.fn(x, seeds)
        # the copies, the replay and the clone run on the current stream of the graph's device
        # (CUDAGraph.replay launches there whichever device is current)
        stream = torch.cuda.current_stream(self._index)
        if self._pending:
            stream.wait_event(self._done)  # a call on another stream has copied its output
        self.x.copy_(x)
        if not self.constant_seeds:
            self.seeds.copy_(seeds)
        self.graph.replay()
        out = self.out.clone()
        self._done.record(stream)
        self._pending = True
        return out


def graphed(fn: Callable, x: torch.Tensor, seeds: torch.Tensor, *, constant_seeds: bool) -> tuple[Callable, str | None]:
    """``(CudaGraphed(fn, ...), None)``, or ``(fn, why not)`` where the capture fails or is refused
    (with a :class:`RuntimeWarning`: the compiled kernels are launched one by one instead)."""
    if x.device.type != "cuda":
        return fn, "not a CUDA input"
    try:
        return CudaGraphed(fn, x, seeds, constant_seeds=constant_seeds), None
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot be captured: launch it as compiled
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        warnings.warn(f"asd: the compiled products could not be captured as a CUDA graph ({why}); their kernels "
                      "are launched one by one", RuntimeWarning, stacklevel=5)
        return fn, why
