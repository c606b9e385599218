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
address it was captured with (``p.data = q`` swaps a tensor's memory without a new tensor object,
which the operator's value guard cannot see); where one moved, the graph is captured again.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

__all__ = ["CudaGraphed", "graphed"]


def _tensors(fn) -> list[torch.Tensor]:
    """The tensors a compiled products function reads besides ``x`` and the seeds."""
    return [t for t in getattr(fn, "extras", ()) if isinstance(t, torch.Tensor)]


class CudaGraphed:
    """``fn(x, seeds)`` on CUDA tensors, replayed from a captured CUDA graph.

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

    def __init__(self, fn: Callable, x: torch.Tensor, seeds: torch.Tensor, *, constant_seeds: bool):
        self.fn = fn
        self.constant_seeds = constant_seeds
        self.x = torch.empty_like(x, memory_format=torch.contiguous_format)
        self.seeds = seeds if constant_seeds else torch.empty_like(seeds, memory_format=torch.contiguous_format)
        self.captures = 0
        self._capture(x, seeds)

    def _capture(self, x: torch.Tensor, seeds: torch.Tensor) -> None:
        self.watched = [(t, t.data_ptr()) for t in _tensors(self.fn)]
        if self.constant_seeds:
            self.watched.append((seeds, seeds.data_ptr()))
        self.x.copy_(x)
        if not self.constant_seeds:
            self.seeds.copy_(seeds)
        self.graph = None
        self.out = None
        with torch.no_grad(), torch.cuda.device(self.x.device):
            side = torch.cuda.Stream(device=self.x.device)
            side.wait_stream(torch.cuda.current_stream(self.x.device))
            with torch.cuda.stream(side):  # the first calls allocate their workspaces outside the capture
                for _ in range(2):
                    self.fn(self.x, self.seeds)
            torch.cuda.current_stream(self.x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.fn(self.x, self.seeds)
        self.graph, self.out = graph, out
        self.captures += 1

    def valid(self, seeds: torch.Tensor) -> bool:
        """Whether every tensor read by address is where it was at the capture."""
        if self.constant_seeds and seeds.data_ptr() != self.seeds.data_ptr():
            return False
        return all(t.data_ptr() == ptr for t, ptr in self.watched)

    def __call__(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        if not self.valid(seeds):
            if self.constant_seeds:
                self.seeds = seeds
            self._capture(x, seeds)
        else:
            self.x.copy_(x)
            if not self.constant_seeds:
                self.seeds.copy_(seeds)
        self.graph.replay()
        return self.out.clone()


def graphed(fn: Callable, x: torch.Tensor, seeds: torch.Tensor, *, constant_seeds: bool) -> tuple[Callable, str | None]:
    """``(CudaGraphed(fn, ...), None)``, or ``(fn, why not)`` where the capture fails (with a
    :class:`RuntimeWarning`: the compiled kernels are launched one by one instead)."""
    if x.device.type != "cuda":
        return fn, "not a CUDA input"
    try:
        return CudaGraphed(fn, x, seeds, constant_seeds=constant_seeds), None
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot be captured: launch it as compiled
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        warnings.warn(f"asd: the compiled products could not be captured as a CUDA graph ({why}); their kernels "
                      "are launched one by one", RuntimeWarning, stacklevel=3)
        return fn, why
