"""Rewrites of a specialized products graph for Inductor's CPU code, measured on this project's
benchmarks (the B3 Rosenbrock Hessian at n = 10^5, star coloring, one thread, AVX2):

* **padded sums**: the backward of a slice (``x[1:]``, ``x[:-1]``: every difference stencil) is
  ``slice_backward``, zero outside the slice; a sum of them is generated as one loop of masked
  vector loads, three times slower than the same arithmetic unmasked (840 us against 328 us for
  the products). :func:`split_padded_sums` rewrites such a sum as ``cat`` of the segments between
  the slices' ends, each a sum of plain slices (the zeros dropped): a loop without masks over the
  interior and small ones at the borders.
* **the final gather**: ``products.flatten()[index]`` fused into the products' kernel cost 1.6 ms
  more than the products alone (a scalar gather of 300,000 values inside the vectorized loop);
  :func:`split_final_gather` compiles the products without it and :func:`take` gathers them
  afterwards with a Numba loop (245 us; ``index_select``: 490 us).

Both are verified by the caller: the rewritten graph must reproduce the recorded one.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

__all__ = ["split_padded_sums", "split_final_gather", "take"]

aten = torch.ops.aten

#: a sum is split only while (segments x terms) stays below this: each segment repeats the sum
#: (64 shifted slices of one vector: 8,600 nodes and a compilation of 106 s instead of 25 s)
MAX_SEGMENT_TERMS = 128


def _val(node) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _is_add(node: Node) -> bool:
    return (node.op == "call_function" and node.target is aten.add.Tensor and len(node.args) == 2
            and not node.kwargs and all(isinstance(a, Node) for a in node.args))


def _terms(root: Node, shape) -> tuple[list, set] | None:
    """The operands of the tree of ``add`` nodes under ``root``, left to right, and the ``add``
    nodes opened: an inner ``add`` of the same shape used only by its parent is opened, anything
    else is a term. ``None`` past :data:`MAX_SEGMENT_TERMS` terms (``y + y`` chains double them)."""
    terms: list = []
    opened: set = set()
    stack = [root]
    while stack:
        node = stack.pop()
        v = _val(node)
        if (_is_add(node) and v is not None and tuple(v.shape) == shape
                and (node is root or len(node.users) == 1)):
            opened.add(node)
            stack.extend(reversed(node.args))
        else:
            terms.append(node)
            if len(terms) > MAX_SEGMENT_TERMS:
                return None
    return terms, opened


def _slice_range(node: Node, shape, dim: int | None) -> tuple[int, int, int] | None:
    """``(dim, start, end)`` of a ``slice_backward`` of step 1 into ``shape``, else ``None``."""
    if node.op != "call_function" or node.target is not aten.slice_backward.default or len(node.args) != 6:
        return None
    _, sizes, d, start, end, step = node.args
    if step != 1 or tuple(sizes) != shape or not all(isinstance(a, int) for a in (d, start, end)):
        return None
    d %= len(shape)
    if dim is not None and d != dim:
        return None
    length = shape[d]
    start, end = (min(max(s + length if s < 0 else s, 0), length) for s in (start, end))
    return d, start, max(start, end)


def _segment(graph, node: Node, a: int, b: int, dim: int, ranges: dict, opened: set):
    """``node`` (a term, or an ``add`` of the opened tree) on ``[a, b)`` along ``dim``, or
    ``None`` where it is zero there (a segment lies wholly inside or outside every slice). The
    tree keeps its shape: the same additions in the same order, a zero operand dropped."""
    if node in ranges:
        s, e = ranges[node]
        if s <= a and b <= e:
            return graph.call_function(aten.slice.Tensor, (node.args[0], dim, a - s, b - s))
        return None
    if node in opened:
        left, right = (_segment(graph, arg, a, b, dim, ranges, opened) for arg in node.args)
        if left is None or right is None:
            return right if left is None else left
        return graph.call_function(aten.add.Tensor, (left, right))
    return graph.call_function(aten.slice.Tensor, (node, dim, a, b))


def split_padded_sums(gm: GraphModule) -> int:
    """Rewrite every sum of ``slice_backward`` terms (and terms of the sum's own shape) along one
    dimension as ``cat`` of segment sums (see the module docstring); returns how many."""
    graph = gm.graph
    done = 0
    consumed: set = set()  # the inner sums of a rewritten one: rewritten with it
    for node in reversed(list(graph.nodes)):
        if node in consumed or not _is_add(node) or not node.users:
            continue
        v = _val(node)
        if v is None or v.dim() == 0:
            continue
        shape = tuple(v.shape)
        found = _terms(node, shape)
        if found is None:
            continue
        terms, opened = found
        ranges = {}
        dim = None
        for t in terms:
            r = _slice_range(t, shape, dim)
            if r is not None:
                dim = r[0]
                ranges[t] = r[1:]
        tv = [_val(t) for t in terms]
        if (not ranges or len(terms) < 2 or shape[dim] == 0
                or any(t is None or tuple(t.shape) != shape or t.dtype != v.dtype for t in tv)):
            continue
        cuts = sorted({0, shape[dim]} | {c for r in ranges.values() for c in r})
        if (len(cuts) - 1) * len(terms) > MAX_SEGMENT_TERMS:
            continue
        with graph.inserting_before(node):
            parts = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                part = _segment(graph, node, a, b, dim, ranges, opened)
                if part is None:  # no term reaches here: zeros, on the device of the operands
                    size = list(shape)
                    size[dim] = b - a
                    ref = terms[0].args[0] if terms[0] in ranges else terms[0]
                    part = graph.call_function(aten.new_zeros.default, (ref, size), {"dtype": v.dtype})
                parts.append(part)
            new = graph.call_function(aten.cat.default, (parts, dim))
        node.replace_all_uses_with(new)
        consumed |= opened
        done += 1
    if done:
        graph.eliminate_dead_code()
        gm.recompile()
    return done


def _takeable_index(src, index, placeholders: list, args: list, constants) -> torch.Tensor | None:
    """The index tensor that :func:`take` may read unchecked for a gather of ``src`` by ``index``
    (nodes of a graph whose placeholders are ``placeholders`` and example inputs ``args``): the
    input at one of the positions ``constants`` (inputs nothing else writes), a contiguous 1-D
    int64 CPU tensor in range of a 1-D floating ``src`` (its ``meta["val"]``); else ``None``."""
    if not (isinstance(src, Node) and isinstance(index, Node) and index in placeholders
            and placeholders.index(index) in constants):
        return None
    idx, sv = args[placeholders.index(index)], _val(src)
    if (sv is None or sv.dim() != 1 or sv.dtype not in (torch.float32, torch.float64)
            or not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64 or idx.dim() != 1
            or not idx.is_contiguous() or idx.device.type != "cpu"):
        return None
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= sv.shape[0]):
        return None
    return idx


def split_final_gather(gm: GraphModule, args: list, constants) -> tuple[GraphModule, torch.Tensor] | None:
    """``(products_gm, index)`` where ``gm`` returns ``flat[index]`` of a 1-D floating ``flat`` and
    an ``index`` that is the graph's input at one of the positions ``constants`` (inputs nothing
    else writes: the operator's own, read without bounds checks at every call), in range:
    ``products_gm`` returns ``flat``, to be gathered by :func:`take`. ``None`` for any other graph."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    node = out.args[0]
    while isinstance(node, Node) and node.op == "call_function" and node.target in (
            aten.reshape.default, aten.view.default) and len(node.users) == 1:
        src = _val(node.args[0]) if isinstance(node.args[0], Node) else None
        size = list(node.args[1]) if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else None
        if src is None or src.dim() != 1 or size not in ([-1], [src.shape[0]]):  # a 1-D result viewed as 1-D
            break
        node = node.args[0]
    if not (isinstance(node, Node) and node.op == "call_function"):
        return None
    if (node.target in (aten._unsafe_index.Tensor, aten.index.Tensor) and len(node.args) == 2
            and len(node.args[1]) == 1):
        flat, index = node.args[0], node.args[1][0]
    elif node.target is aten.index_select.default and len(node.args) == 3 and node.args[1] == 0:
        flat, index = node.args[0], node.args[2]
    else:
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    idx = _takeable_index(flat, index, placeholders, args, constants)
    if idx is None:
        return None
    graph = torch.fx.Graph()
    env: dict = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            graph.output(env[flat])
            break
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.eliminate_dead_code()
    products = GraphModule(gm, graph)
    return products, idx


def with_meta(gm: GraphModule, args):
    """``gm(*args)``, recording every node's ``meta["val"]`` (on the meta device) on the way."""

    class _Meta(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if isinstance(out, torch.Tensor):
                n.meta["val"] = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="meta")
            return out

    return _Meta(gm).run(*args)


def gathers_as_take(gm: GraphModule, args: list, constants) -> int:
    """Rewrite, in place, every ``index_select(src, 0, index)`` of ``gm`` whose ``src`` is a 1-D
    floating CPU tensor and whose ``index`` is the graph's input at one of the positions
    ``constants`` (inputs nothing else writes, read without bounds checks at every call), a
    contiguous int64 CPU tensor in range of ``src``: it becomes :func:`take`. Reads the nodes'
    ``meta["val"]`` (:func:`with_meta`); a graph with an input off the CPU is left alone. Returns
    the number of gathers rewritten."""
    if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
        return 0  # the values recorded are meta tensors: the graph's device is its inputs'
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    done = 0
    for node in gm.graph.nodes:
        if not (node.op == "call_function" and node.target is aten.index_select.default and len(node.args) == 3
                and not node.kwargs and node.args[1] == 0):
            continue
        src, index = node.args[0], node.args[2]
        if _takeable_index(src, index, placeholders, args, constants) is None:
            continue
        node.target = take
        node.args = (src, index)
        done += 1
    if done:
        gm.recompile()
    return done


def take(flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``flat[index]`` for an ``index`` checked in range by :func:`_takeable_index` (a ``flat``
    that records a gradient is gathered by ``index_select``, which keeps it)."""
    if flat.requires_grad:
        if torch.is_grad_enabled():
            return flat.index_select(0, index)
        flat = flat.detach()
    kernel = _TAKE_INTO[0] if _TAKE_INTO else _take_kernel()
    out = torch.empty(index.shape[0], dtype=flat.dtype, device=flat.device)  # not the default device
    kernel(flat.contiguous().numpy(), index.numpy(), out.numpy())
    return out


#: the Numba kernel once loaded (imported at the first gather: ``import asd`` never loads Numba's kernels)
_TAKE_INTO: list = []


def _take_kernel():
    from ._take_kernel import take_into

    _TAKE_INTO.append(take_into)
    return take_into
