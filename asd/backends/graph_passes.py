"""Exact clean-ups of a recorded graph of ATen operations.

A graph recorded from ``torch.func``'s transforms still computes what the products never use (the
primal output of a VJP) and repeats pure operations (a backward formula that multiplies by the same
saved value twice). Removing both changes no result bit: every remaining operation runs on the same
operands in the same order.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

__all__ = ["simplify", "reuse_buffers", "join_in_place", "sum_slots", "drop_identity_views", "fuse_multiply_add",
           "unit_valued", "public_bindings"]


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


def _owned_buffer(s) -> bool:
    """Whether ``s`` is a fresh intermediate's buffer: a fresh result, or what an in-place pointwise
    op returns (its first operand, written) on such a buffer that nothing else reads."""
    while s.op == "call_function" and s.target in _IN_PLACE_OPS and not s.kwargs:
        base = s.args[0] if s.args else None
        if not isinstance(base, Node) or len(base.users) != 1:
            return False
        s = base
    return _fresh(s)


def _reusable(s, out_meta) -> bool:
    if not isinstance(s, Node) or len(s.users) != 1 or not _owned_buffer(s):
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


_JOINS = (_aten.stack.default, _aten.cat.default)
_IN_PLACE_OPS = frozenset(_IN_PLACE.values())


def _out_overload(target):
    """The ``out=`` overload of a functional pointwise overload (``add.Tensor`` -> ``add.out``),
    with the same arguments plus ``out``; ``None`` if it has none."""
    packet = target.overloadpacket
    name = "out" if target._overloadname in ("default", "Tensor") else f"{target._overloadname}_out"
    out = getattr(packet, name, None) if name in packet.overloads() else None
    if out is None:
        return None
    args = [(a.name, str(a.type)) for a in target._schema.arguments]
    out_args = [(a.name, str(a.type)) for a in out._schema.arguments]
    return out if out_args[:-1] == args and out_args[-1][0] == "out" else None


#: ops whose every element is one correctly rounded IEEE operation (``alpha`` left out or 1): the
#: same bits whichever loop computes them. Into a strided slot TensorIterator may run other loops
#: than into a fresh buffer (scalar ones, other tails), and a transcendental's vectorized and scalar
#: versions round differently (so would ``a + alpha * b``, fused in the vectorized loop)
_EXACT = (_aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor, _aten.neg.default)
_EXACT_ANY_LAYOUT = frozenset(_EXACT) | frozenset(_IN_PLACE[t] for t in _EXACT)
_FULL_FLOATS = (torch.float32, torch.float64)
_WITH_ALPHA = frozenset({_aten.add.Tensor, _aten.sub.Tensor, _IN_PLACE[_aten.add.Tensor], _IN_PLACE[_aten.sub.Tensor]})


def _exact_in_any_layout(node: Node) -> bool:
    """Whether ``node`` is one of :data:`_EXACT_ANY_LAYOUT` with ``alpha`` 1 on real operands of
    full precision (or integers)."""
    t = node.target
    if t not in _EXACT_ANY_LAYOUT or set(node.kwargs) - {"alpha"}:
        return False
    alpha = node.kwargs.get("alpha", node.args[2] if t in _WITH_ALPHA and len(node.args) > 2 else 1)
    if isinstance(alpha, Node) or alpha != 1:
        return False
    for a in (*node.args, node):
        if isinstance(a, Node):
            m = a.meta.get("tensor_meta")
            # float16/bfloat16: the scalar loop's NaN is not the vectorized one's (sign, payload)
            if m is None or m.dtype.is_complex or (m.dtype.is_floating_point and m.dtype not in _FULL_FLOATS):
                return False
        elif isinstance(a, complex):
            return False
    return True


def _part_producer(part) -> "tuple[Node, list[Node]] | None":
    """The fresh pointwise node whose buffer ``part`` is, and the in-place pointwise ops (which
    write into their first operand and return it) on the way, through views that change nothing
    (an identity ``permute``, a ``view``/``reshape`` to the same shape); every node on the way is
    used only there."""
    n, in_place = part, []
    while True:
        if not isinstance(n, Node) or n.op != "call_function" or len(n.users) != 1:
            return None
        t = n.target
        src = n.args[0] if n.args else None
        if t in _IN_PLACE_OPS:
            in_place.append(n)
            n = src
            continue
        if t is _aten.permute.default and list(n.args[1]) == list(range(len(n.args[1]))):
            n = src
            continue
        if t in (_aten.view.default, _aten.reshape.default, _aten.alias.default):
            a, b = _contiguous_meta(n), _contiguous_meta(src)
            if a is not None and b is not None and tuple(a.shape) == tuple(b.shape):
                n = src
                continue
        break
    if (not _fresh(n) or not isinstance(n.target, torch._ops.OpOverload) or torch.Tag.pointwise not in n.target.tags
            or _out_overload(n.target) is None or _contiguous_meta(n) is None):
        return None
    return n, in_place


def _records_derivatives(inputs) -> bool:
    """Whether the graph's operations would record a derivative: an input that requires grad (with
    grad enabled), a forward-mode dual level, or a torch.func transform around the call. ``out=``
    records none, so the graph then runs its original operations."""
    if torch.autograd.forward_ad._current_level >= 0:
        return True
    grad = torch.is_grad_enabled()
    for t in inputs:
        if isinstance(t, torch.Tensor) and ((grad and t.requires_grad)
                                            or torch._C._functorch.is_functorch_wrapped_tensor(t)):
            return True
    return False


def _joined_buffer(shape, dtype, *inputs) -> "torch.Tensor | None":
    """The joined buffer, on the device of the graph's first tensor input; ``None`` where the
    call records derivatives (then every part is computed as recorded, and joined as recorded)."""
    if _records_derivatives(inputs):
        return None
    ref = next(t for t in inputs if isinstance(t, torch.Tensor))
    return torch.empty(shape, dtype=dtype, device=ref.device)


def _slot(buf, dim: int, start: int, length: "int | None"):
    if buf is None:
        return None
    return buf.select(dim, start) if length is None else buf.narrow(dim, start, length)


def _compute_into(out, op, out_op, *args, **kwargs) -> torch.Tensor:
    """``op(*args)`` written into ``out`` (a slot of a joined buffer) by its ``out=`` overload; the
    recorded op itself where there is no buffer."""
    if out is None:
        return op(*args, **kwargs)
    return out_op(*args, **kwargs, out=out)


def _join(buf, join, parts, *args) -> torch.Tensor:
    """The joined buffer, which the parts were computed into; the recorded join of the parts where
    there is none."""
    return join(parts, *args) if buf is None else buf


def join_in_place(gm: GraphModule) -> int:
    """Compute the parts of a ``stack``/``cat`` straight into the joined buffer, in place in ``gm``
    (for eager replay): a part whose buffer is a fresh pointwise result, used only on its way to
    the join, is written by that op's ``out=`` overload into its slot of the joined buffer, and
    the join's copy disappears. A contiguous slot (every dimension before the joined one has one
    element: a join along the first dimension, say) gets any such op: the same loops over the same
    elements as a fresh buffer. A strided slot only gets ops that are one correctly rounded
    operation per element (``+ - * /`` and negation with ``alpha`` 1, on float32/float64 or
    integers): another loop order or a scalar tail changes no bit of those, but does change a
    transcendental's, and a half-precision NaN's. A call that records derivatives runs the
    recorded operations and join. Reads the nodes' ``tensor_meta`` (``ShapeProp``); returns the
    number of joins removed."""
    graph = gm.graph
    done = 0
    for join in list(graph.nodes):
        if join.op != "call_function" or join.target not in _JOINS or join.kwargs or len(join.args) > 2:
            continue
        parts = join.args[0]
        out_meta = _contiguous_meta(join)
        if out_meta is None or not isinstance(parts, (list, tuple)) or not parts or len(set(parts)) != len(parts):
            continue
        stacked = join.target is _aten.stack.default
        dim = join.args[1] if len(join.args) > 1 else 0
        dim = dim % len(out_meta.shape) if len(out_meta.shape) else 0
        # a slot is contiguous where every dimension before the joined one has one element
        contiguous_slots = all(size == 1 for size in out_meta.shape[:dim])
        producers, starts, start = [], [], 0
        for part in parts:
            found = _part_producer(part)
            n, in_place = found if found is not None else (None, [])
            m = _contiguous_meta(part) if isinstance(part, Node) else None
            pm = _contiguous_meta(n) if n is not None else None
            if (n is None or m is None or pm is None or pm.dtype != out_meta.dtype or tuple(pm.shape) != tuple(m.shape)
                    or not (contiguous_slots or all(_exact_in_any_layout(k) for k in (n, *in_place)))):
                producers = None
                break
            want = list(out_meta.shape)
            if stacked:
                del want[dim]
            else:
                want[dim] = m.shape[dim] if dim < len(m.shape) else -1
            if list(m.shape) != want:
                producers = None
                break
            producers.append(n)
            starts.append(start)
            start += 1 if stacked else m.shape[dim]
        if not producers or len(set(producers)) != len(producers):
            continue
        order = {n: i for i, n in enumerate(graph.nodes)}
        first = min(producers, key=order.__getitem__)
        # the graph's tensor inputs: the buffer's device is the first's (an operand could be a CPU
        # scalar tensor), and any of them recording a derivative keeps the recorded operations
        inputs = tuple(a for a in graph.nodes if a.op in ("placeholder", "get_attr") and "tensor_meta" in a.meta)
        if not inputs or inputs[0].op != "placeholder":
            continue
        for a in inputs:  # an attribute read later in the graph is read before the buffer (it depends on nothing)
            if a.op == "get_attr" and order[a] > order[first]:
                first.prepend(a)
        with graph.inserting_before(first):
            buf = graph.call_function(_joined_buffer, (tuple(out_meta.shape), out_meta.dtype, *inputs))
        for n, s, part in zip(producers, starts, parts):
            with graph.inserting_before(n):
                length = None if stacked else _contiguous_meta(part).shape[dim]
                slot = graph.call_function(_slot, (buf, dim, s, length))
                new = graph.call_function(_compute_into, (slot, n.target, _out_overload(n.target), *n.args),
                                          dict(n.kwargs))
            new.meta.update(n.meta)
            n.replace_all_uses_with(new)
            graph.erase_node(n)
        with graph.inserting_before(join):
            # (the join's own arguments: a part that was its producer has been replaced)
            joined = graph.call_function(_join, (buf, join.target, list(join.args[0]), *join.args[1:]))
        join.replace_all_uses_with(joined)
        joined.meta.update(join.meta)
        graph.erase_node(join)
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done


_SLOT_GRADS = (_aten.select_backward.default, _aten.slice_backward.default)


def _slot_leaf(node: Node, sizes, dim) -> "tuple[Node, int, int | None] | None":
    """``(grad, start, length)`` of a ``select_backward`` (``length`` ``None``) or a step-1
    ``slice_backward`` of ``sizes`` along ``dim`` used only once; ``None`` otherwise."""
    if node.op != "call_function" or node.target not in _SLOT_GRADS or node.kwargs or len(node.users) != 1:
        return None
    grad, leaf_sizes, leaf_dim = node.args[:3]
    if not isinstance(grad, Node) or list(leaf_sizes) != list(sizes):
        return None
    n = len(sizes)
    if not isinstance(leaf_dim, int) or not -n <= leaf_dim < n or leaf_dim % n != dim:
        return None
    size = sizes[dim]
    if node.target is _aten.select_backward.default:
        index = node.args[3]
        if not isinstance(index, int) or not -size <= index < size:
            return None
        return grad, index % size, None
    start, end, step = node.args[3:6] if len(node.args) >= 6 else (*node.args[3:5], 1)
    if not (isinstance(start, int) and isinstance(end, int) and step == 1):
        return None
    start = min(max(start + size if start < 0 else start, 0), size)
    end = min(max(end + size if end < 0 else end, start), size)
    return grad, start, end - start


def _slot_sum_leaves(node: Node, sizes, dim, root: bool) -> "list | None":
    """The leaves of a tree of ``add`` (``alpha`` 1) over slot gradients (:func:`_slot_leaf`),
    every inner node used only by its parent; ``None`` where ``node`` is not such a tree."""
    if node.op != "call_function":
        return None
    if node.target is _aten.add.Tensor:
        if node.kwargs or len(node.args) != 2 or not (root or len(node.users) == 1):
            return None
        leaves = []
        for a in node.args:
            sub = _slot_sum_leaves(a, sizes, dim, False) if isinstance(a, Node) else None
            if sub is None:
                return None
            leaves += sub
        return leaves
    leaf = _slot_leaf(node, sizes, dim)
    return None if leaf is None else [leaf]


def _sum_into_slots(sizes, dim: int, spans, *grads) -> torch.Tensor:
    """The sum of ``select_backward`` / ``slice_backward`` of ``grads`` into disjoint ``spans``
    (``(start, length)``, ``length`` ``None`` for a selected index) of a ``sizes`` tensor, written
    into one buffer: each slot is ``grad + 0.0`` (what the recorded sum gives it: ``0.0 + g``, the
    same bits, ``-0.0`` included), every other element ``+0.0``. A call that records derivatives
    runs the recorded operations."""
    if _records_derivatives(grads):
        out = None
        for (start, length), g in zip(spans, grads):
            part = (_aten.select_backward.default(g, sizes, dim, start) if length is None
                    else _aten.slice_backward.default(g, sizes, dim, start, start + length, 1))
            out = part if out is None else out + part
        return out
    covered = sum(1 if length is None else length for _, length in spans)
    ref = grads[0]
    buf = (torch.empty if covered == sizes[dim] else torch.zeros)(sizes, dtype=ref.dtype, device=ref.device)
    for (start, length), g in zip(spans, grads):
        torch.add(g, 0.0, out=_slot(buf, dim, start, length))
    return buf


def sum_slots(gm: GraphModule) -> int:
    """Replace each sum of gradients scattered into disjoint slots of one tensor (``select_backward``
    / ``slice_backward`` of ``x[0]``, ``x[1]``, ``x[:, :k]``... added together: reverse mode through
    the unpacking of ``x``), which allocates and fills a zero tensor per part and adds them all, by
    one buffer whose slots are written once, in place in ``gm`` (for eager replay). Exact: a slot
    holds ``g + 0.0`` as in the recorded sum (addition is commutative bit for bit, and adding
    ``+0.0`` again changes nothing), for float32/float64, whose ``+`` is one correctly rounded
    operation in any loop. Reads the nodes' ``tensor_meta``; returns the number of sums replaced."""
    graph = gm.graph
    done = 0
    erased: set = set()
    for node in reversed(list(graph.nodes)):  # the outermost sum first
        if node in erased or node.op != "call_function" or node.target is not _aten.add.Tensor:
            continue
        out_meta = _contiguous_meta(node)
        if out_meta is None or out_meta.dtype not in _FULL_FLOATS or not len(out_meta.shape):
            continue
        sizes = [int(s) for s in out_meta.shape]
        first = node
        while isinstance(first, Node) and first.op == "call_function" and first.target is _aten.add.Tensor and first.args:
            first = first.args[0]
        if (not isinstance(first, Node) or first.op != "call_function" or first.target not in _SLOT_GRADS
                or len(first.args) < 3 or not isinstance(first.args[2], int)):
            continue
        dim = first.args[2] % len(sizes)
        leaves = _slot_sum_leaves(node, sizes, dim, True)
        if not leaves or len(leaves) < 2:
            continue
        spans, covered = [], [False] * sizes[dim]
        for g, start, length in leaves:
            gm_meta = g.meta.get("tensor_meta")
            width = 1 if length is None else length
            slot = sizes[:dim] + ([] if length is None else [length]) + sizes[dim + 1:]
            # (the recorded op broadcasts a smaller gradient into its slot; out= would not)
            if (gm_meta is None or gm_meta.dtype != out_meta.dtype or list(gm_meta.shape) != slot
                    or any(covered[start:start + width])):
                spans = None
                break
            covered[start:start + width] = [True] * width
            spans.append((start, length))
        if not spans:
            continue
        # the tree's inner adds and leaves go with it (each used only on its way to the root)
        inner = []
        stack = list(node.args)
        while stack:
            a = stack.pop()
            inner.append(a)
            if a.target is _aten.add.Tensor:
                stack += list(a.args)
        with graph.inserting_before(node):
            new = graph.call_function(_sum_into_slots, (sizes, dim, tuple(spans), *[g for g, _, _ in leaves]))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for a in sorted(inner, key=order.__getitem__, reverse=True):  # users before what they use
            graph.erase_node(a)
            erased.add(a)
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done


#: ops that return a view of their first operand and may leave its shape and strides as they are
_ALIAS_OPS = frozenset({_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default, _aten.alias.default,
                        _aten.permute.default, _aten.expand.default})
#: views whose chain may be shortened: ``view(view(b, s1), s2)`` is ``view(b, s2)`` for a contiguous ``b``
_RESHAPES = frozenset({_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default})


def _same_layout(a: Node, b: Node) -> bool:
    ma, mb = a.meta.get("tensor_meta"), b.meta.get("tensor_meta")
    return (ma is not None and mb is not None and hasattr(ma, "stride") and hasattr(mb, "stride")
            and tuple(ma.shape) == tuple(mb.shape) and tuple(ma.stride) == tuple(mb.stride)
            and ma.dtype == mb.dtype)


def drop_identity_views(gm: GraphModule) -> int:
    """Remove the views that change nothing, in place in ``gm`` (for eager replay, where each costs
    a dispatch): a ``view``/``reshape``/identity ``permute``/``expand``... whose result has its
    operand's shape and strides is replaced by the operand (the same elements in the same memory),
    and a ``view``/``reshape`` of a ``view`` of a contiguous tensor reads that tensor directly (a
    row-major reshape of a row-major reshape): the same values, and the same gradients where the
    call records them (an ``unbind`` stays: its elements as ``select`` would give a zero gradient
    another sign). Reads the nodes' ``tensor_meta`` (``ShapeProp``);
    returns the number of nodes removed."""
    graph = gm.graph
    before = len(graph.nodes)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _ALIAS_OPS or node.kwargs:
            continue
        src = node.args[0] if node.args else None
        if not isinstance(src, Node):
            continue
        if _same_layout(node, src):
            node.replace_all_uses_with(src)
            graph.erase_node(node)
            continue
        if (node.target in _RESHAPES and src.op == "call_function" and src.target is _aten.view.default
                and not src.kwargs and isinstance(src.args[0], Node)
                and _contiguous_meta(src.args[0]) is not None and _contiguous_meta(src) is not None):
            node.args = (src.args[0], *node.args[1:])
            if not src.users:
                graph.erase_node(src)
    done = before - len(graph.nodes)
    if done:
        graph.lint()
        gm.recompile()
    return done


def _multiply_add(a, b, c):
    """``a + b * c`` as one ``addcmul``; the recorded ``mul`` and ``add`` where the call records
    derivatives."""
    if _records_derivatives((a, b, c)):
        return _aten.add.Tensor(a, _aten.mul.Tensor(b, c))
    return torch.addcmul(a, b, c)  # (a graph of the fast variant: plain tensors, no torch-function mode)


def _multiply_add_into(out, a, b, c):
    """``a + b * c`` written into ``out`` (a slot of a joined buffer) by one ``addcmul``; as
    :func:`_multiply_add` where there is no buffer."""
    if out is None:
        return _multiply_add(a, b, c)
    return torch.addcmul(a, b, c, out=out)


def unit_valued(t) -> bool:
    """Whether every element of the real floating tensor ``t`` is ``0``, ``1`` or ``-1`` (a
    product by it is exact: it rounds nothing and cannot overflow)."""
    return (isinstance(t, torch.Tensor) and t.dtype in _FULL_FLOATS and t.layout == torch.strided
            and bool(((t == 0) | (t == 1) | (t == -1)).all()))


_UNIT_VIEWS = _ALIAS_OPS | {_aten.select.int, _aten.slice.Tensor, _aten.unsqueeze.default, _aten.squeeze.dim,
                            _aten.t.default, _aten.transpose.int}


def _product_operand(node: Node, m, units) -> "Node | None":
    """``m`` where it is a ``mul`` that can be folded into the ``add`` ``node``: used only there, of
    real full-precision tensors of the add's dtype, one factor among ``units``."""
    out = node.meta.get("tensor_meta")
    if not (isinstance(m, Node) and m.op == "call_function" and m.target is _aten.mul.Tensor and not m.kwargs
            and len(m.users) == 1 and len(m.args) == 2 and all(isinstance(a, Node) for a in m.args)
            and any(a in units for a in m.args)):
        return None
    metas = [a.meta.get("tensor_meta") for a in (*m.args, m)]
    if out is None or out.dtype not in _FULL_FLOATS or any(t is None or t.dtype != out.dtype for t in metas):
        return None
    return m


def fuse_multiply_add(gm: GraphModule, units) -> int:
    """Fold ``add(a, mul(b, c))`` (``alpha`` 1, the ``mul`` used only there; also an ``add`` computed
    into a joined buffer's slot by :func:`join_in_place`) into one ``addcmul``, in place in ``gm``
    (for eager replay): one kernel and no intermediate instead of two, where ``b`` or ``c`` is
    one of ``units``: the graph's constant inputs whose every element is 0, 1 or -1
    (:func:`unit_valued`; seed rows and masks folded from them). PyTorch's ``addcmul`` may fuse
    the multiply and the add (one rounding instead of two): only a product that rounds nothing
    gives the recorded bits either way, at every input. (A NaN stays a NaN, but where two NaNs
    meet, ``NaN + 0 * inf``, the fused operation may keep the other one's sign and payload.) Reads
    the nodes' ``tensor_meta``; returns the number of ``mul`` folded."""
    graph = gm.graph
    units = set(units)
    for node in graph.nodes:  # a view of such a constant holds 0, 1 and -1 only
        if (node.op == "call_function" and node.target in _UNIT_VIEWS and node.args
                and isinstance(node.args[0], Node) and node.args[0] in units):
            units.add(node)
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is _aten.add.Tensor and not node.kwargs and len(node.args) == 2:
            slot, (a, b) = None, node.args
        elif (node.target is _compute_into and node.args[1] is _aten.add.Tensor and not node.kwargs
              and len(node.args) == 5):
            slot, (a, b) = node.args[0], node.args[3:]
        else:
            continue
        if not (isinstance(a, Node) and isinstance(b, Node)):
            continue
        for other, m in ((a, _product_operand(node, b, units)), (b, _product_operand(node, a, units))):
            if m is None or other is m:  # (m + m: the product is read twice)
                continue
            meta = other.meta.get("tensor_meta")
            if meta is None or meta.dtype != node.meta["tensor_meta"].dtype:
                continue
            if slot is None:
                node.target, node.args = _multiply_add, (other, *m.args)
            else:
                node.target, node.args = _multiply_add_into, (slot, other, *m.args)
            graph.erase_node(m)
            done += 1
            break
    if done:
        graph.lint()
        gm.recompile()
    return done


#: ATen overloads of tensor operands only and the public bindings that dispatch them to the same
#: kernels with the same arguments: ``torch.*`` functions and ``Tensor`` methods parse their
#: arguments in C, where an ``OpOverload`` call goes through Python and boxes them (0.7 us more a
#: call, 1.4 us for a view, on this project's machine)
_FUNCTIONS = {_aten.add.Tensor: torch.add, _aten.sub.Tensor: torch.sub, _aten.mul.Tensor: torch.mul,
              _aten.div.Tensor: torch.div, _aten.neg.default: torch.neg, _aten.addcmul.default: torch.addcmul}
_METHODS = {_aten.view.default: "view", _aten.select.int: "select", _aten.reshape.default: "reshape",
            _aten.permute.default: "permute", _aten.add_.Tensor: "add_", _aten.sub_.Tensor: "sub_",
            _aten.mul_.Tensor: "mul_", _aten.div_.Tensor: "div_", _aten.neg_.default: "neg_"}


def _public_into(out, name: str, *args) -> torch.Tensor:
    """``torch.<name>(*args)`` written into ``out`` (a slot of a joined buffer, see
    :func:`_compute_into`); computed as a new tensor where there is no buffer."""
    fn = getattr(torch, name)
    return fn(*args) if out is None else fn(*args, out=out)


def _tensor_operands(node: Node) -> bool:
    """Whether every operand of a pointwise ``node`` is a tensor node (a Python number would be
    converted differently by the two bindings: a wrapped number or a plain 0-d tensor)."""
    schema = node.target._schema
    for arg, value in zip(schema.arguments, node.args):
        if str(arg.type).startswith("Tensor") and not isinstance(value, Node):
            return False
    return True


def public_bindings(gm: GraphModule) -> int:
    """Call the operations of :data:`_FUNCTIONS` and :data:`_METHODS` through ``torch.*`` and
    ``Tensor`` methods, in place in ``gm`` (for eager replay): the same kernels on the same
    operands, with less Python around each call. A torch-function mode or a subclass's
    ``__torch_function__`` would see other functions than the recorded ATen calls: the caller runs
    the graph only on plain tensors with no torch-function mode active. Returns the number of nodes
    changed."""
    done = 0
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target is _compute_into and not node.kwargs
                and node.args[1] in _FUNCTIONS and all(isinstance(a, Node) for a in node.args[3:])):
            node.target = _public_into
            node.args = (node.args[0], _FUNCTIONS[node.args[1]].__name__, *node.args[3:])
            done += 1
            continue
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        t = node.target
        if set(node.kwargs) - {"alpha"} or node.kwargs.get("alpha", 1) != 1:
            continue
        if t in _FUNCTIONS and _tensor_operands(node):
            node.target = _FUNCTIONS[t]
            done += 1
        elif t in _METHODS and (t not in _IN_PLACE_OPS or _tensor_operands(node)):
            node.op, node.target = "call_method", _METHODS[t]
            done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
