"""Reverse mode: one VJP per row color; the batch shares one forward pass."""

from __future__ import annotations

from torch.func import vjp, vmap

from ..coloring.result import RowSeeds
from .base import SingleDirection, check_output_size


class ReverseVJP(SingleDirection):
    """``B[c] = s_c^T J`` for the seed rows of a row coloring."""

    seed_type = RowSeeds
    name = "vmap(vjp)"
    modes = frozenset({"batched_reverse"})

    def batched(self, g, coloring):
        m = coloring.shape[0]

        def run(x, seeds):
            y, pull = vjp(g, x)
            check_output_size(y.shape[-1], m)
            return vmap(lambda s: pull(s.to(y.dtype))[0])(seeds)
        return run
