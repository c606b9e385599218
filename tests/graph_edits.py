"""Deliberately wrong rewritings of recorded graphs, for the tests of the checks that must refuse them."""

import torch


def read_input_reversed(gm: torch.fx.GraphModule) -> None:
    """``gm`` reads its first input reversed (invisible at an input of equal entries)."""
    ph = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(ph):
        flipped = gm.graph.call_function(torch.ops.aten.flip.default, (ph, [0]))
    ph.replace_all_uses_with(flipped, delete_user_cb=lambda user: user is not flipped)
    gm.recompile()


def scale_output(gm: torch.fx.GraphModule, factor: float = 1 + 2.0 ** -50) -> None:
    """``gm``'s result a few ulps off."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        scaled = gm.graph.call_function(torch.ops.aten.mul.Tensor, (out.args[0], factor))
    out.args = (scaled,)
    gm.recompile()
