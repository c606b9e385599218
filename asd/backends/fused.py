"""The fused direct gather: products and decompression in one (possibly compiled) function.

For a direct plan whose colors fit in one batch, ``values = products(x).reshape(-1)[gather]``
runs as one function, so ``torch.compile`` can fuse the gather into the products. The
compressed products themselves (``compute``) come from the inner backend, built on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decompression.device import PreparedGather, prepared
from ..decompression.plans import DirectPlan
from ..errors import InputError
from .base import Backend, BatchedProducts, SingleDirection, seed_block_types


@dataclass(eq=False)
class FusedState:
    inner_args: tuple
    fused: BatchedProducts
    inner_state: object = field(default=None)


@dataclass(frozen=True)
class FusedGather(Backend):
    """Wraps a :class:`~asd.backends.base.SingleDirection` backend; needs a direct plan and
    all colors in one batch."""

    inner: SingleDirection

    @property
    def name(self) -> str:
        return f"{self.inner.name} + fused gather"

    def ad_modes(self, coloring) -> frozenset:
        return self.inner.ad_modes(coloring)

    @staticmethod
    def applies(coloring, batch_size) -> bool:
        """Whether the fused gather can evaluate this coloring with this batch size."""
        return (len(seed_block_types(coloring)) == 1 and isinstance(coloring.plan, DirectPlan)
                and (batch_size is None or batch_size >= coloring.ncolors))

    def init(self, g, x, coloring, *, batch_size=None, compile=False, trace=None) -> FusedState:
        if not self.applies(coloring, batch_size):
            raise InputError("FusedGather needs a direct decompression plan and all colors in one batch "
                             "(batch_size >= ncolors)")
        prep = prepared(coloring.plan, x.device)
        assert isinstance(prep, PreparedGather)
        run = self.inner.batched(g, coloring)

        def run_gathered(xv, seeds, _run=run, _idx=prep.index):
            return _run(xv, seeds).reshape(-1).index_select(0, _idx)

        seeds = self.inner.seed_rows(coloring, x)
        fused = BatchedProducts(run_gathered, seeds, compile=compile, trace=trace() if trace else None)
        if fused.tracing is not None:
            fused.tracing.owned = (prep.index,)  # the gather index: a constant the compiled graph is specialized on
        return FusedState((g, x, coloring, batch_size), fused)

    def compute(self, state: FusedState, x: torch.Tensor) -> torch.Tensor:
        if state.inner_state is None:
            g, x0, coloring, batch_size = state.inner_args
            state.inner_state = self.inner.init(g, x0, coloring, batch_size=batch_size)
        return self.inner.compute(state.inner_state, x)

    def values(self, state: FusedState, x: torch.Tensor, decompressor) -> torch.Tensor:
        if state.fused.nseeds == 0:
            return x.new_zeros(0)
        return state.fused.run(x, state.fused.seeds)
