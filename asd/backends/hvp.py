"""Hessian-vector products for symmetric (star, acyclic) colorings: ``B[c] = H @ s_c``."""

from __future__ import annotations

from torch.func import grad, grad_and_value, jvp, vjp, vmap

from ..coloring.result import ColumnSeeds
from .base import SingleDirection


class ForwardOverReverseHVP(SingleDirection):
    """``jvp`` of ``grad`` (the default: exact where PyTorch's double backward is not)."""

    seed_type = ColumnSeeds
    name = "vmap(jvp(grad))"
    modes = frozenset({"forward", "forward_over_reverse"})

    def batched(self, g, coloring):
        dg = grad(g)

        def run(x, seeds):
            return vmap(lambda s: jvp(dg, (x,), (s,))[1])(seeds)
        return run



class ReverseOverForwardHVP(SingleDirection):
    """``grad`` of ``jvp``: often faster eagerly; PyTorch's double-backward formulas of a few ops
    (``cumprod`` at a zero) give NaN where forward-over-reverse is exact."""

    seed_type = ColumnSeeds
    name = "vmap(grad(jvp))"
    modes = frozenset({"forward", "reverse_over_forward"})

    def batched(self, g, coloring):
        def run(x, seeds):
            def hv(s):
                return grad(lambda v: jvp(g, (v,), (s,))[1])(x)
            return vmap(hv)(seeds)
        return run


class ReverseOverReverseHVP(SingleDirection):
    """``vjp`` of ``grad``: no forward-mode formula needed (ops without one, e.g. ``cdist``)."""

    seed_type = ColumnSeeds
    name = "vmap(vjp(grad))"
    modes = frozenset({"batched_reverse"})

    def batched(self, g, coloring):
        dg = grad(g)

        def run(x, seeds):
            _, pull = vjp(dg, x)
            return vmap(lambda s: pull(s)[0])(seeds)
        return run


def value_grad_hvp(g):
    """``fn(x, seeds) -> (f(x), grad f(x), H @ seeds)``: forward-over-reverse with the primal kept."""
    gv = grad_and_value(g)

    def run(x, seeds):
        (gr, val), (hs, _) = vmap(lambda s: jvp(gv, (x,), (s,)), out_dims=((None, None), (0, 0)))(seeds)
        return val, gr, hs
    return run
