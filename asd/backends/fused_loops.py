"""A recorded products graph as one generated Numba loop nest, for eager replay on the CPU.

Eager replay (:mod:`asd.backends.replay`) runs a graph as ATen calls: every elementwise operation
is a pass over its operands and a new buffer. For a graph that is only elementwise arithmetic
(the folded JVP of a stencil: the seed-only work is constant, what is left multiplies and adds
the point's values into the seed rows) the passes, not the arithmetic, are the time. This module
writes such a graph as Python source of one loop nest, with the shapes and strides as literals,
compiles it with Numba, and writes each product once into the joined buffer; the final gather
stays :func:`asd.backends.cpu_kernels.take` (a gather inside the loop nest was measured three
times slower).

A graph qualifies when, up to views, it is

* inputs (placeholders, held tensors) of one real floating dtype, float32 or float64, contiguous;
* elementwise operations that round once each, IEEE 754's own: ``+ - * /``, negation, absolute
  value, reciprocal and squaring (``pow`` by 2), with Python scalars;
* views of the inputs (any layout ATen gives them) and of the computed values (permutations,
  broadcasts, inserted and removed unit dimensions, ``select``, ``slice``);
* ``stack``/``cat`` of such values at the end, optionally flattened and gathered by a constant
  index.

Each operation of the loop is the graph's, in the graph's order, on the same operands, rounded
once: the loop returns the graph's bits, NaN's sign and payload aside (LLVM may turn ``x * -1``
into a negation and swap the operands of ``+`` and ``*``, and x86 passes on the first operand's
NaN). Square roots and transcendental functions, whose ATen kernels on this machine differ from
the correctly rounded result by an ulp, are left to ATen.
:func:`~asd.backends.replay.eager_replay` checks the bits all the same, as for every variant, and
times the loop against the others.

Compiled kernels are written to ``$ASD_CACHE_DIR/fused`` (beside the compiled graphs of
:mod:`asd.backends.compile_cache`, named by a hash of their source) and cached there by Numba:
a second process loads one in milliseconds instead of compiling it (about 0.15 s).
``ASD_CACHE_DIR=""`` keeps them in memory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import operator
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch.fx import GraphModule, Node

from .._fork import fork_safe

__all__ = ["fused_runner", "kernel_source", "KNOWN_TARGETS", "FUSED_DTYPES", "MAX_STATEMENTS", "MAX_KERNEL_FILES"]

aten = torch.ops.aten

FUSED_DTYPES = (torch.float32, torch.float64)
#: a graph whose loop bodies would hold more statements than this is left to ATen (a computed
#: value read at several shifted indices is computed at each: chains of shifts multiply)
MAX_STATEMENTS = 2000
#: kernel sources kept in the on-disk folder (the oldest go first)
MAX_KERNEL_FILES = 256
#: kernels this process's memo keeps (the oldest go first)
MAX_KERNELS = 128
_LOCK = fork_safe(threading.Lock())
#: kernels compiled or loaded in this process, by source hash
_KERNELS: dict[str, Callable] = {}


class _Unfusable(Exception):
    """The graph is not one this module writes as a loop."""


# ----------------------------------------------------------------------------------- index forms
@dataclass(frozen=True)
class _Lin:
    """An index ``const + sum(coeff * loop variable)``."""

    const: int
    terms: tuple = ()  # ((variable, coeff), ...), sorted

    @staticmethod
    def var(name: str) -> "_Lin":
        return _Lin(0, ((name, 1),))

    def scaled(self, k: int) -> "_Lin":
        if k == 0:
            return _Lin(0)
        return _Lin(self.const * k, tuple((v, c * k) for v, c in self.terms))

    def plus(self, other: "_Lin") -> "_Lin":
        acc = dict(self.terms)
        for v, c in other.terms:
            acc[v] = acc.get(v, 0) + c
        return _Lin(self.const + other.const, tuple(sorted((v, c) for v, c in acc.items() if c)))

    def render(self) -> str:
        parts = [v if c == 1 else f"{c} * {v}" for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def _offset(index: tuple, strides, base: int) -> _Lin:
    acc = _Lin(base)
    for i, s in zip(index, strides):
        acc = acc.plus(i.scaled(int(s)))
    return acc


# ------------------------------------------------------------------------------- graph analysis
_UNARY = {
    aten.neg.default: "-({0})",
    aten.abs.default: "abs({0})",
    aten.reciprocal.default: "{one} / ({0})",
    aten.square.default: "({0}) * ({0})",
}
_BINARY = {
    aten.add.Tensor: "+", aten.add.Scalar: "+",
    aten.sub.Tensor: "-", aten.sub.Scalar: "-",
    aten.mul.Tensor: "*", aten.mul.Scalar: "*",
    aten.div.Tensor: "/", aten.div.Scalar: "/",
    aten.rsub.Tensor: "-", aten.rsub.Scalar: "-",
}
#: ``rsub(a, b)`` is ``b - a``
_REVERSED = {aten.rsub.Tensor, aten.rsub.Scalar}
#: views whose result on an input is read off the input's storage (offset and strides, as ATen laid
#: it out at the example: the same op on an input of the same layout lays it out the same)
_VIEW_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default,
    aten.permute.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.select.int, aten.slice.Tensor, aten.narrow.default,
    aten.t.default, aten.transpose.int, aten.unbind.int, aten.split.Tensor, aten.split_with_sizes.default,
    aten.unflatten.int, aten.flatten.using_ints, aten.diagonal.default,
    aten.detach.default, aten.expand_as.default, aten.view_as.default, aten.movedim.int,
}
_IDENTITY = {aten.alias.default, aten.detach.default, aten.clone.default, aten.lift_fresh_copy.default,
             aten.contiguous.default}
_RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default}


def _scalar_literal(value, dtype: torch.dtype) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Unfusable(f"scalar {type(value).__name__}")
    if isinstance(value, int) and abs(value) > (1 << 24):
        raise _Unfusable("integer scalar beyond float32's exact range")
    v = float(value)
    if not math.isfinite(v):
        raise _Unfusable("non-finite scalar")
    return f"np.{'float32' if dtype == torch.float32 else 'float64'}({v!r})"


class _Writer:
    """The loop nests of one graph, with the inputs it reads (see :func:`kernel_source`)."""

    def __init__(self, gm: GraphModule, values: dict, leaves: dict, dtype: torch.dtype):
        self.gm, self.values, self.leaves, self.dtype = gm, values, leaves, dtype
        self.views: dict = {}  # node -> (leaf node, offset, strides): a view of an input
        self.multi: dict = {}  # node -> leaf node: a tuple of views of an input (unbind, split)
        self.lines: list[str] = []
        self.statements = 0

    # -- what a node is
    def classify(self) -> None:
        for node in self.gm.graph.nodes:
            if node.op != "call_function" or node in self.leaves:
                continue
            val = self.values.get(node)
            source = node.args[0] if node.args and isinstance(node.args[0], Node) else None
            is_view = node.target in _VIEW_OPS or (node.target is operator.getitem and source is not None
                                                   and source.target in _VIEW_OPS)
            if not is_view or source is None:
                continue
            base = source if source in self.leaves else (self.views.get(source, (None,))[0]
                                                         or self.multi.get(source))
            if base is None:
                continue
            if isinstance(val, (tuple, list)):  # unbind, split: their items are the views
                self.multi[node] = base
                continue
            if not isinstance(val, torch.Tensor):
                continue
            leaf = self.values[base]
            if (val.untyped_storage().data_ptr() != leaf.untyped_storage().data_ptr()
                    or val.dtype != leaf.dtype):
                raise _Unfusable(f"{node.target} of an input does not view it")
            off = val.storage_offset() - leaf.storage_offset()
            self.views[node] = (base, off, tuple(val.stride()))

    # -- index maps
    def _shape(self, node) -> tuple:
        v = self.values.get(node)
        if not isinstance(v, torch.Tensor):
            raise _Unfusable(f"{getattr(node, 'target', node)} is not a tensor")
        return tuple(v.shape)

    def _view_source_index(self, node: Node, index: tuple) -> tuple:
        """The index into a computed view's source that holds its element at ``index``."""
        t, args = node.target, node.args
        src = args[0]
        if t is operator.getitem:  # an item of unbind: a select
            if not (isinstance(src, Node) and src.target is aten.unbind.int):
                raise _Unfusable("getitem")
            dim = src.args[1] if len(src.args) > 1 else src.kwargs.get("dim", 0)
            sshape = self._shape(src.args[0])
            dim %= len(sshape)
            return (*index[:dim], _Lin(args[1] % sshape[dim]), *index[dim:])
        sshape, shape = self._shape(src), self._shape(node)
        if t in _IDENTITY:
            return index
        if t is aten.permute.default:
            dims = [d % len(sshape) for d in args[1]]
            out = [None] * len(sshape)
            for k, d in enumerate(dims):
                out[d] = index[k]
            return tuple(out)
        if t in (aten.t.default, aten.transpose.int):
            if len(sshape) < 2:
                return index
            a, b = (0, 1) if t is aten.t.default else (args[1] % len(sshape), args[2] % len(sshape))
            out = list(index)
            out[a], out[b] = index[b], index[a]
            return tuple(out)
        if t in (aten.expand.default, aten.expand_as.default):
            lead = len(shape) - len(sshape)
            return tuple(_Lin(0) if sshape[d] == 1 and shape[lead + d] != 1 else index[lead + d]
                         for d in range(len(sshape)))
        if t is aten.select.int:
            dim = args[1] % len(sshape)
            return (*index[:dim], _Lin(args[2] % sshape[dim]), *index[dim:])
        if t is aten.slice.Tensor:
            dim = (args[1] if len(args) > 1 else 0) % len(sshape)
            start = args[2] if len(args) > 2 else 0
            step = args[4] if len(args) > 4 else 1
            start = 0 if start is None else start
            if not isinstance(start, int) or not isinstance(step, int) or step < 1:
                raise _Unfusable("slice bounds")
            start = min(max(start + sshape[dim] if start < 0 else start, 0), sshape[dim])
            return (*index[:dim], index[dim].scaled(step).plus(_Lin(start)), *index[dim + 1:])
        if t in _RESHAPES or t in (aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim,
                                   aten.squeeze.dims):
            # only unit dimensions inserted or removed: the other dimensions map in order
            kept = [i for i, s in zip(index, shape) if s != 1]
            if [s for s in sshape if s != 1] != [s for s in shape if s != 1]:
                raise _Unfusable(f"{t} of a computed value that moves elements")
            it = iter(kept)
            return tuple(_Lin(0) if s == 1 else next(it) for s in sshape)
        raise _Unfusable(f"view {t} of a computed value")

    # -- expressions
    def value(self, node, index: tuple, memo: dict) -> str:
        """A name (or literal) holding ``node``'s element at ``index`` in the loop body."""
        if not isinstance(node, Node):
            return _scalar_literal(node, self.dtype)
        if node in self.leaves or node in self.views:
            leaf, off, strides = (node, 0, tuple(self.values[node].stride())) if node in self.leaves \
                else self.views[node]
            if node in self.leaves and self.values[node].dim() == 0:
                strides = ()
            at = _offset(index, strides, off).render()
            key = (leaf, at)
            if key not in memo:
                memo[key] = name = f"v{len(memo)}"
                self._emit(f"{name} = {self.leaves[leaf]}[{at}]")
            return memo[key]
        t = node.target
        key = (node, tuple(i.render() for i in index))
        if key in memo:
            return memo[key]
        shape = self._shape(node)
        if t in _BINARY or t in _UNARY:
            val = self.values[node]
            if val.dtype != self.dtype:
                raise _Unfusable(f"{t} computes in {val.dtype}")
            if t in (aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar) or t in _REVERSED:
                if node.kwargs.get("alpha", 1) != 1 or len(node.args) > 2:
                    raise _Unfusable("alpha")
            if t in (aten.div.Tensor, aten.div.Scalar) and (node.kwargs.get("rounding_mode") is not None
                                                           or len(node.args) > 2):
                raise _Unfusable("rounding mode")
            operands = [self.value(a, self._broadcast(a, index, shape), memo) for a in node.args[:2 if t in _BINARY else 1]]
            if t in _REVERSED:
                expr = f"{operands[1]} - {operands[0]}"
            elif t in _BINARY:
                expr = f"{operands[0]} {_BINARY[t]} {operands[1]}"
            else:
                expr = _UNARY[t].format(operands[0], one=_scalar_literal(1.0, self.dtype))
        elif t is aten.pow.Tensor_Scalar and node.args[1] == 2 and not isinstance(node.args[1], bool):
            a = self.value(node.args[0], self._broadcast(node.args[0], index, shape), memo)
            expr = f"{a} * {a}"
        elif t in (aten.stack.default, aten.cat.default):  # read at a known position along the joined dimension
            name = self.value(*self._joined_part(node, index), memo)
            memo[key] = name
            return name
        elif t is aten._to_copy.default:  # a copy of the same dtype on the CPU: the same values
            src, val = node.args[0], self.values[node]
            sval = self.values.get(src)
            if (not isinstance(src, Node) or not isinstance(sval, torch.Tensor) or val.dtype != sval.dtype
                    or val.device.type != "cpu" or val.layout != torch.strided or sval.is_neg() or sval.is_conj()):
                raise _Unfusable("a copy that converts")
            name = self.value(src, index, memo)
            memo[key] = name
            return name
        elif t in _IDENTITY or t in _VIEW_OPS or t is operator.getitem:
            src = node.args[0]
            if t is operator.getitem:
                if not (isinstance(src, Node) and src.target is aten.unbind.int):
                    raise _Unfusable("getitem")
                inner = src.args[0]
            else:
                inner = src
            name = self.value(inner, self._view_source_index(node, index), memo)
            memo[key] = name
            return name
        else:
            raise _Unfusable(f"operation {t}")
        memo[key] = name = f"t{len(memo)}"
        self._emit(f"{name} = {expr}")
        return name

    def _joined_part(self, node: Node, index: tuple) -> tuple:
        """``(part, index into it)`` of a ``stack``/``cat`` read at ``index``, whose position along
        the joined dimension must be a constant (a part chosen per element is left to ATen)."""
        parts = node.args[0]
        nd = len(self._shape(node))
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % nd
        at = index[dim]
        if at.terms:
            raise _Unfusable("a join read along its joined dimension")
        if node.target is aten.stack.default:
            return parts[at.const], (*index[:dim], *index[dim + 1:])
        start = 0
        for part in parts:
            pshape = self._shape(part)
            if len(pshape) != nd:
                continue  # (an empty 1-D part)
            if start <= at.const < start + pshape[dim]:
                return part, (*index[:dim], _Lin(at.const - start), *index[dim + 1:])
            start += pshape[dim]
        raise _Unfusable("a join read out of its range")

    def _broadcast(self, operand, index: tuple, shape: tuple) -> tuple:
        if not isinstance(operand, Node):
            return ()
        oshape = self._shape(operand)
        lead = len(shape) - len(oshape)
        if lead < 0:
            raise _Unfusable("operand of more dimensions than the result")
        return tuple(_Lin(0) if oshape[d] == 1 and shape[lead + d] != 1 else index[lead + d]
                     for d in range(len(oshape)))

    def _emit(self, line: str) -> None:
        self.statements += 1
        if self.statements > MAX_STATEMENTS:
            raise _Unfusable("too many statements")
        self.lines.append(self.indent + line)

    # -- regions of the joined result
    def regions(self, node: Node, place: Callable, shape: tuple, target: str) -> None:
        """Loops writing ``node`` (of ``shape``) into the flat array ``target`` at ``place(index)``."""
        if isinstance(node, Node) and node.target in (aten.stack.default, aten.cat.default):
            parts = node.args[0]
            nd = len(shape)
            dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % nd
            start = 0
            for k, part in enumerate(parts):
                if node.target is aten.stack.default:
                    pshape = shape[:dim] + shape[dim + 1:]
                    self.regions(part, lambda idx, k=k, dim=dim, place=place: place((*idx[:dim], _Lin(k), *idx[dim:])),
                                 pshape, target)
                else:
                    pshape = self._shape(part)
                    if len(pshape) != nd:
                        if pshape == (0,):
                            continue  # (cat skips empty 1-D parts)
                        raise _Unfusable("cat of mismatched ranks")
                    self.regions(part, lambda idx, s=start, dim=dim, place=place:
                                 place((*idx[:dim], idx[dim].plus(_Lin(s)), *idx[dim + 1:])), pshape, target)
                    start += pshape[dim]
            return
        if not isinstance(node, Node):
            raise _Unfusable("a scalar part")
        if tuple(self._shape(node)) != tuple(shape):
            raise _Unfusable("a part of another shape than its slot")
        if math.prod(shape) == 0:
            return
        depth = len(shape)
        self.indent = "    "
        for d, size in enumerate(shape):
            self.lines.append(self.indent + f"for i{d} in range({size}):")
            self.indent += "    "
        index = tuple(_Lin.var(f"i{d}") for d in range(depth))
        name = self.value(node, index, {})
        self._emit(f"{target}[{place(index).render()}] = {name}")


def _values(gm: GraphModule, example: list) -> dict:
    """Every node's value on the example inputs (real tensors: views' strides and offsets are read off them)."""
    values: dict = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n] = out
            return out

    with torch.no_grad():
        _Recorder(gm).run(*example)
    return values


def _root(out: Node, values: dict) -> tuple:
    """``(root, gather)``: the joined value the output flattens (and gathers, by the index node
    ``gather``), through reshapes that move no element."""
    def through(node):
        while (isinstance(node, Node) and node.op == "call_function"
               and (node.target in _RESHAPES or (node.target is aten.permute.default
                                                 and list(node.args[1]) == list(range(len(node.args[1])))))):
            src = node.args[0]
            sv, v = values.get(src), values.get(node)
            if not (isinstance(sv, torch.Tensor) and isinstance(v, torch.Tensor) and sv.is_contiguous()
                    and v.is_contiguous() and sv.data_ptr() == v.data_ptr() and sv.numel() == v.numel()):
                break
            node = src
        return node

    node = through(out)
    gather = None
    if isinstance(node, Node) and node.op == "call_function" and node.target is aten.index_select.default:
        src, dim, gather = node.args
        sv = values.get(src)
        if dim not in (0, -1) or not isinstance(sv, torch.Tensor) or sv.dim() != 1 or not isinstance(gather, Node):
            raise _Unfusable("a gather other than a flat one")
        node = through(src)
    return node, gather


#: the operations a loop nest may hold (each still subject to its conditions: dtypes, scalars, views)
KNOWN_TARGETS = frozenset(set(_UNARY) | set(_BINARY) | _VIEW_OPS | _IDENTITY | {
    aten.pow.Tensor_Scalar, aten._to_copy.default, aten.stack.default, aten.cat.default,
    aten.index_select.default, operator.getitem})


def _supported(gm: GraphModule) -> None:
    """Every operation of ``gm`` is one the loop writes (an operation it would skip, a write or a
    random draw that the result does not read, must not be skipped)."""
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            raise _Unfusable(node.op)
        if node.op == "call_function" and node.target not in KNOWN_TARGETS:
            raise _Unfusable(f"operation {node.target}")


def kernel_source(gm: GraphModule, example: list, *, constant: set) -> tuple:
    """``(source, leaves, gather, root, values, layout)``: the Python source of
    ``kernel(*inputs, out)`` writing ``gm``'s joined result (``root``) into the flat ``out``, or
    of ``kernel(*inputs, index, out)`` writing it into a buffer of its own (laid out as ``layout``
    says) and gathering ``out[p] = buffer[index[p]]``; the input nodes it reads, in its
    parameters' order (placeholders, held tensors); the node of the final gather's index (``None``
    without one); every node's value at ``example``.
    ``constant``: placeholder positions whose tensors are the specialization's own (a gather index
    must be one). Raises :class:`_Unfusable`."""
    _supported(gm)
    values = _values(gm, example)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if not isinstance(out, Node):
        raise _Unfusable("output")
    root, gather = _root(out, values)
    leaves: dict = {}
    dtype = None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr") and node is not gather:
            v = values.get(node)
            if not isinstance(v, torch.Tensor):
                if node.op == "placeholder" and node.users:
                    raise _Unfusable("a non-tensor input")
                continue
            if not node.users:
                continue
            if type(v) not in (torch.Tensor, torch.nn.Parameter) or v.layout != torch.strided:
                raise _Unfusable("an input that is not a plain strided tensor")
            if dtype is None:
                dtype = v.dtype
            if v.dtype != dtype or v.dtype not in FUSED_DTYPES or not v.is_contiguous() or v.device.type != "cpu":
                raise _Unfusable(f"an input of {v.dtype}, {'' if v.is_contiguous() else 'non-'}contiguous")
            leaves[node] = f"a{len(leaves)}"
    if dtype is None or not isinstance(root, Node) or root in leaves:
        raise _Unfusable("nothing computed")
    rv = values.get(root)
    if not isinstance(rv, torch.Tensor) or rv.dtype != dtype:
        raise _Unfusable("the result's dtype")
    if gather is not None:
        gv = values.get(gather)
        if (gather.op != "placeholder" or phs.index(gather) not in constant or not isinstance(gv, torch.Tensor)
                or gv.dtype != torch.int64 or gv.dim() != 1 or not gv.is_contiguous()
                or (gv.numel() and not (0 <= int(gv.min()) and int(gv.max()) < rv.numel()))):
            raise _Unfusable("a gather index that is not a constant of the specialization's")
    writer = _Writer(gm, values, leaves, dtype)
    writer.classify()
    shape = tuple(rv.shape)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    pad = 0
    if gather is not None and len(shape) > 1 and shape[0] > 1 and (strides[0] * rv.element_size()) % 4096 == 0:
        # slabs a multiple of 4 KiB apart: the gather's loads from several slabs at once would meet in
        # the same cache sets (measured: 35 us against 25 us for B1 N=64's 49,152 values)
        pad = _SLAB_PAD_BYTES // rv.element_size()
        strides[0] += pad
    target = "buf" if gather is not None else "out"
    writer.regions(root, lambda idx: _offset(idx, strides, 0), shape, target)
    args = list(leaves.values()) + (["index", "out"] if gather is not None else ["out"])
    head = [f"def kernel({', '.join(args)}):"]
    # flat views of the inputs: the loads address their elements by the literal strides
    for node, name in leaves.items():
        v = values[node]
        if v.dim() != 1:
            head.append(f"    {name} = {name}.reshape({max(v.numel(), 1)})")
    if gather is not None:
        size = (shape[0] * strides[0]) if shape else 1
        head.append(f"    buf = np.empty({size}, np.{'float32' if dtype == torch.float32 else 'float64'})")
    body = writer.lines
    if gather is not None:
        body = body + ["    for p in range(index.shape[0]):", "        out[p] = buf[index[p]]"]
    if not body:
        body = ["    pass"]
    layout = _Layout(tuple(shape), tuple(strides), pad)
    return ("\n".join(["import numpy as np", "", ""] + head + body) + "\n", list(leaves), gather, root, values,
            layout)


@dataclass(frozen=True)
class _Layout:
    """Where the loops put the joined result's elements: ``shape``, at ``strides`` (the first
    dimension's slabs ``pad`` elements apart beyond contiguous)."""

    shape: tuple
    strides: tuple
    pad: int

    def positions(self, flat: torch.Tensor) -> torch.Tensor:
        """The positions in the loops' buffer of the contiguous result's flat ``flat`` positions."""
        if not self.pad:
            return flat
        slab = self.strides[0] - self.pad
        return flat // slab * self.strides[0] + flat % slab


#: the extra room between the slabs of a gathered result whose slabs are a multiple of 4 KiB long
#: (an odd number of cache lines; measured on B1 N=64)
_SLAB_PAD_BYTES = 1088


# ------------------------------------------------------------------------------------ compiling
def _kernel_dir() -> str | None:
    from .compile_cache import cache_dir

    root = cache_dir()
    return None if root is None else os.path.join(os.path.dirname(root), "fused")


def _trim(folder: str) -> None:
    """Keep the newest :data:`MAX_KERNEL_FILES` kernel sources (with Numba's cache files of each);
    drop partial writes a crashed process left over an hour ago."""
    try:
        entries = [(e.stat().st_mtime, e.path, e.name) for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return
    now = time.time()
    for mtime, path, name in entries:
        if name.endswith(".tmp") and now - mtime > 3600:
            try:
                os.remove(path)
            except OSError:
                pass
    files = sorted((mtime, path) for mtime, path, name in entries if name.endswith(".py"))
    for _, path in files[:max(0, len(files) - MAX_KERNEL_FILES)]:
        stem = os.path.splitext(os.path.basename(path))[0]
        try:
            os.remove(path)
            cached = os.path.join(folder, "__pycache__")
            for e in os.scandir(cached):
                if e.name.startswith(stem + "."):
                    os.remove(e.path)
        except OSError:
            pass


def _holds(path: str, source: str) -> bool:
    try:
        with open(path) as fh:
            return fh.read() == source
    except OSError:
        return False


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def _forget(source: str) -> None:
    """Drop ``source``'s kernel from the memo and Numba's cache files of it from the disk (a
    truncated or foreign one raises at the first call, in every process that loads it)."""
    digest = _digest(source)
    with _LOCK:
        _KERNELS.pop(digest, None)
        sys.modules.pop(f"asd_fused_{digest}", None)
        folder = _kernel_dir()
        if folder is None:
            return
        try:
            for e in os.scandir(os.path.join(folder, "__pycache__")):
                if e.name.startswith(f"k_{digest}."):
                    os.remove(e.path)
        except OSError:
            pass


def _compile(source: str) -> Callable:
    """The Numba kernel of ``source``: from this process's memo, Numba's on-disk cache or compiled
    (Numba compiles, or loads, at the first call)."""
    from numba import njit

    digest = _digest(source)
    with _LOCK:
        kernel = _KERNELS.get(digest)
        if kernel is not None:
            return kernel
        folder = _kernel_dir()
        module = None
        if folder is not None:
            try:
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, f"k_{digest}.py")
                if _holds(path, source):
                    os.utime(path)  # (used: the trimming keeps the most recently used)
                else:
                    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
                    with os.fdopen(fd, "w") as fh:
                        fh.write(source)
                    os.replace(tmp, path)
                    _trim(folder)
                name = f"asd_fused_{digest}"
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module  # (Numba's cached code finds its module by name)
                spec.loader.exec_module(module)
            except OSError:
                module = None
        if module is not None:
            kernel = njit(cache=True, boundscheck=False, nogil=True, error_model="numpy")(module.kernel)
        else:
            namespace: dict = {}
            exec(compile(source, f"<asd fused {digest}>", "exec"), namespace)  # noqa: S102 - our own source
            kernel = njit(boundscheck=False, nogil=True, error_model="numpy")(namespace["kernel"])
        _KERNELS[digest] = kernel
        while len(_KERNELS) > MAX_KERNELS:  # (an operator keeps its own kernel: this is only the memo)
            old = next(iter(_KERNELS))
            del _KERNELS[old]
            sys.modules.pop(f"asd_fused_{old}", None)
        return kernel


def fused_runner(gm: GraphModule, example: list, *, constant: set, fallback: Callable,
                 min_elements: int = 0) -> Callable | None:
    """``gm`` (called with ``example``) as a generated loop nest plus a gather: a function of the
    graph's inputs returning what ``gm`` does; ``None`` where the graph does not qualify (see the
    module). ``fallback`` (a function of the same inputs) evaluates a call whose inputs differ
    from the example's in type, dtype, shape, layout, device or need of a gradient. A graph whose
    joined result has fewer than ``min_elements`` elements is not compiled (``None``)."""
    try:
        source, leaves, gather, root, values, layout = kernel_source(gm, example, constant=constant)
        if values[root].numel() < min_elements:
            return None
    except _Unfusable:
        return None
    except Exception:  # noqa: BLE001 - an optimization: an unexpected graph stays with ATen
        return None
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    rv = values[root]
    out_val = values[next(n for n in gm.graph.nodes if n.op == "output").args[0]]
    # the arrays of a call: the specialization's constants (never written, never relaid) once;
    # the others, read each call, where they come from (a placeholder's position, or the held tensor)
    arrays: list = []
    reads = []
    for k, node in enumerate(leaves):
        v = values[node]
        pos = phs.index(node) if node.op == "placeholder" else None
        if pos is not None and pos in constant:
            arrays.append(v.numpy())
            continue
        arrays.append(None)
        held = None
        if node.op == "get_attr":
            held = gm
            for part in node.target.split("."):
                held = getattr(held, part)
        reads.append((k, pos, held, tuple(v.shape)))
    if gather is not None:
        arrays.append(layout.positions(values[gather]).numpy())
    dtype, numel, shape = rv.dtype, (values[gather].numel() if gather is not None else rv.numel()), tuple(out_val.shape)
    template = tuple(arrays)
    first = list(template)
    for k, pos, held, _ in reads:
        first[k] = (example[pos] if pos is not None else held).detach().numpy()
    kernel = _compile(source)
    try:  # compiled or loaded here: a damaged cache file is dropped and the kernel compiled again
        kernel(*first, torch.empty(numel, dtype=dtype).numpy())
    except Exception:  # noqa: BLE001
        _forget(source)
        kernel = _compile(source)
        kernel(*first, torch.empty(numel, dtype=dtype).numpy())

    def run(*inputs):
        grad = torch.is_grad_enabled()
        call = list(template)
        for k, pos, held, ishape in reads:
            t = inputs[pos] if pos is not None else held
            if (type(t) not in (torch.Tensor, torch.nn.Parameter) or t.dtype != dtype or t.shape != ishape
                    or not t.is_contiguous() or t.device.type != "cpu" or t.is_neg() or t.is_conj()):
                return fallback(*inputs)
            if t.requires_grad:
                if grad:
                    return fallback(*inputs)
                t = t.detach()
            call[k] = t.numpy()
        out = torch.empty(numel, dtype=dtype, device="cpu")  # (not the default device)
        kernel(*call, out.numpy())
        return out.view(shape)

    run.source = source
    return run
