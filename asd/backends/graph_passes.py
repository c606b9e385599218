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
