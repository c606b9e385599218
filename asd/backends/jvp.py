"""Forward mode: one JVP per column color, batched with ``vmap``."""

from __future__ import annotations

from torch.func import jvp, vmap

from ..coloring.result import ColumnSeeds
from .base import SingleDirection, check_output_size


class ForwardJVP(SingleDirection):
    """``B[c] = J @ s_c`` for the seed rows of a column coloring."""

    seed_type = ColumnSeeds
    name = "vmap(jvp)"
    modes = frozenset({"forward"})

    def batched(self, g, coloring):
        m = coloring.shape[0]

        def run(x, seeds):
            out = vmap(lambda s: jvp(g, (x,), (s,))[1])(seeds)
            check_output_size(out.shape[-1], m)
            return out
        return run
