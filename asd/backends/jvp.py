"""Forward mode: one JVP per column color, batched with ``vmap``."""

from __future__ import annotations

from torch.func import jvp, vmap

from ..coloring.result import ColumnSeeds
from .base import SingleDirection


class ForwardJVP(SingleDirection):
    """``B[c] = J @ s_c`` for the seed rows of a column coloring."""

    seed_type = ColumnSeeds

    def batched(self, g):
        def run(x, seeds):
            return vmap(lambda s: jvp(g, (x,), (s,))[1])(seeds)
        return run
