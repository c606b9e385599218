"""Exact clean-ups of a recorded graph of ATen operations.

A graph recorded from ``torch.func``'s transforms still computes what the products never use (the
primal output of a VJP) and repeats pure operations (a backward formula that multiplies by the same
saved value twice). Removing both changes no result bit: every remaining operation runs on the same
operands in the same order.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

__all__ = ["simplify"]


def _pure(target) -> bool:
    return (isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in target.tags)


def _key(a):
    if isinstance(a, Node):
        return ("node", id(a))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_key(b) for b in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(a.items())))
    if isinstance(a, float):
        return ("float", repr(a))  # 0.0 and -0.0, or two NaNs, are not interchangeable
    if isinstance(a, (bool, int, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format)):
        return (type(a).__name__, a)
    raise TypeError(type(a))


def _cse(graph) -> int:
    seen: dict = {}
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not _pure(node.target):
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
        except TypeError:  # a tensor or another unhashable constant argument: keep the node
            continue
        prev = seen.get(key)
        if prev is None:
            seen[key] = node
        else:
            node.replace_all_uses_with(prev)
            graph.erase_node(node)
            merged += 1
    return merged


def simplify(gm: GraphModule) -> GraphModule:
    """Remove dead and repeated operations from ``gm`` in place and return it.

    Repeated operations are merged only in graphs without mutating operations, where a value
    cannot change between two reads of it.
    """
    graph = gm.graph
    functional = all(n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload)
                     or not n.target._schema.is_mutable for n in graph.nodes)
    if functional:
        _cse(graph)
    graph.eliminate_dead_code()
    gm.recompile()
    return gm


_aten = torch.ops.aten
#: functional pointwise ops and their in-place twins (the same kernel writing into its first operand)
_IN_PLACE = {
    _aten.add.Tensor: _aten.add_.Tensor, _aten.sub.Tensor: _aten.sub_.Tensor,
    _aten.mul.Tensor: _aten.mul_.Tensor, _aten.div.Tensor: _aten.div_.Tensor,
    _aten.neg.default: _aten.neg_.default,
}
#: exactly commutative in IEEE arithmetic: the operands may be swapped to write into the second
_COMMUTATIVE = {_aten.add.Tensor, _aten.mul.Tensor}
#: ops whose output is always a new tensor of their own
_FRESH = {_aten.roll.default, _aten.cat.default, _aten.stack.default, _aten.index_select.default,
          _aten.clone.default}


def _fresh(node: Node) -> bool:
    t = node.target
    if node.op != "call_function":
        return False
    if t in _FRESH or t is _take():
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    return (torch.Tag.pointwise in t.tags and not t._schema.is_mutable and len(t._schema.returns) == 1
            and t._schema.returns[0].alias_info is None)


def _take():
    from .cpu_kernels import take  # a new tensor of its own, like index_select

    return take


def _contiguous_meta(node) -> "object | None":
    m = node.meta.get("tensor_meta") if isinstance(node, Node) else None
    if m is None or not hasattr(m, "stride"):
        return None
    expected, step = [], 1
    for size in reversed(m.shape):
        expected.append(step)
        step *= max(size, 1)
    if any(s != 1 and st != e for s, st, e in zip(reversed(m.shape), reversed(m.stride), expected)):
        return None
    return m


def _reusable(s, out_meta) -> bool:
    if not isinstance(s, Node) or len(s.users) != 1 or not _fresh(s):
        return False
    m = _contiguous_meta(s)
    return m is not None and tuple(m.shape) == tuple(out_meta.shape) and m.dtype == out_meta.dtype


def reuse_buffers(gm: GraphModule) -> GraphModule:
    """Write pointwise results into an operand's buffer where that operand is a fresh intermediate
    used nowhere else, in place in ``gm`` (for eager replay; a compiler plans its own buffers).

    The in-place twin runs the same kernel on the same operands in the same order: the same bits,
    without allocating and first-touching a new buffer.
    """
    graph = gm.graph
    for node in list(graph.nodes):
        target = node.target
        if node.op != "call_function" or target not in _IN_PLACE or node.kwargs:
            continue
        out_meta = _contiguous_meta(node)
        if out_meta is None:
            continue
        args = list(node.args)
        if not _reusable(args[0], out_meta):
            first = _contiguous_meta(args[0])
            if (target in _COMMUTATIVE and len(args) == 2 and first is not None
                    and tuple(first.shape) == tuple(out_meta.shape) and _reusable(args[1], out_meta)):
                args = [args[1], args[0]]
            else:
                continue
        node.target = _IN_PLACE[target]
        node.args = tuple(args)
    gm.recompile()
    return gm
