"""Eager replay of a recorded products graph: the fastest exact variant, measured.

A recorded graph (:mod:`asd.backends.traced`) still computes, on every call, what depends on the
operator's constants only (the stencil applied to the seed rows in a JVP) and every product the
gather then throws away. :mod:`asd.backends.specialize` removes both for the compiler; eager
replay uses the same rewritings when they pay off without one. The variants are

* the recorded graph (dead intermediates reused, :func:`~asd.backends.graph_passes.reuse_buffers`),
* the graph with the constant-only operations folded,
* folded, with the gather pushed into the elementwise products,
* folded, and written as one generated Numba loop nest with the gather where what is left is
  elementwise arithmetic (:mod:`asd.backends.fused_loops`, products of at least
  :data:`FUSED_MIN_ELEMENTS`),

and a variant is a candidate only if it returns the recorded graph's bits exactly on the example
input and on a random point near it (the same operations on the same operands). Each
candidate is timed and the fastest is kept: whether fewer operations on gathered operands beat
more operations on contiguous ones depends on the sizes and the machine. A call that records an
autograd graph (``x`` requires grad) replays the recorded graph, whose gradients are the ones
tested against the transforms'.

Building the variants costs tens to hundreds of milliseconds at the recording call, so it is tried
only where the recorded shapes promise a gain (:func:`_prospects`).
"""

from __future__ import annotations

import copy
import operator
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["Replay", "eager_replay", "MAX_EAGER_EXTRA_BYTES", "TIMING_ROUNDS"]

#: folded constants an eager operator may keep beyond the constants they are computed from
MAX_EAGER_EXTRA_BYTES = 64 << 20
#: timed calls of each candidate (the fastest of them counts)
TIMING_ROUNDS = 5
#: folding is tried when operations reading only constants compute at least this share of the
#: elements the graph computes (building the variants costs up to a second for 10^5 unknowns)
MIN_FOLDED_SHARE = 0.2
#: the gather is pushed down when it keeps at most this share of the products
MAX_GATHERED_SHARE = 0.75
#: the folded graph is compiled as one Numba loop nest when its joined products hold at least this
#: many elements (below, the ATen calls' cost is mostly their fixed cost, and a kernel's first
#: compilation, about 0.15 s, would not pay off)
FUSED_MIN_ELEMENTS = 1 << 14


@dataclass(eq=False)
class Replay:
    """Runs a recorded graph eagerly: ``fast`` where no gradient is recorded, ``plain`` otherwise."""

    plain: Callable
    fast: Callable
    #: which variant ``fast`` is, and what was measured (seconds, fastest of the timed calls)
    chosen: str = "recorded"
    timings: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    #: the tensors the recorded graph holds (``f``'s parameters and captured tensors among them):
    #: with grad enabled, a replay records a gradient where one of them requires grad
    reads: tuple = ()

    def records_grad(self) -> bool:
        """Whether a replay with grad enabled would record a gradient through what the graph holds."""
        return any(t.requires_grad for t in self.reads)

    def __call__(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        # a torch-function mode or subclass sees the recorded ATen calls, not the fast variant's torch.* ones
        if ((x.requires_grad and torch.is_grad_enabled()) or type(x) is not torch.Tensor
                or torch._C._is_torch_function_mode_enabled()):
            return self.plain(x, seeds)
        return self.fast(x, seeds)


_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bits (``-0.0`` is not ``0.0``, ``inf`` is not the
    largest float; NaNs must match in payload too: a stricter check refuses a variant, never more)."""
    if not (isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        bits = _BITS[a.element_size()]
        a, b = a.contiguous().view(bits), b.contiguous().view(bits)
    return bool(torch.equal(a, b))


def _seconds(fn: Callable, x, seeds) -> float:
    t0 = time.perf_counter()
    fn(x, seeds)
    return time.perf_counter() - t0


def _index_select(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Gathers of one index (``_unsafe_index``, for the compiler) as ``index_select``: the eager
    kernel of ``_unsafe_index`` is advanced indexing, about ten times slower on the CPU."""
    aten = torch.ops.aten
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten._unsafe_index.Tensor:
            src, indices = node.args
            dims = [i for i, a in enumerate(indices) if a is not None]
            if len(dims) == 1 and dims[0] == len(indices) - 1:
                node.target = aten.index_select.default
                node.args = (src, dims[0], indices[dims[0]])
    gm.recompile()
    return gm


def _runner(spec, example: list) -> Callable:
    """``spec`` as a function of ``(x, seeds)``. On the CPU the gathers by the specialization's own
    constant indices run in :func:`asd.backends.cpu_kernels.take` (half the time of
    ``index_select``); gradients scattered into disjoint slots and summed are written into one
    buffer (:func:`~asd.backends.graph_passes.sum_slots`); the parts of a ``stack``/``cat`` are
    computed into the joined buffer (:func:`~asd.backends.graph_passes.join_in_place`); views that
    change nothing go, a product by seed rows is added by ``addcmul``
    (:func:`~asd.backends.graph_passes.fuse_multiply_add`), and the elementwise operations and
    views are called through ``torch.*`` and ``Tensor`` methods
    (:func:`~asd.backends.graph_passes.public_bindings`)."""
    from .cpu_kernels import gathers_as_take, with_meta
    from .graph_passes import (drop_identity_views, fuse_multiply_add, join_in_place, public_bindings, reuse_buffers,
                               sum_slots, unit_valued)

    gm = _index_select(spec.gm)
    runtime, extras = spec.runtime, spec.extras
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # the specialization's own constants (never written) whose elements are 0, 1 or -1: seed rows,
    # masks folded from them (a tensor of f's is read by reference: its values may change)
    units = [] if spec.by_reference is None else [
        placeholders[len(runtime) + i] for i, t in enumerate(extras)
        if i not in spec.by_reference and len(runtime) + i < len(placeholders) and unit_valued(t)]
    # None: every extra may be f's own (then no index qualifies); eager replay specializes CPU graphs only
    if spec.by_reference is not None and all(a.device.type == "cpu" for a in example if isinstance(a, torch.Tensor)):
        nrun = len(runtime)
        with torch.no_grad():
            with_meta(gm, example)
        gathers_as_take(gm, example, {nrun + i for i in range(len(extras)) if i not in spec.by_reference})
    gm = _with_tensor_meta(gm, example)
    drop_identity_views(gm)
    if sum_slots(gm):
        gm = _with_tensor_meta(gm, example)
    if join_in_place(gm):
        gm = _with_tensor_meta(gm, example)
    if fuse_multiply_add(gm, units):
        gm = _with_tensor_meta(gm, example)
    gm = reuse_buffers(gm)
    if all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in extras if isinstance(t, torch.Tensor)):
        public_bindings(gm)  # (a subclass of f's own would see other calls in its __torch_function__)

    def run(x, seeds, _forward=gm.forward, _runtime=runtime, _extras=extras):
        inputs = (x, seeds)
        return _forward(*[inputs[i] for i in _runtime], *_extras)

    run.gm = gm
    return run


def _exact(run: Callable, points: list, wants: list, notes: list) -> bool:
    """Whether the variant ``run`` gives the recorded graph's bits ``wants`` at ``points``; a note
    where it does not or raises (a loop nest's kernel is compiled at its first call: its failure
    costs that variant only)."""
    try:
        with torch.no_grad():
            got = [run(*p) for p in points]
    except Exception as exc:  # noqa: BLE001
        notes.append(f"{run.variant}: {type(exc).__name__}")
        return False
    if all(_same(a, b) for a, b in zip(got, wants)):
        return True
    notes.append(f"{run.variant}: not the recorded graph's bits")
    return False


def _fused(spec, gm: torch.fx.GraphModule, run: Callable, inputs: list, notes: list) -> Callable | None:
    """The folded graph ``gm`` (``spec``'s, as ATen calls) as one generated loop nest (:mod:`asd.backends.fused_loops`), a
    function of ``(x, seeds)`` falling back on ``run`` (the same graph by ATen) where a call's inputs
    are not laid out as the example's; ``None`` where the graph does not qualify or is smaller than
    :data:`FUSED_MIN_ELEMENTS`."""
    if spec.by_reference is None:
        return None
    from .fused_loops import fused_runner

    nrun = len(spec.runtime)
    constant = {nrun + i for i in range(len(spec.extras)) if i not in spec.by_reference}
    try:
        inner = fused_runner(_index_select(gm), spec.arguments(inputs), constant=constant,
                             fallback=run.gm.forward, min_elements=FUSED_MIN_ELEMENTS)
    except Exception as exc:  # noqa: BLE001 - an optimization (a kernel file that cannot be read, say)
        notes.append(f"fused: {type(exc).__name__}")
        return None
    if inner is None:
        return None

    def fused(x, seeds, _inner=inner, _runtime=spec.runtime, _extras=spec.extras):
        both = (x, seeds)
        return _inner(*[both[i] for i in _runtime], *_extras)

    fused.variant = "fused"
    fused.gm = run.gm
    return fused


def _with_tensor_meta(gm, args):
    from torch.fx.passes.shape_prop import ShapeProp

    with torch.no_grad():
        ShapeProp(gm).propagate(*args)
    return gm


def _prospects(gm: torch.fx.GraphModule, constant_inputs, owned) -> tuple[float, float, int]:
    """``(folded share, gathered share, fusible)``: the share of the elements the graph computes
    that read only constants, the share of the products the final gather keeps (1 without one),
    and, where every operation that reads more than constants is one a generated loop nest may
    hold (:data:`~asd.backends.fused_loops.KNOWN_TARGETS`), the most elements one of them computes
    (0 elsewhere); read off the recorded shapes without running anything."""
    from .fused_loops import KNOWN_TARGETS

    from torch.fx import Node
    from torch.utils._pytree import tree_flatten

    from .specialize import _ALIASES

    aten = torch.ops.aten
    owned_ids = {id(t) for t in owned}
    const: set = set()
    folded = total = largest = 0
    fusible = True
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    const.update(phs[i] for i in constant_inputs)
    for node in gm.graph.nodes:
        if node.op == "get_attr" and id(getattr(gm, node.target, None)) in owned_ids:
            const.add(node)
        if node.op != "call_function":
            continue
        ins = [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, Node)]
        val = node.meta.get("val")
        numel = val.numel() if isinstance(val, torch.Tensor) else 0
        view = node.target is operator.getitem or getattr(node.target, "overloadpacket", None) in _ALIASES
        if ins and all(a in const for a in ins):
            const.add(node)
            folded += 0 if view else numel
        else:
            fusible = fusible and (node.target in KNOWN_TARGETS or node.target is aten._unsafe_index.Tensor)
            largest = max(largest, 0 if view else numel)
        total += 0 if view else numel
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    while isinstance(out, Node) and out.op == "call_function" and out.target in (aten.reshape.default, aten.view.default):
        out = out.args[0]
    gathered = 1.0
    if (isinstance(out, Node) and out.op == "call_function"
            and out.target in (aten.index_select.default, aten._unsafe_index.Tensor)):
        src, val = out.args[0].meta.get("val"), out.meta.get("val")
        if isinstance(src, torch.Tensor) and isinstance(val, torch.Tensor) and src.numel():
            gathered = val.numel() / src.numel()
    return (folded / total if total else 0.0), gathered, (largest if fusible else 0)


def eager_replay(gm: torch.fx.GraphModule, x: torch.Tensor, seeds: torch.Tensor, *, constant_seeds: bool,
                 owned=()) -> Replay:
    """The fastest exact eager replay of the recorded graph ``gm(x, seeds)`` (see the module)."""
    from .graph_passes import reuse_buffers
    from .specialize import candidates, functional, nearby

    variants: dict[str, Callable] = {}
    notes: list[str] = []
    constants = [1] if constant_seeds else []
    fold, push, fuse = False, False, False
    if x.device.type == "cpu" and (constant_seeds or owned):
        share, gathered, fusible = _prospects(gm, constants, owned)
        fold, push = share >= MIN_FOLDED_SHARE, gathered <= MAX_GATHERED_SHARE
        fuse = fusible >= FUSED_MIN_ELEMENTS and x.dtype in (torch.float32, torch.float64)
        if not (fold or push or fuse):
            notes.append(f"not specialized: {share:.0%} of the work folds, the gather keeps {gathered:.0%}")
    if fold or push or fuse:
        # (seeds that are an input of the variants, not constants they fold, move too: 0/1 rows
        # would hide a variant that reads the wrong ones)
        points = [(x, seeds), tuple(nearby([x, seeds], constants))]
        with torch.no_grad():
            wants = [gm(*p) for p in points]
        if not all(bool(torch.isfinite(w).all()) for w in wants if w.is_floating_point() or w.is_complex()):
            fold = push = fuse = False  # NaN or inf at the check points would hide a wrong variant
            notes.append("not specialized: the products are not finite at the example")
    if fold or push or fuse:
        try:
            flat = functional(gm, [x, seeds])
            specs, more = candidates(flat, [x, seeds], constant_inputs=constants, owned=owned, push=push,
                                     max_extra_bytes=MAX_EAGER_EXTRA_BYTES)
            notes += more
        except Exception as exc:  # noqa: BLE001 - an optimization: the recorded graph stays
            specs = []
            notes.append(f"not specialized: {type(exc).__name__}")
        for spec in specs:
            name = "pushed" if spec.pushed else "folded"
            # (the runner's passes rewrite the graph in place; the loop nest is written from the ATen one)
            aten_gm = None if spec.pushed else torch.fx.GraphModule(spec.gm, copy.deepcopy(spec.gm.graph))
            try:
                run = _runner(spec, spec.arguments([x, seeds]))
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{name}: {type(exc).__name__}")
                continue
            run.variant = name
            if not _exact(run, points, wants, notes):
                continue
            variants[name] = run
            if not spec.pushed and fuse:
                fused = _fused(spec, aten_gm, run, [x, seeds], notes)
                if fused is not None and _exact(fused, points, wants, notes):
                    variants[fused.variant] = fused
    plain = reuse_buffers(gm)
    plain.variant = "recorded"
    reads = held_tensors(gm)
    if not variants:
        return Replay(plain, plain, notes=notes, reads=reads)
    variants = {"recorded": plain, **variants}
    timings = {name: float("inf") for name in variants}
    with torch.no_grad():
        for name, run in variants.items():
            run(x, seeds)  # first touch of its buffers
        for _ in range(TIMING_ROUNDS):  # interleaved: a busy moment hits every candidate alike
            for name, run in variants.items():
                timings[name] = min(timings[name], _seconds(run, x, seeds))
    chosen = min(timings, key=timings.get)
    return Replay(plain, variants[chosen], chosen=chosen, timings=timings, notes=notes, reads=reads)


def held_tensors(gm: torch.fx.GraphModule) -> tuple:
    """The tensors a graph reads through its attributes (``get_attr`` nodes)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = gm
        for name in node.target.split("."):
            value = getattr(value, name)
        if isinstance(value, torch.Tensor):
            out.append(value)
    return tuple(out)
