"""Bicolorings: a batch of JVPs for the column colors and a batch of VJPs for the row colors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..coloring.result import BiColoring, ColumnSeeds
from ..errors import InputError
from .base import Backend, BatchedProducts
from .jvp import ForwardJVP
from .vjp import ReverseVJP


@dataclass(frozen=True, eq=False)
class BidirectionalState:
    parts: tuple  # BatchedProducts, in the order of the flat compressed buffer


@dataclass(frozen=True)
class Bidirectional(Backend):
    """JVPs and VJPs of a :class:`~asd.coloring.BiColoring`, concatenated as its plan reads them."""

    forward: ForwardJVP = ForwardJVP()
    reverse: ReverseVJP = ReverseVJP()
    name = "vmap(jvp) + vmap(vjp)"
    modes = frozenset({"forward", "batched_reverse"})

    def init(self, g, x, coloring, *, batch_size=None, compile=False, trace=None) -> BidirectionalState:
        if not isinstance(coloring, BiColoring):
            raise InputError(f"Bidirectional evaluates a BiColoring, not a {type(coloring).__name__}")
        parts = []
        for block in coloring.seed_blocks(x.dtype, x.device):
            side = self.forward if isinstance(block, ColumnSeeds) else self.reverse
            parts.append(BatchedProducts(side.batched(g, coloring), block.matrix, batch_size=batch_size,
                                         compile=compile, trace=trace() if trace else None))
        return BidirectionalState(tuple(parts))

    def compute(self, state: BidirectionalState, x: torch.Tensor) -> torch.Tensor:
        parts = [p(x) for p in state.parts if p.nseeds]
        if not parts:
            return x.new_zeros(0)
        return parts[0] if len(parts) == 1 else torch.cat(parts)
