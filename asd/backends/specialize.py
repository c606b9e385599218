"""Specializing a recorded products graph on what never changes: the seed rows and the gather index.

A prepared operator's batched products ``fn(x, seeds)`` are recorded as a flat ATen graph
(:mod:`asd.backends.traced`). Two of its inputs are the operator's own constants: the seed rows
and, when the direct gather is fused (:mod:`asd.backends.fused`), the gather index. Before the
graph is compiled, :func:`specialize` rewrites it with them known:

* **folding**: every operation that reads only constants (e.g. the rolls of the seed rows in a
  stencil's JVP: the tangent half of the stencil) is evaluated once, eagerly, with the same ATen
  operations, and its result becomes an input of the compiled graph (a cheap elementwise
  operation of one constant, ``4.4 * seeds``, is left in the graph: one input stream less);
* **gather push-down**: the values the graph returns are ``products.flatten()[index]``. Instead
  of evaluating every product and gathering, the gather is moved through the operations that
  produced the products - elementwise ones (it then gathers their operands) and those that only
  move data (views, ``cat``/``stack``, ``roll``, padding, ...; their index maps are found by
  running them on integer ranges) - as long as at most :data:`PUSH_RATIO` times the elements an
  operation computes are asked of it (always through a broadcast, and through a cheap operation
  of one operand such as ``u * u``). Products no entry reads are never computed, constants are
  gathered once, at preparation, and the compiled kernel streams through the stored entries;
  its gathers use the operator's own indices, in range by construction, without bounds checks.

Both rewritings are built; the one that moves fewer bytes per call is kept (the B1 Brusselator's
JVPs: push-down, 1.8 MB instead of 4.5 MB; the B3 Rosenbrock Hessian, whose entries are as many as
its products: folding only).

Only tensors the operator owns are constants: tensors ``f`` captures stay inputs read by
reference (an in-place update of a weight is seen), Python scalars stay in the graph (the
operator's value fingerprint guards them). A graph with in-place operations is left alone (see
:func:`functional`). The rewritten graph is checked against the recorded one on the example
inputs; any mismatch, or any failure, keeps the recorded graph (with its attribute tensors made
inputs, :func:`lift`), so specializing can only change speed.
"""

from __future__ import annotations

import operator
import zlib
from dataclasses import dataclass, field

import torch
from torch.fx import Graph, GraphModule, Node
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["Specialized", "specialize", "candidates", "nearby", "lift", "functional"]

aten = torch.ops.aten

#: a node is computed at the requested elements only while fewer than this many times its own
#: elements are requested (all consumers together); otherwise it is computed whole and gathered
PUSH_RATIO = 4.0
#: factories (full, zeros, ...) folded into constants at most this large
SMALL = 64
#: folded constants may take this many bytes beyond the constants they are computed from
MAX_EXTRA_BYTES = 256 << 20

# operations that only move data: every output element is one input element (or a fill value)
_VIEWS = {aten.view, aten._unsafe_view, aten.reshape, aten.alias, aten.permute, aten.transpose, aten.t,
          aten.expand, aten.unsqueeze, aten.squeeze, aten.slice, aten.select, aten.narrow, aten.diagonal,
          aten.movedim, aten.unfold, aten.view_copy, aten.permute_copy, aten.expand_copy, aten.t_copy,
          aten.transpose_copy, aten.unsqueeze_copy, aten.squeeze_copy, aten.slice_copy, aten.select_copy,
          aten.alias_copy, aten.detach, aten.lift_fresh_copy, aten.clone, aten.contiguous, aten.flip, aten.roll,
          aten.repeat, aten.index_select, aten.unbind, aten.split, aten.split_with_sizes, aten.tensor_split,
          aten.chunk, aten.cat, aten.stack, aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter}
# views: reading through them reads their base
_ALIASES = {aten.view, aten._unsafe_view, aten.reshape, aten.alias, aten.permute, aten.transpose, aten.t, aten.expand,
            aten.unsqueeze, aten.squeeze, aten.slice, aten.select, aten.narrow, aten.diagonal, aten.movedim,
            aten.detach, operator.getitem, aten.unbind, aten.split, aten.split_with_sizes}
# data movement that writes a fill value where no input element lands
_FILLS = {aten.constant_pad_nd: lambda n: n.args[2] if len(n.args) > 2 else n.kwargs.get("value", 0.0),
          aten.slice_backward: lambda n: 0.0, aten.select_backward: lambda n: 0.0,
          aten.diagonal_backward: lambda n: 0.0}
# elementwise operations cheaper to redo per call than to read as one more constant stream
_CHEAP = {aten.mul, aten.add, aten.sub, aten.rsub, aten.neg, aten._to_copy, aten.clone, aten.alias, aten.abs}
# factories whose values are defined (empty/empty_like are not)
_FACTORIES = {aten.full, aten.zeros, aten.ones, aten.arange, aten.scalar_tensor, aten.eye, aten.linspace}


@dataclass
class Specialized:
    """A graph ``gm(*inputs at positions runtime, *extras)`` computing what the recorded one does."""

    gm: GraphModule
    runtime: list[int]
    extras: list[torch.Tensor]
    folded: int = 0
    pushed: bool = False
    notes: list[str] = field(default_factory=list)
    #: positions in ``extras`` of the tensors read by reference (``f``'s own: a parameter, a
    #: captured tensor), whose layout and ``requires_grad`` a call must watch; ``None``: all of them.
    #: The others are constants folded by the specialization, made here and read by nothing else.
    by_reference: list[int] | None = None

    def arguments(self, inputs) -> list:
        return [inputs[i] for i in self.runtime] + self.extras


def _packet(target):
    return getattr(target, "overloadpacket", None)


def _tensor_nodes(node: Node) -> list[Node]:
    return [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, Node)]


def _val(node: Node):
    return node.meta.get("val")


def _is_plain(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta
            and not t._is_zerotensor() and not t.is_neg() and not t.is_conj())


def _numel(node: Node) -> int:
    v = _val(node)
    return v.numel() if isinstance(v, torch.Tensor) else 0


def _key(index: torch.Tensor) -> tuple:
    """Identifies an index (or a constant's bytes) among those of one graph: two 32-bit checksums
    (a collision would merge two requests; the rewritten graph's check against the recorded one
    would then refuse it)."""
    data = memoryview(index.contiguous().numpy()).cast("B")
    return (index.numel(), zlib.crc32(data), zlib.adler32(data))


def _blocked(rel: torch.Tensor) -> tuple[int, int, bool] | None:
    """``(m, r, tiled)`` where the gather index ``rel`` (smallest entry 0) reads ``0, 1, ..., m - 1``
    with each element repeated ``r`` times in a row (``tiled`` False: a CSR row's entries all read
    their row's value; ``r`` may be 1: a slice) or the whole run repeated ``r`` times (``tiled``
    True); else ``None``. Such a gather is a broadcast view, which compiled kernels read without an index."""
    n = rel.numel()
    if n < 2 or int(rel[0]) != 0:
        return None
    nonzero = torch.nonzero(rel).flatten()
    if nonzero.numel() == 0:
        return None  # all one element: the single-value broadcast handles it
    first = int(nonzero[0])
    if n % first == 0:
        m, r = n // first, first
        if torch.equal(rel, torch.arange(m, dtype=rel.dtype).repeat_interleave(r)):
            return m, r, False
    zeros = torch.nonzero(rel[1:] == 0).flatten()
    if zeros.numel() and n % (int(zeros[0]) + 1) == 0:
        m = int(zeros[0]) + 1
        if m > 1 and torch.equal(rel, torch.arange(m, dtype=rel.dtype).repeat(n // m)):
            return m, n // m, True
    return None


def _returns_alias(target) -> bool:
    """Whether an op's result may share memory with its first argument (a view, ``as_strided``,
    ``getitem`` of the list a ``split`` returns), by its schema."""
    if target is operator.getitem or _packet(target) in _ALIASES:  # _unsafe_view has no alias annotation
        return True
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _mutable(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


def functional(gm: GraphModule, inputs) -> GraphModule:
    """``gm`` without in-place operations (recorded again through ``torch.func.functionalize``),
    or ``gm`` itself when it has none or cannot be functionalized."""
    if not any(_mutable(n) for n in gm.graph.nodes if n.op == "call_function"):
        return gm
    try:
        from torch.fx.experimental.proxy_tensor import make_fx

        new = make_fx(torch.func.functionalize(gm, remove="mutations"))(*inputs)
        new.graph.eliminate_dead_code()
        new.recompile()
    except Exception:  # noqa: BLE001 - keep the recorded graph (it is then only lifted)
        return gm
    if any(_mutable(n) for n in new.graph.nodes if n.op == "call_function"):
        return gm
    return new


def lift(gm: GraphModule, inputs) -> Specialized:
    """The recorded graph with its attribute tensors made inputs (no specialization): the compiled
    artifact then depends on shapes and code only, and the tensors are read by reference."""
    graph = Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    gm = GraphModule(gm, graph)  # a copy of the graph sharing the attribute tensors
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    last, extras, seen = phs[-1], [], {}
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"the recorded graph holds a {type(value).__name__} attribute")
        if id(value) not in seen:
            with graph.inserting_after(last):
                last = graph.placeholder(f"const_{len(extras)}")
            last.meta["val"] = value
            seen[id(value)] = last
            extras.append(value)
        node.replace_all_uses_with(seen[id(value)])
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return Specialized(gm, list(range(len(phs))), extras)


class _Rewriter:
    def __init__(self, gm: GraphModule, inputs, constant_inputs, owned_ids, max_extra_bytes: int = MAX_EXTRA_BYTES):
        self.gm = gm
        self.graph = gm.graph
        self.inputs = list(inputs)
        self.phs = [n for n in self.graph.nodes if n.op == "placeholder"]
        self.env: dict[Node, object] = {}  # node -> value, for the nodes that read only constants
        self.cap: dict[Node, int] = {}     # largest constant a constant node is computed from
        for i in constant_inputs:
            self.env[self.phs[i]] = self.inputs[i]
        for node in self.graph.nodes:
            if node.op == "get_attr":
                value = getattr(gm, node.target)
                if isinstance(value, torch.Tensor) and id(value) in owned_ids:
                    self.env[node] = value
        for node, value in self.env.items():
            self.cap[node] = value.numel()
        self.budget = max_extra_bytes + sum(v.numel() * v.element_size() for v in self.env.values())
        self.notes: list[str] = []

    # -- constants --------------------------------------------------------------------------------
    def fold(self) -> None:
        """Evaluate every node that reads only constants (within the size cap of its inputs)."""
        for node in self.graph.nodes:
            if node.op != "call_function" or node in self.env:
                continue
            if node.target is operator.getitem:
                src = node.args[0]
                if src in self.env:
                    self.env[node] = self.env[src][node.args[1]]
                    self.cap[node] = self.cap[src]
                continue
            if _mutable(node) or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
                continue
            ins = _tensor_nodes(node)
            if ins:
                if not all(a in self.env for a in ins):
                    continue
                cap = max(self.cap[a] for a in ins)
            elif _packet(node.target) in _FACTORIES and _numel(node) <= SMALL:
                cap = SMALL  # a larger factory stays in the graph, where it is a cheap fill
            else:
                continue
            val = _val(node)
            if isinstance(val, torch.Tensor) and val.numel() > cap:
                continue  # e.g. a constant broadcast to the products' shape: stays lazy
            args, kwargs = tree_map(lambda a: self.env[a] if isinstance(a, Node) else a, (node.args, node.kwargs))
            self.env[node] = node.target(*args, **kwargs)
            self.cap[node] = cap

    # -- index maps -------------------------------------------------------------------------------
    def _classify(self, node: Node):
        """``"pointwise"``, ``"map"`` (data movement from the tensor operands) or ``None``."""
        if node.op != "call_function":
            return None
        if node.target is operator.getitem:
            src = node.args[0]
            if src.op == "call_function" and _packet(src.target) in _VIEWS and self._map_operands(src) is not None:
                return "map"
            return None
        val = _val(node)
        if not isinstance(val, torch.Tensor) or _mutable(node):
            return None
        packet = _packet(node.target)
        if packet is aten._to_copy:
            ins = _tensor_nodes(node)
            extra = set(node.kwargs) - {"dtype", "layout", "device", "memory_format"}
            if len(ins) == 1 and not extra and _val(ins[0]).device == val.device and val.layout == torch.strided:
                return "pointwise"
            return None
        if torch.Tag.pointwise in getattr(node.target, "tags", ()):
            ins = _tensor_nodes(node)
            shapes = [tuple(_val(a).shape) for a in ins if isinstance(_val(a), torch.Tensor)]
            if len(shapes) != len(ins) or any(_val(a).device != val.device for a in ins):
                return None
            try:
                if tuple(torch.broadcast_shapes(*shapes)) != tuple(val.shape):
                    return None
            except RuntimeError:
                return None
            return "pointwise"
        if (packet in _VIEWS or packet in _FILLS) and self._map_operands(node) is not None:
            return "map"
        return None

    def _map_operands(self, node: Node):
        """The data operands of a data-movement node (the others must be constants), or ``None``."""
        packet = _packet(node.target)
        if packet in (aten.cat, aten.stack):
            data = list(node.args[0])
        elif packet in (aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter):
            data = [node.args[0], node.args[1]]
        else:
            data = [node.args[0]]
        if not all(isinstance(a, Node) and isinstance(_val(a), torch.Tensor) for a in data):
            return None
        rest = [a for a in _tensor_nodes(node) if a not in data]
        if not all(a in self.env for a in rest):
            return None
        return data

    def _source_map(self, node: Node):
        """``(operands, source ids, fill)``: where each output element comes from, as ids into the
        concatenated (flattened) operands starting at 1; 0 marks a fill value."""
        cached = self._maps.get(node)
        if cached is not None:
            return cached
        op = node.args[0] if node.target is operator.getitem else node
        data = self._map_operands(op)
        offsets, ranges, start = [], {}, 1
        for a in data:
            n = _numel(a)
            offsets.append(start)
            ranges[a] = torch.arange(start, start + n, dtype=torch.int64).reshape(_val(a).shape)
            start += n

        def sub(a):
            if isinstance(a, Node):
                return ranges[a] if a in ranges else self.env[a]
            return a

        args, kwargs = tree_map(sub, (op.args, op.kwargs))
        if _packet(op.target) is aten.constant_pad_nd:
            args = (args[0], args[1], 0)
            kwargs = {}
        ids = op.target(*args, **kwargs)
        if node.target is operator.getitem:
            ids = ids[node.args[1]]
        out = _val(node)
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or tuple(ids.shape) != tuple(out.shape):
            raise _Unsupported(f"{op.target}: no index map")
        fill = _FILLS[_packet(op.target)](op) if _packet(op.target) in _FILLS else None
        result = (data, torch.tensor(offsets, dtype=torch.int64), ids.reshape(-1).contiguous(), fill)
        self._maps[node] = result
        return result

    def _broadcast_map(self, operand: Node, node: Node) -> torch.Tensor:
        key = (operand, node)
        m = self._bmaps.get(key)
        if m is None:
            shape = _val(operand).shape
            m = torch.arange(_val(operand).numel(), dtype=torch.int64).reshape(shape)
            m = m.expand(_val(node).shape).reshape(-1).contiguous()
            self._bmaps[key] = m
        return m

    # -- push-down: which elements of which node are needed ----------------------------------------
    def _ask(self, node: Node, index: torch.Tensor):
        k = _key(index)
        asked = self.requests.setdefault(node, {})
        if k not in asked:
            asked[k] = index
        return k

    def plan(self, root: Node) -> None:
        self._maps, self._bmaps = {}, {}
        self.requests: dict[Node, dict] = {}
        self.whole: set[Node] = set()
        self.derive: dict[tuple, tuple] = {}
        self._ask(root, torch.arange(_numel(root), dtype=torch.int64))
        self.essential = self._essential()
        for node in reversed(list(self.graph.nodes)):
            if node.op in ("placeholder", "get_attr", "output") or node in self.env:
                continue
            asked = self.requests.get(node, {})
            if node not in self.whole and not asked:
                continue  # not needed
            kind = self._classify(node) if node not in self.whole else None
            total = sum(k[0] for k in asked)
            # data movement only composes index maps: always pushed through (its operands decide)
            # an elementwise operation of broadcast operands is never stored at its full size
            broadcast = self.essential.get(node, 0) < _numel(node)
            # and a cheap one of one operand (u * u) costs no more gathers pushed than gathered
            unary = (_packet(node.target) in _CHEAP
                     and len({a for a in _tensor_nodes(node) if a not in self.env}) <= 1)
            if (kind is None or (kind == "pointwise" and not (broadcast or unary) and total >= PUSH_RATIO * _numel(node))
                    or (kind == "map" and not self._derivable(node, asked))):
                self._compute_whole(node)
                continue
            for k, index in asked.items():
                self.derive[(node, k)] = self._derive(node, kind, index)

    def _essential(self) -> dict:
        """The number of distinct values each node is computed from (less than its size for a
        broadcast: ``expand`` and elementwise operations of expanded operands)."""
        ess: dict[Node, int] = {}
        for node in self.graph.nodes:
            n = _numel(node)
            if node.op == "call_function" and node not in self.env:
                kind = self._classify(node)
                if kind == "pointwise":
                    ins = [ess.get(a, _numel(a)) for a in _tensor_nodes(node)]
                    n = min(n, max(ins, default=n))
                elif kind == "map" and _packet(node.target) in _ALIASES:
                    op = node.args[0] if node.target is operator.getitem else node
                    n = min(n, sum(ess.get(a, _numel(a)) for a in self._map_operands(op)))
            ess[node] = n
        return ess

    def _compute_whole(self, node: Node) -> None:
        self.whole.add(node)
        for a in _tensor_nodes(node):
            if a not in self.env:
                self.whole.add(a)

    def _derivable(self, node: Node, asked) -> bool:
        try:
            data, offsets, ids, fill = self._source_map(node)
        except _Unsupported:
            return False
        for index in asked.values():
            src = ids[index]
            which = torch.searchsorted(offsets, src, right=True) - 1  # -1: the fill value
            if len(data) == 1:
                continue  # one operand, maybe with fill values: a select
            order = torch.where(which < 0, torch.full_like(which, len(data)), which)
            if not bool((order[1:] >= order[:-1]).all()):
                return False  # operands interleaved: not worth a permutation
        return True

    def _derive(self, node: Node, kind: str, index: torch.Tensor):
        if kind == "pointwise":
            parts = []
            for a in _tensor_nodes(node):
                if _val(a).dim() == 0:
                    parts.append((a, None))
                    if a not in self.env:
                        self.whole.add(a)
                    continue
                parts.append((a, self._ask(a, self._broadcast_map(a, node)[index])))
            return ("pointwise", parts)
        data, offsets, ids, fill = self._source_map(node)
        src = ids[index]
        which = torch.searchsorted(offsets, src, right=True) - 1
        filled = which < 0
        nfill = int(filled.sum())
        if nfill and len(data) == 1:
            # one operand with fill values in between: compute at every element, then select
            clamped = torch.where(filled, torch.zeros_like(src), src - offsets[0])
            return ("fill", data[0], self._ask(data[0], clamped), filled, fill)
        pieces = []
        for j, a in enumerate(data):
            mask = which == j
            if bool(mask.any()):
                pieces.append((j, a, self._ask(a, src[mask] - offsets[j]), int(mask.sum())))
        # several operands (and fill values last): blocks in order (checked by _derivable)
        return ("blocks", pieces, nfill, fill)

    # -- the rewritten graph ----------------------------------------------------------------------
    def build(self, root: Node) -> tuple[Graph, list[int], list[torch.Tensor]]:
        g = Graph()
        self.new = g
        self.extras: list[torch.Tensor] = []
        self.by_reference: list[int] = []
        self.runtime: list[int] = []
        self._const_nodes: dict = {}
        self.mat: dict[Node, Node] = {}
        self.vals: dict[tuple, Node] = {}
        self._gathers: dict[tuple, Node] = {}
        self._by_content: dict[tuple, Node] = {}
        for i, ph in enumerate(self.phs):
            if ph in self.env:
                continue
            new = g.placeholder(ph.name)
            new.meta["val"] = _val(ph)
            self.mat[ph] = new
            self.runtime.append(i)
        self._last_ph = list(g.nodes)[-1] if len(g.nodes) else None
        lifted = {}
        for node in self.graph.nodes:
            if node.op == "get_attr" and node not in self.env:
                value = getattr(self.gm, node.target)
                if not isinstance(value, torch.Tensor):
                    raise _Unsupported("a non-tensor attribute")
                if id(value) not in lifted:
                    lifted[id(value)] = self._constant(value, by_reference=True)
                self.mat[node] = lifted[id(value)]
        for node in self.graph.nodes:
            if node.op in ("placeholder", "get_attr", "output") or node in self.env:
                continue
            if node in self.whole:
                self.mat[node] = g.node_copy(node, self._whole_arg)
                if node.target is aten.index_select.default and node.args[2] in self.env:
                    # an index of the operator's own, in range by construction: no bounds checks
                    # per element (AOTInductor's cost 15% of the Rosenbrock Hessian's kernel)
                    src, dim, idx = self.mat[node].args
                    self.mat[node].target = aten._unsafe_index.Tensor
                    self.mat[node].args = (src, [None] * dim + [idx])
            for k in self.requests.get(node, {}):
                if (node, k) in self.derive:
                    self.vals[(node, k)] = self._emit(node, k)
        result = self._value(root, _key(torch.arange(_numel(root), dtype=torch.int64)))
        base = result
        while base.op == "call_function" and _returns_alias(base.target) and base.args and isinstance(base.args[0], Node):
            base = base.args[0]
        if base.op == "placeholder":  # never hand out a stored tensor: the caller owns the result
            result = g.call_function(aten.clone.default, (result,))
        shape = list(_val(root).shape)
        if _val(root).dim() != 1:
            result = g.call_function(aten.reshape.default, (result, shape))
        g.output(result)
        g.eliminate_dead_code()
        return g, self.runtime, self.extras

    def _constant(self, value: torch.Tensor, by_reference: bool = False) -> Node:
        key = id(value) if by_reference else None
        if key is not None and key in self._const_nodes:
            return self._const_nodes[key]
        if self._last_ph is None:
            node = self.new.placeholder(f"const_{len(self.extras)}")
        else:
            with self.new.inserting_after(self._last_ph):
                node = self.new.placeholder(f"const_{len(self.extras)}")
        self._last_ph = node
        node.meta["val"] = value
        if by_reference:
            self.by_reference.append(len(self.extras))
        self.extras.append(value)
        if key is not None:
            self._const_nodes[key] = node
        return node

    def _whole_arg(self, a: Node) -> Node:
        if a in self.mat:
            return self.mat[a]
        if a in self.env:
            value = self.env[a]
            ins = _tensor_nodes(a) if a.op == "call_function" else []
            cheap = (_packet(a.target) in _CHEAP and len(ins) == 1 and isinstance(_val(ins[0]), torch.Tensor)
                     and _val(ins[0]).shape == _val(a).shape and self._classify(a) == "pointwise")
            if ((_packet(a.target) in _ALIASES or a.target is operator.getitem or cheap) and ins
                    and all(b in self.env for b in ins)):
                # a view of a stored constant, not a copy; a cheap elementwise op of one (-seeds)
                # done per call rather than read as one more stream
                node = self.new.node_copy(a, self._whole_arg)
            elif _is_plain(value):
                node = self._stored(value)
            else:
                raise _Unsupported(f"a constant that is not a plain tensor ({a.format_node()[:80]})")
            self.mat[a] = node
            return node
        raise _Unsupported(f"{a} is needed whole but was not computed")

    def _value(self, node: Node, k) -> Node:
        """The node's values at the requested elements ``k`` (a 1-D tensor node)."""
        if (node, k) in self.vals:
            return self.vals[(node, k)]
        index = self.requests[node][k]
        if node in self.env:
            self.vals[(node, k)] = self._constant_at(node, index)
            return self.vals[(node, k)]
        if node in self.mat:
            return self._gather(node, index)
        raise _Unsupported(f"{node} has no values at the requested elements")

    def _gather(self, node: Node, index: torch.Tensor) -> Node:
        """The values of a computed (or input) node at ``index``."""
        # through data movement to the stored tensor it reads: no index arithmetic per call
        while (node.op == "call_function" and node in self.mat and self._classify(node) == "map"
               and _packet((node.args[0] if node.target is operator.getitem else node).target) in _ALIASES):
            data, offsets, ids, fill = self._source_map(node)
            src = ids[index]
            if len(data) != 1 or not bool((src > 0).all()):
                break
            node, index = data[0], src - offsets[0]
            if node in self.env:
                return self._constant_at(node, index)
        if node not in self.mat:
            raise _Unsupported(f"{node} has no values at the requested elements")
        gk = (node, _key(index))
        if gk not in self._gathers:
            flat = self.new.call_function(aten.reshape.default, (self.mat[node], [-1]))
            if _numel(node) == 1:  # one value: broadcast it
                self._gathers[gk] = self.new.call_function(aten.expand.default, (flat, [index.numel()]))
            elif index.numel() == _numel(node) and bool((index == torch.arange(index.numel())).all()):
                self._gathers[gk] = flat
            else:
                # gathers at the same positions of different views of one tensor (u and v of
                # x = [u; v]) share one index: the offset goes into the base
                start = int(index.min()) if index.numel() else 0
                rel = index - start
                block = _blocked(rel)
                if block is not None:  # each element repeated, or the whole run tiled: a view, no index
                    m, r, tiled = block
                    part = self.new.call_function(aten.slice.Tensor, (flat, 0, start, start + m))
                    if r == 1:
                        self._gathers[gk] = part
                        return part
                    shape = [1, m] if tiled else [m, 1]
                    part = self.new.call_function(aten.reshape.default, (part, shape))
                    part = self.new.call_function(aten.expand.default, (part, [r, m] if tiled else [m, r]))
                    self._gathers[gk] = self.new.call_function(aten.reshape.default, (part, [-1]))
                    return self._gathers[gk]
                if start:
                    flat = self.new.call_function(aten.slice.Tensor, (flat, 0, start, _numel(node)))
                idx = self._stored(rel.contiguous(), index=True)
                self._gathers[gk] = self.new.call_function(aten._unsafe_index.Tensor, (flat, [idx]))
        return self._gathers[gk]

    def _stored(self, value: torch.Tensor, index: bool = False) -> Node:
        """A constant input with ``value``'s contents (one input per distinct contents).

        (Storing 0/1 seed values as int8 or float32, or indices as int32, moves fewer bytes but
        measured slower: Inductor's masked and converting loads cost more than they save.)"""
        flat = value.contiguous()
        key = (str(value.dtype), tuple(value.shape), _key(flat.reshape(-1).view(torch.uint8)) if value.numel() else 0)
        if key not in self._by_content:
            self._by_content[key] = self._constant(flat)
        return self._by_content[key]

    def _constant_at(self, node: Node, index: torch.Tensor) -> Node:
        """A constant node's values at ``index``: a stored gather of them or, for an elementwise
        operation of one constant (``4.4 * seeds``), that operation of its operand's gather: one
        stream less to read per call."""
        value = self.env[node]
        if not _is_plain(value):
            raise _Unsupported("a constant that is not a plain tensor")
        ins = _tensor_nodes(node) if node.op == "call_function" else []
        if (len(ins) == 1 and ins[0] in self.env and isinstance(_val(ins[0]), torch.Tensor)
                and _val(ins[0]).dim() > 0 and _is_plain(self.env[ins[0]])
                and _packet(node.target) in _CHEAP and self._classify(node) == "pointwise"):
            a = ins[0]
            sub = self._constant_at(a, self._broadcast_map(a, node)[index])
            args, kwargs = tree_map(lambda v: sub if v is a else v, (node.args, node.kwargs))
            return self.new.call_function(node.target, args, kwargs)
        if node.op == "call_function" and self._classify(node) == "map":
            data, offsets, ids, fill = self._source_map(node)
            src = ids[index]
            if len(data) == 1 and data[0] in self.env and bool((src > 0).all()):
                return self._constant_at(data[0], src - offsets[0])
        return self._stored(value.reshape(-1)[index].contiguous())

    def _emit(self, node: Node, k) -> Node:
        how = self.derive[(node, k)]
        g = self.new
        if how[0] == "pointwise":
            replaced = {}
            for a, ak in how[1]:
                if ak is None:
                    replaced[a] = self._whole_arg(a)
                else:
                    replaced[a] = self._value(a, ak)
            args, kwargs = tree_map(lambda a: replaced[a] if isinstance(a, Node) else a, (node.args, node.kwargs))
            return g.call_function(node.target, args, kwargs)
        if how[0] == "fill":
            _, a, ak, filled, fill = how
            v = self._value(a, ak)
            mask = self._constant(filled.contiguous())
            return g.call_function(aten.where.ScalarSelf, (mask, _scalar(fill, _val(node).dtype), v))
        _, pieces, nfill, fill = how
        parts = [self._value(a, ak) for _, a, ak, _ in pieces]
        if nfill:
            dtype = _val(node).dtype
            parts.append(self._constant(torch.full((nfill,), fill, dtype=dtype, device=_val(node).device)))
        if len(parts) == 1:
            return parts[0]
        return g.call_function(aten.cat.default, (parts, 0))


class _Unsupported(Exception):
    pass


def _scalar(value, dtype: torch.dtype):
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point or dtype.is_complex:
        return value
    return int(value)


def nearby(inputs, constant_inputs=()) -> list:
    """``inputs`` with every floating input that is not a constant moved to a random point near it:
    a rewritten graph is checked there as well (an example of equal entries, ``torch.ones(n)``,
    would hide one that reads the wrong elements)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i, t in enumerate(inputs):
        if i in constant_inputs or not isinstance(t, torch.Tensor) or not t.is_floating_point():
            out.append(t)
            continue
        u = torch.rand(t.shape, dtype=t.dtype, generator=g).to(t.device)
        out.append(t * (1 + 0.25 * (u - 0.5)) + 0.01 * u)
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return bool(torch.equal(a, b))
    eps = torch.finfo(a.dtype).eps
    scale = float(b.abs().nan_to_num(0.0, 0.0, 0.0).max()) if b.numel() else 0.0
    return bool(torch.isclose(a, b, rtol=64 * eps, atol=64 * eps * scale, equal_nan=True).all())


def specialize(gm: GraphModule, inputs, constant_inputs=(), owned=(), push: bool = True) -> Specialized:
    """``gm`` (a ``make_fx`` graph of ``fn(*inputs)`` returning one tensor) specialized on the
    inputs at positions ``constant_inputs`` and the attribute tensors in ``owned`` (by identity).
    Falls back to :func:`lift` when the graph cannot be specialized or the result differs."""
    try:
        checked, notes = _specialize(gm, inputs, constant_inputs, owned, push, MAX_EXTRA_BYTES)
    except Exception as exc:  # noqa: BLE001 - specializing is an optimization: keep the recorded graph
        plain = lift(gm, inputs)
        plain.notes.append(f"not specialized: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
        return plain
    # the candidate that moves fewer bytes per call (folded products are memory-bound)
    checked.sort(key=lambda c: c[0])
    cost, spec = checked[0]
    spec.notes = notes + [f"{_kind(spec)}: {cost / 1e6:.2f} MB per call"
                          + "".join(f" (other: {c / 1e6:.2f} MB)" for c, s in checked[1:])]
    return spec


def candidates(gm: GraphModule, inputs, constant_inputs=(), owned=(), *, push: bool = True,
               max_extra_bytes: int = MAX_EXTRA_BYTES) -> tuple[list[Specialized], list[str]]:
    """Every specialization of ``gm`` that agrees with it on ``inputs`` (folding only and, with
    ``push``, folding with the gather pushed down), and notes on those that could not be built;
    for a caller that measures them (eager replay) instead of ranking them by bytes moved."""
    try:
        checked, notes = _specialize(gm, inputs, constant_inputs, owned, push, max_extra_bytes)
    except Exception as exc:  # noqa: BLE001 - specializing is an optimization
        return [], [f"not specialized: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"]
    return [spec for _, spec in checked], notes


def _kind(spec: Specialized) -> str:
    return "pushed" if spec.pushed else "folded"


def _specialize(gm, inputs, constant_inputs, owned, push, max_extra_bytes) -> tuple[list, list[str]]:
    graph = Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    gm = GraphModule(gm, graph)  # a copy of the graph sharing the attribute tensors
    graph.eliminate_dead_code()
    if any(_mutable(n) for n in graph.nodes if n.op == "call_function"):
        raise _Unsupported("in-place operations")
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    root = out.args[0]
    if not isinstance(root, Node) or not _is_plain_meta(_val(root)):
        raise _Unsupported("the graph must return one tensor")
    rw = _Rewriter(gm, inputs, constant_inputs, {id(t) for t in owned}, max_extra_bytes)
    with torch.no_grad():
        rw.fold()
    candidates = []
    for mode in ((True, False) if push else (False,)):
        try:
            candidates.append(_candidate(rw, root, mode))
        except _Unsupported as exc:
            rw.notes.append(f"{'push-down' if mode else 'folding'}: {exc}")
    other = nearby(inputs, constant_inputs)
    with torch.no_grad():
        want = gm(*inputs)
        want_other = gm(*other)
    checked = []
    for spec in candidates:
        with torch.no_grad():
            sizes = _Sizes(spec.gm)
            got = sizes.run(*spec.arguments(inputs))
            got_other = spec.gm(*spec.arguments(other))
        if _close(got, want) and _close(got_other, want_other):
            checked.append((_traffic(spec.gm.graph, sizes.bytes), spec))
        else:
            rw.notes.append(f"{'push-down' if spec.pushed else 'folding'} disagrees with the recorded graph")
    if not checked:
        raise _Unsupported("; ".join(rw.notes))
    return checked, rw.notes


class _Sizes(torch.fx.Interpreter):
    """Runs a graph, recording the bytes of every node's result."""

    def __init__(self, gm):
        super().__init__(gm)
        self.bytes: dict[Node, int] = {}

    def run_node(self, n):
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.bytes[n] = result.numel() * result.element_size()
        return result


def _candidate(rw: _Rewriter, root: Node, push: bool):
    graph = rw.graph
    if push:
        rw.plan(root)
    else:
        rw._maps, rw._bmaps, rw.derive = {}, {}, {}
        rw.whole = {n for n in graph.nodes if n.op == "call_function" and n not in rw.env}
        rw.requests = {root: {_key(torch.arange(_numel(root), dtype=torch.int64)):
                              torch.arange(_numel(root), dtype=torch.int64)}}
    if root in rw.env:
        rw.whole.discard(root)
    new_graph, runtime, extras = rw.build(root)
    extra_bytes = sum(t.numel() * t.element_size() for t in extras)
    if extra_bytes > rw.budget:
        raise _Unsupported(f"folded constants of {extra_bytes >> 20} MiB")
    new_graph.lint()
    new = GraphModule(torch.nn.Module(), new_graph)
    return Specialized(new, runtime, extras, folded=len(rw.env), pushed=bool(rw.derive),
                       by_reference=list(rw.by_reference))


def _traffic(graph: Graph, nbytes: dict) -> int:
    """Bytes a call moves at least: its inputs, its output, and every gathered tensor that has to
    be computed into memory first (written and read)."""
    total = 0
    for node in graph.nodes:
        if node.op == "placeholder" and node.users:
            total += nbytes.get(node, 0)
        elif node.op == "output" and isinstance(node.args[0], Node):
            total += nbytes.get(node.args[0], 0)
        elif node.op == "call_function" and node.target in (aten.index_select.default, aten._unsafe_index.Tensor):
            base = node.args[0]
            while base.op == "call_function" and _packet(base.target) in _ALIASES:
                base = base.args[0]
            if base.op != "placeholder":
                total += 2 * nbytes.get(base, 0)
    return total


def _is_plain_meta(v) -> bool:
    return isinstance(v, torch.Tensor) and v.layout == torch.strided
