"""Recording the ATen operations of one call into an FX graph, the way ``make_fx`` does in its
"real" mode, without importing Dynamo.

``make_fx`` imports ``torch._dynamo`` and Inductor's configuration (about a second in a fresh
process), which a process that loads an already compiled operator otherwise never needs. The
batched products run under a ``TorchDispatchMode`` that sees the ATen operations ``torch.func``'s
transforms leave (forward-mode tangents, backward formulas, batching rules all end as plain ATen
calls on plain tensors) and appends each to a graph: a tensor produced by a recorded operation is
that operation's node, an input is a placeholder, and any other tensor (one ``f`` captured) is an
attribute of the graph module, read by reference, as with ``make_fx``. The recorded graph is run
once on the same inputs and must reproduce the call's result bit for bit; an operation whose result
is not a tensor (``.item()``) or whose shape depends on the data (``nonzero``, boolean masks),
values that would be baked into what follows, refuses the recording.
Either way the caller falls back to ``make_fx``.
"""

from __future__ import annotations

import operator
import weakref

import torch
from torch.fx import Graph, GraphModule, Node
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map

__all__ = ["record", "RecordingError"]


class RecordingError(RuntimeError):
    """The call cannot be recorded this way (the caller uses ``make_fx``)."""


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # otherwise TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose first
        # call imports torch._dynamo (2-3 s of a fresh process); nothing here is ever compiled
        return False

    def __init__(self):
        super().__init__()
        self.graph = Graph()
        self.root = torch.nn.Module()
        self.nodes: dict[int, tuple] = {}  # id(tensor) -> (weak reference to it, node)
        self.constants = 0

    def bind(self, t: torch.Tensor, node: Node) -> None:
        self.nodes[id(t)] = (weakref.ref(t), node)

    def node(self, a):
        if not isinstance(a, torch.Tensor):
            return a
        entry = self.nodes.get(id(a))
        if entry is not None and entry[0]() is a:
            return entry[1]
        if type(a) is not torch.Tensor and not isinstance(a, torch.nn.Parameter):
            raise RecordingError(f"a {type(a).__name__} operand")
        name = f"_tensor_constant{self.constants}"
        self.constants += 1
        setattr(self.root, name, a)  # by reference, like make_fx
        node = self.graph.get_attr(name)
        node.meta["val"] = _meta(a)
        self.bind(a, node)
        return node

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tags = getattr(func, "tags", ())
        if torch.Tag.data_dependent_output in tags:
            raise RecordingError(f"{func} has a data-dependent result")
        if torch.Tag.dynamic_output_shape in tags and not _integer_indexing(func, args):
            # a shape read from such a result would be baked into the operations that follow
            raise RecordingError(f"{func} has a data-dependent shape")
        nargs, nkwargs = tree_map(self.node, (args, kwargs))
        out = func(*args, **kwargs)
        node = self.graph.call_function(func, nargs, nkwargs)
        if isinstance(out, torch.Tensor):
            node.meta["val"] = _meta(out)
            self.bind(out, node)
        elif isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
            node.meta["val"] = [_meta(o) for o in out]
            for i, o in enumerate(out):
                item = self.graph.call_function(operator.getitem, (node, i))
                item.meta["val"] = _meta(o)
                self.bind(o, item)
        elif out is not None:
            raise RecordingError(f"{func} returned {type(out).__name__}")
        return out


def _integer_indexing(func, args) -> bool:
    """``x[index]`` with integer index tensors: the one ``dynamic_output_shape`` operation whose
    shape does not depend on the data (boolean masks do)."""
    if func is not torch.ops.aten.index.Tensor or len(args) < 2:
        return False
    return all(i is None or (isinstance(i, torch.Tensor) and not i.dtype.is_floating_point
                             and i.dtype not in (torch.bool, torch.uint8)) for i in args[1])


def _same(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)) and torch.equal(a.isnan(), b.isnan()))
    return bool(torch.equal(a, b))


def record(fn, *inputs: torch.Tensor) -> GraphModule:
    """The graph of ATen operations of ``fn(*inputs)`` (one tensor result), checked to reproduce it."""
    rec = _Recorder()
    for i, t in enumerate(inputs):
        node = rec.graph.placeholder(f"arg{i}")
        node.meta["val"] = _meta(t)
        rec.bind(t, node)
    with rec:
        out = fn(*inputs)
    if not isinstance(out, torch.Tensor):
        raise RecordingError(f"the function returned {type(out).__name__}")
    rec.graph.output(rec.node(out))
    gm = GraphModule(rec.root, rec.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    # asd's own check: no mode around the recording (one that refuses f's reads of tensor values) sees it
    with torch.no_grad(), _disable_current_modes():
        again = gm(*inputs)
        same = _same(again, out)
    if not same:
        raise RecordingError("the recorded graph does not reproduce the call")
    return gm
