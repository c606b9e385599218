"""Plain ``torch.autograd``, one product at a time: the backend of last resort.

It runs where ``torch.func``'s batched transforms cannot: sparse tensors built inside the
function, custom ``autograd.Function``s without vmap rules, randomness, in-place updates of
captured buffers. Reverse products share one forward pass (one graph, one ``autograd.grad`` per
seed); forward products use dual numbers, each with the same random-number state, so a
function that draws random numbers sees the same draws in every product, as in one evaluation.
Hessian-vector products differentiate the gradient's graph again (double backward). The values
it returns are not differentiable with respect to ``x``; they are with respect to the tensors ``f``
reads that require grad (its parameters), where gradients are recorded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._python_dispatch import TorchDispatchMode

from ..coloring.result import AcyclicColoring, ColumnSeeds, StarColoring
from ..errors import AsdError
from .base import Backend, check_output_size, seed_block_types
from .traced import _rng_state, _same_rng_state, _set_rng_state

_MIXED_DRAWS = ("asd: f draws random numbers, and another thread drew from the same generator while f was "
                "evaluated once per seed: the products saw different draws. Share a lock between the threads "
                "around the calls")
_OWN_GENERATOR = ("asd: f draws random numbers from a torch.Generator of its own, which asd cannot set back: "
                  "evaluated once per seed (the forward-mode autograd loop), each product would see other draws. "
                  "Draw from the default generator, or use mode='reverse'")


class _SeededOps(TorchDispatchMode):
    """Notes whether the ops run under it draw random numbers, and whether from a generator passed
    to them (one the caller cannot set back)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self):
        super().__init__()
        self.draws = False
        self.own_generator = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.draws = True
            if kwargs.get("generator") is not None or any(isinstance(a, torch.Generator) for a in args):
                self.own_generator = True
        return func(*args, **kwargs)


@dataclass(frozen=True, eq=False)
class LoopState:
    g: object
    blocks: tuple
    hessian: bool
    m: int
    batch_size: int | None


def _rows(block) -> torch.Tensor:
    return block.matrix


class AutogradLoop(Backend):
    """Products one seed at a time with plain autograd (see the module docstring)."""

    name = "autograd loop"

    def ad_modes(self, coloring) -> frozenset:
        """Dual numbers for column seeds; plain reverse mode (and double backward) for row seeds
        and Hessians."""
        if isinstance(coloring, (StarColoring, AcyclicColoring)):
            return frozenset({"reverse"})
        types = seed_block_types(coloring)
        modes = {"forward" if issubclass(t, ColumnSeeds) else "reverse" for t in types}
        return frozenset(modes)

    def init(self, g, x, coloring, *, batch_size=None, compile=False, trace=None) -> LoopState:
        blocks = coloring.seed_blocks(x.dtype, x.device)
        return LoopState(g, tuple(blocks), isinstance(coloring, (StarColoring, AcyclicColoring)),
                         coloring.shape[0], batch_size)

    def compute(self, state: LoopState, x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        recording = torch.is_grad_enabled()
        parts = []
        for block in state.blocks:
            S = _rows(block)
            if S.shape[0] == 0:
                continue
            if state.hessian:
                parts.append(self._hvps(state.g, x, S, recording))
            elif isinstance(block, ColumnSeeds):
                parts.append(self._jvps(state.g, x, S, state.m))
            else:
                parts.append(self._vjps(state.g, x, S, state.m, recording))
        if not parts:
            return x.new_zeros(0)
        if len(parts) == 1:  # a fresh tensor of its own: no second copy (tens of MB at 10^6 unknowns)
            return parts[0].reshape(-1)
        return torch.cat([p.reshape(-1) for p in parts])

    @staticmethod
    def _vjps(g, x, S, m, recording: bool = False) -> torch.Tensor:
        with torch.enable_grad():
            xr = x.clone().requires_grad_(True)
            y = g(xr)
            check_output_size(y.numel(), m)
            create_graph = recording and reads_parameters(y, xr)
            out = []
            for s in S:
                # a scalar's gradient instead of grad_outputs=s (the same bits: the backward of the
                # sum and the product by s starts from exactly s): autograd's grad_outputs check
                # imports sympy, 0.45 s of cold start
                s = s.to(y.dtype)
                if y.is_complex():  # a complex scalar has no implicit gradient
                    (gx,) = torch.autograd.grad(y, xr, s, retain_graph=True, create_graph=create_graph,
                                                allow_unused=True)
                else:
                    (gx,) = torch.autograd.grad((y * s).sum(), xr, retain_graph=True, create_graph=create_graph,
                                                allow_unused=True)
                out.append(torch.zeros_like(x) if gx is None else gx)
        return torch.stack(out)

    @staticmethod
    def _jvps(g, x, S, m) -> torch.Tensor:
        """One forward-mode evaluation of ``g`` per seed. Where ``g`` draws random numbers (an op
        tagged ``nondeterministic_seeded`` at the first evaluation), every evaluation draws the same
        ones: the process's generators are set back before each. Where it draws none they are left
        alone (another thread drawing meanwhile would draw its numbers again). :class:`AsdError`
        where the draws cannot be repeated (a generator of ``g``'s own) or were not (evaluations
        that leave the generators in different states: another thread drew meanwhile)."""
        rng = _rng_state(x)
        draws = after = None
        out = []
        for s in S:
            if draws:
                _set_rng_state(x, rng)
            with fwAD.dual_level(), (_SeededOps() if draws is None else contextlib.nullcontext()) as seen:
                y = g(fwAD.make_dual(x, s))
                tangent = fwAD.unpack_dual(y).tangent
            check_output_size(y.numel(), m)
            out.append(torch.zeros(m, dtype=y.dtype, device=x.device) if tangent is None else tangent.reshape(-1))
            if draws is None:
                draws = seen.draws
                if seen.own_generator:
                    raise AsdError(_OWN_GENERATOR)
                after = _rng_state(x)
            elif draws and not _same_rng_state(_rng_state(x), after):
                raise AsdError(_MIXED_DRAWS)
        return torch.stack(out)

    @staticmethod
    def _hvps(g, x, S, recording: bool = False) -> torch.Tensor:
        with torch.enable_grad():
            xr = x.clone().requires_grad_(True)
            y = g(xr)
            create_graph = recording and reads_parameters(y, xr)
            (gr,) = torch.autograd.grad(y, xr, create_graph=True)
            out = []
            for s in S:
                if not gr.requires_grad:  # the gradient does not depend on x: a zero Hessian
                    out.append(torch.zeros_like(x))
                    continue
                (hv,) = torch.autograd.grad((gr * s).sum(), xr, retain_graph=True, create_graph=create_graph,
                                            allow_unused=True)
                out.append(torch.zeros_like(x) if hv is None else hv)
        return torch.stack(out)


def reads_parameters(y: torch.Tensor, xr: torch.Tensor) -> bool:
    """Whether ``y``'s graph reaches a tensor that requires grad other than the leaf ``xr``: a
    parameter of ``f``, whose gradient the products must then record (``create_graph``)."""
    fn = y.grad_fn
    if fn is None:
        return y.requires_grad and y is not xr
    seen, stack = {fn}, [fn]
    while stack:
        node = stack.pop()
        if getattr(node, "variable", xr) is not xr:  # AccumulateGrad of another leaf
            return True
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return False
