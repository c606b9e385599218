"""Reverse mode: one VJP per row color; the batch shares one forward pass."""

from __future__ import annotations

from torch.func import vjp, vmap

from ..coloring.result import RowSeeds
from .base import SingleDirection


class ReverseVJP(SingleDirection):
    """``B[c] = s_c^T J`` for the seed rows of a row coloring."""

    seed_type = RowSeeds

    def batched(self, g):
        def run(x, seeds):
            _, pull = vjp(g, x)
            return vmap(lambda s: pull(s)[0])(seeds)
        return run
