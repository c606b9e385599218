"""The implicit cache of prepared operators used by :func:`asd.sparse_jacobian` and friends.

What the cache observes, and so what it trusts:

* the function: a plain Python function by its code object (so ``lambda z: F(t, z)`` written
  anew in every call of an ODE right-hand side finds its operator, rebound to the new function);
  any other callable (a module, a bound method's object) weakly and by identity;
* the input's shape, dtype, device and ``requires_grad``, the grad mode and the options;
* a fingerprint of what the function reads (:func:`fingerprint`): its code, closure cells,
  defaults, attributes, the globals its code names (comprehensions and inner functions included),
  a bound method's object, classes by identity, and for ``nn.Module``s the training flags, the
  names, shapes and dtypes of parameters and buffers, the submodules' identities and their
  attributes (hooks included). Small integer tensors and arrays (indices) are hashed by content;
  float values (scalars and tensors) are not part of it: they change values, not sparsity.

Traced graphs use the ``values=True`` summary (:func:`value_fingerprint`, :class:`ValueGuard`),
which adds float scalars by type and bits, tensors by identity and the default dtype (a recording
refuses ``f`` reading a tensor as Python numbers or bools: ``.item()``, ``torch.equal``,
``.tolist()``, ``.numpy()``). Whatever it cannot see makes it *incomplete*, and traced
graphs are then not used: the user's own classes and their instances (their attributes and their
methods' code and globals; a subclass of ``float``, ``int`` or ``str`` that adds methods or
attributes among them, an enum member aside), built-ins bound to objects (``cfg.get``, ``random.random``), modules
with hidden state (``random``, ``time``, ``numpy.random``), imports inside ``f`` of modules that are
not pure, ``globals()``/``eval``, objects with ``__slots__``, Python attributes on tensors,
containers past 256 items. (A built-in name ``f`` reads from ``builtins`` is not watched.)

A hit whose fingerprint differs is prepared again. Everything the fingerprint cannot see is
caught by the cross-mode probe that validates every hit (:mod:`asd.checks`). The cache is locked
and in-flight aware: threads asking for the same key while it is being prepared wait for it.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import operator
import threading
import types
import weakref
from collections import OrderedDict
from typing import Callable

import numpy as np
import torch

from ._fork import after_fork_in_child

__all__ = ["PatternCache", "CACHE", "cache_key", "fingerprint", "value_fingerprint", "state_fingerprint", "ValueGuard"]

_MAX_DEPTH = 4
_MAX_ITEMS = 256
_HASH_LIMIT = 1 << 16  # elements of an integer/bool tensor or array hashed by content


def _host_bytes(t: torch.Tensor) -> "bytes | None":
    """The elements of the CPU tensor ``t``, read from a copy (``numpy()`` on the caller's own
    storage would make it non-resizable for good), copied outside any ``torch.func`` transform
    (a copy made inside one would be wrapped, without storage). ``None`` for a ``vmap`` batch."""
    functorch = torch._C._functorch
    if functorch.is_functorch_wrapped_tensor(t):  # (a vmap batch: tracking wrappers are peeled already)
        return None
    if functorch.peek_interpreter_stack() is None:
        return t.detach().clone(memory_format=torch.contiguous_format).numpy().tobytes()
    try:
        from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack  # (private: PyTorch 2.13)
    except ImportError:
        return None
    try:
        with temporarily_clear_interpreter_stack():
            return t.detach().clone(memory_format=torch.contiguous_format).numpy().tobytes()
    except RuntimeError:  # (a layer without storage of its own)
        return None


class _Fingerprint:
    """Summaries of objects for change detection, bounded in depth and size.

    ``values=False`` (the cache): what can change a sparsity pattern; float values (scalars and
    tensors) are left out. ``values=True`` (traced graphs, which bake Python scalars in and hold
    tensors by reference): float scalars by value and every tensor by identity as well.
    """

    #: modules whose functions are pure: reading them does not make a summary incomplete
    PURE_MODULES = ("torch", "numpy", "math", "operator", "functools", "itertools", "asd", "scipy")

    def __init__(self, values: bool):
        self.values = values
        self.complete = True  # False once something is summarized by identity only
        self._open: set[int] = set()  # the functions being summarized (a recursive one meets itself)

    def tensor(self, t: torch.Tensor):
        functorch = torch._C._functorch
        while functorch.is_functorch_wrapped_tensor(t) and not functorch.is_batchedtensor(t):
            t = functorch.get_unwrapped(t)  # a transform's tracking wrapper: the tensor it tracks
        floating = t.is_floating_point() or t.is_complex()
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            self.klass(type(t))  # a tensor subclass of the user's own
        if t.__dict__:
            self.complete = False  # Python attributes on a tensor (w.scale): not summarized
        if floating and t.layout == torch.strided:
            key = ("float tensor", tuple(t.shape), str(t.dtype), str(t.device))
            return key + (id(t),) if self.values else key
        meta = ("tensor", id(t), tuple(t.shape), str(t.dtype), str(t.device), t.layout, t._version)
        if t.layout == torch.strided and t.device.type == "cpu" and t.numel() <= _HASH_LIMIT and not floating:
            data = _host_bytes(t)
            if data is None:
                self.complete = False  # a transform's batch: its elements are not here to read
                return meta
            return meta + (hashlib.blake2b(data, digest_size=8).hexdigest(),)
        if t.layout == torch.sparse_csr:
            return meta + (self.tensor(t.crow_indices()), self.tensor(t.col_indices()))
        return meta

    def module(self, mod: torch.nn.Module, depth: int):
        items = [("module", type(mod).__qualname__, id(mod), mod.training)]
        for name, p in mod.named_parameters(recurse=True):
            items.append((name, self.tensor(p)))
        for name, b in mod.named_buffers(recurse=True):
            items.append((name, self.tensor(b) if b is not None else None))
        for name, sub in mod.named_modules():
            self.klass(type(sub))  # a user's module class: its forward's code and globals are unseen
            # (the many empty hook dicts are left out: a hook added later adds its key)
            state = {k: v for k, v in vars(sub).items()
                     if k not in ("_parameters", "_buffers", "_modules") and not (type(v) in _PLAIN_CONTAINERS and not v)}
            items.append((name, type(sub).__qualname__, id(sub), self(state, depth + 1)))
        return tuple(items)

    def function(self, fn: types.FunctionType, depth: int):
        if id(fn) in self._open:
            return ("function being summarized", id(fn))  # its slots are read where it was met first
        self._open.add(id(fn))
        try:
            code = fn.__code__
            cells = tuple(self(c.cell_contents, depth + 1) if _cell_filled(c) else "<empty>"
                          for c in (fn.__closure__ or ()))
            g = fn.__globals__
            global_names, hidden = _code_reads(code)
            if hidden:
                self.complete = False  # an import or globals()/eval: reads no name lists
            names = tuple((n, self(g[n], depth + 1)) for n in global_names if n in g)
            attributes = self(fn.__dict__, depth + 1) if fn.__dict__ else None
            return ("function", id(code), self(fn.__defaults__, depth + 1), self(fn.__kwdefaults__, depth + 1),
                    attributes, cells, names)
        finally:
            self._open.discard(id(fn))

    def klass(self, cls: type):
        """A class by identity. A class of the user's own (not from a pure module or the standard
        library) makes the summary incomplete: its attributes, its methods' code and their globals
        can change what ``f`` computes, and its instances reach them."""
        root = _module_root(cls)
        if root not in self.PURE_MODULES and root not in _STDLIB:
            self.complete = False
        return ("ref", id(cls))

    def builtin(self, obj):
        """A built-in function: by identity when it is a pure module's or Python's own; one bound
        to an object (``cfg.get``, ``random.random``) or from another module (``time.time``) reads
        state no summary sees."""
        owner = getattr(obj, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            self.complete = False
        elif _module_root(obj) not in self.PURE_MODULES + ("builtins", "") or _stateful(obj):
            self.complete = False
        return ("builtin", id(obj))

    def _items(self, obj):
        if len(obj) > _MAX_ITEMS:
            self.complete = False  # items past the bound are not seen
        return obj if len(obj) <= _MAX_ITEMS else obj[:_MAX_ITEMS]

    def __call__(self, obj, depth: int = 0):
        # exact built-in types first, each answered as its branch below answers it: the guard of a
        # traced graph runs this on every call, and isinstance(obj, torch.Tensor) is slow
        t = type(obj)
        if t is float or t is complex:
            return _number(obj) if self.values else t.__name__
        if obj is None or t is int or t is str or t is bytes:
            return obj
        if t is bool:
            return ("bool", obj)  # True == 1
        if depth > _MAX_DEPTH:
            return self._general(obj, depth)
        if t is tuple or t is list:
            return (t.__name__, len(obj)) + tuple(self(v, depth + 1) for v in self._items(obj))
        if t is types.FunctionType:
            return self.function(obj, depth)
        if t is dict:
            return ("dict", len(obj)) + tuple((self(k, depth + 1), self(v, depth + 1))
                                              for k, v in self._items(list(obj.items())))
        return self._general(obj, depth)

    def _general(self, obj, depth: int):
        if isinstance(obj, (float, complex)):
            if type(obj) not in (float, complex) and not _inert_subclass(obj):
                self.klass(type(obj))  # a subclass of the user's own: its arithmetic may read what its value does not say
            return _number(obj) if self.values else type(obj).__name__
        if isinstance(obj, bool):
            return ("bool", bool(obj))
        if obj is None or type(obj) in (int, str, bytes):
            return obj
        if isinstance(obj, (int, str, bytes)):  # a subclass (an IntEnum): its type too
            if not isinstance(obj, enum.Enum) and not _inert_subclass(obj):
                self.klass(type(obj))  # (an enum member is a constant of its class)
            return (type(obj).__qualname__, obj)
        if isinstance(obj, (torch.dtype, torch.device, torch.layout, torch.memory_format, np.dtype)):
            return (type(obj).__name__, str(obj))
        if isinstance(obj, types.ModuleType):
            if obj.__name__.split(".")[0] not in self.PURE_MODULES or _stateful(obj):
                self.complete = False  # e.g. random, time, numpy.random: state a summary cannot see
            return ("ref", id(obj))
        if isinstance(obj, type):
            return self.klass(obj)
        if isinstance(obj, types.BuiltinFunctionType):
            return self.builtin(obj)
        if depth > _MAX_DEPTH:
            self.complete = False
            return ("deep", type(obj).__qualname__, id(obj))
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, np.ndarray):
            if obj.size <= _HASH_LIMIT:
                return ("ndarray", obj.shape, str(obj.dtype),
                        hashlib.blake2b(np.ascontiguousarray(obj).tobytes(), digest_size=8).hexdigest())
            self.complete = self.complete and not self.values
            return ("ndarray", id(obj), obj.shape, str(obj.dtype))
        if isinstance(obj, torch.nn.Module):
            return self.module(obj, depth)
        if isinstance(obj, types.FunctionType):
            return self.function(obj, depth)
        if isinstance(obj, types.MethodType):
            return ("method", self(obj.__func__, depth + 1), self(obj.__self__, depth + 1))
        if isinstance(obj, functools.partial):
            return ("partial", self(obj.func, depth + 1), self(obj.args, depth + 1), self(obj.keywords, depth + 1))
        if isinstance(obj, (list, tuple, dict, set, frozenset)) and type(obj) not in _PLAIN_CONTAINERS:
            self.klass(type(obj))  # a subclass (a NamedTuple, a dict with attributes) of the user's own
            if getattr(obj, "__dict__", None):
                self.complete = False
        if isinstance(obj, (list, tuple)):
            return (type(obj).__name__, len(obj)) + tuple(self(v, depth + 1) for v in self._items(obj))
        if isinstance(obj, dict):
            return ("dict", len(obj)) + tuple((self(k, depth + 1), self(v, depth + 1))
                                              for k, v in self._items(list(obj.items())))
        if isinstance(obj, (set, frozenset)):
            items = self._items(list(obj))
            if not all(type(v) in (int, float, bool, str, bytes, type(None)) for v in items):
                self.complete = False  # summarized by repr: the state of its items is unseen
            return ("set", len(obj), tuple(sorted(repr(v) for v in items)))
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            self.klass(type(obj))
            if any("__slots__" in vars(c) for c in type(obj).__mro__):
                self.complete = False  # slot values live outside __dict__
            return ("object", type(obj).__qualname__, id(obj), self(state, depth + 1))
        if not isinstance(obj, types.BuiltinFunctionType):
            self.complete = False
        return ("opaque", type(obj).__qualname__, id(obj))


#: what every class body defines: a subclass with nothing more adds no behaviour to its base
_CLASS_BOOKKEEPING = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__slots__",
                                "__firstlineno__", "__static_attributes__", "__annotations__", "__orig_bases__"})


def _inert_subclass(obj) -> bool:
    """Whether ``obj``'s class adds no method, property or class attribute to the built-in scalar
    type it derives from, and ``obj`` holds no attribute of its own (``class Name(str): pass``):
    then its value says all it computes."""
    if getattr(obj, "__dict__", None):
        return False
    for cls in type(obj).__mro__:
        if cls in (float, complex, int, str, bytes, object):
            return True
        if not _CLASS_BOOKKEEPING.issuperset(vars(cls)):
            return False
    return True


def _number(v) -> tuple:
    """A float or complex by type and bits (1 == 1.0 == True, 0.0 == -0.0, nan != nan)."""
    if isinstance(v, complex):
        return (type(v).__name__, float(v.real).hex(), float(v.imag).hex())
    return (type(v).__name__, float(v).hex())


#: standard-library modules whose classes (Enum, ABC, NamedTuple, ...) are summarized by identity
_STDLIB = ("builtins", "enum", "abc", "numbers", "typing", "collections", "dataclasses", "types", "decimal",
           "fractions", "cmath", "")
#: the built-in containers (summarized by their items alone; no attributes, no class of the user's)
_PLAIN_CONTAINERS = (list, tuple, dict, set, frozenset, OrderedDict)
#: names through which code reads what no name list shows
_HIDDEN_READS = frozenset({"globals", "locals", "vars", "eval", "exec", "__import__", "importlib"})


def _stateful(obj) -> bool:
    """numpy.random and random: modules (or their functions) with state a summary cannot see."""
    name = getattr(obj, "__name__", "") if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", "") or ""
    return name.startswith("numpy.random") or name == "random"


@functools.lru_cache(maxsize=4096)
def _code_reads(code: types.CodeType) -> tuple[tuple, bool]:
    """``(names, hidden)``: the names ``code`` and the code nested in it (comprehensions,
    generator expressions, inner functions and lambdas: their own code objects) may read as
    globals, and whether it also reads in ways no name list shows (an import of a module that is
    not pure, ``globals()``, ``eval``)."""
    import dis

    names = dict.fromkeys(code.co_names)
    hidden = bool(_HIDDEN_READS & set(code.co_names))
    for ins in dis.get_instructions(code):
        if ins.opname == "IMPORT_NAME" and str(ins.argval).split(".")[0] not in _Fingerprint.PURE_MODULES:
            hidden = True
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            inner, inner_hidden = _code_reads(c)
            names.update(dict.fromkeys(inner))
            hidden = hidden or inner_hidden
    return tuple(names), hidden


def _module_root(obj) -> str:
    return (getattr(obj, "__module__", None) or "").split(".")[0]


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def fingerprint(f: Callable, *, values: bool = False):
    """A hashable summary of what ``f`` reads (see the module docstring); ``values=True`` includes
    float scalars' values and every tensor's identity (what a traced graph depends on)."""
    return _Fingerprint(values)(f)


def value_fingerprint(f: Callable) -> tuple[object, bool]:
    """``(summary, complete)``: the ``values=True`` summary and whether it saw everything ``f``
    reads (no object summarized by identity alone, no module with hidden state such as ``random``)."""
    fp = _Fingerprint(values=True)
    return fp(f), fp.complete


#: elements of CPU tensors whose content one :func:`state_fingerprint` reads, in all (beyond, only
#: their version counters and storages: the summary is then incomplete)
STATE_CONTENT_ELEMENTS = 1 << 16


class _State(_Fingerprint):
    """The ``values=True`` summary with every tensor's state as well: its version counter (bumped by
    in-place writes), its storage and offset (``p.data = ...`` rebinds them) and, for a small CPU
    tensor, its content (a write through ``p.data`` bumps no version counter)."""

    def __init__(self):
        super().__init__(values=True)
        self._hashed = 0

    def tensor(self, t: torch.Tensor):
        key = super().tensor(t)
        try:
            if t.layout == torch.sparse_coo:
                return key + (t._version, self._content(t._indices()), self._content(t._values()))
            if t.layout == torch.sparse_csr:  # (its indices are summarized by the summary above, by content)
                return key + (t._version, self._content(t.values()))
            if t.layout != torch.strided:  # the other compressed layouts: both index tensors and the values
                compressed = (t.crow_indices(), t.col_indices()) if t.layout == torch.sparse_bsr \
                    else (t.ccol_indices(), t.row_indices())
                return key + (t._version, *(self._content(i) for i in compressed), self._content(t.values()))
            key += (t._version, t.const_data_ptr(), t.storage_offset())
        except (RuntimeError, NotImplementedError):  # no storage to read (a tensor subclass of its own)
            self.complete = False
            return key
        return key + (self._content(t),)

    def _content(self, t: torch.Tensor):
        """A hash of ``t``'s values while the budget lasts; beyond it, or off the CPU, the summary
        is incomplete: a write through ``.data`` or another alias (``t.numpy()``, DLPack) bumps no
        version counter."""
        if t.device.type != "cpu" or self._hashed + t.numel() > STATE_CONTENT_ELEMENTS:
            self.complete = False
            return "content unread"
        self._hashed += t.numel()
        data = t.detach().resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
        return hashlib.blake2b(data.reshape(-1).view(torch.uint8).numpy().tobytes(), digest_size=8).hexdigest()


def state_fingerprint(obj) -> tuple[object, bool]:
    """``(summary, complete)``: :func:`value_fingerprint` of ``obj`` with every tensor's version
    counter, storage and content (CPU tensors of :data:`STATE_CONTENT_ELEMENTS` elements in all):
    what a cache of *computed values* (a gradient at ``x``) must see unchanged before it answers
    again. Where content goes unread (larger tensors, other devices) the summary is incomplete: a
    write through ``.data``, ``.numpy()`` or DLPack bumps no version counter, so such a cache must
    not answer from it."""
    fp = _State()
    return fp(obj), fp.complete


_EMPTY = object()    # an empty closure cell
_MISSING = object()  # a name the function's globals do not hold
# objects whose summary is their value or their identity: found in the same slot, they summarize the same
_SETTLED = frozenset({int, float, complex, bool, str, bytes, type(None), types.ModuleType, types.BuiltinFunctionType,
                      type, torch.dtype, torch.device, torch.layout, torch.memory_format})


class _Watching(_Fingerprint):
    """A ``values=True`` summary that also notes every slot it read (a function's code, defaults,
    keyword defaults, attribute dict, closure cells and the globals its code names, present or
    not) with the object found there. Numbers, strings, dtypes, Python modules, classes,
    built-ins, tuples and functions are walked through; every other object (a tensor, a list, a
    dict, an ``nn.Module``, ...) is a *leaf*, summarized whole and kept to be summarized again."""

    def __init__(self):
        super().__init__(values=True)
        self.functions: list[tuple] = []
        self.leaves: list[tuple] = []

    def __call__(self, obj, depth: int = 0):
        t = type(obj)
        if t in _SETTLED or t is tuple or t is types.FunctionType:
            return super().__call__(obj, depth)
        plain = _Fingerprint(values=True)
        summary = plain(obj, depth)
        self.complete = self.complete and plain.complete
        # an empty dict or list (the kwargs of a call without any) summarizes the same while it stays empty
        self.leaves.append((obj, depth, summary, (t is dict or t is list) and not obj))
        return summary

    def function(self, fn: types.FunctionType, depth: int):
        # the slots _Fingerprint.function reads (a dict found there, fn.__dict__ included, is a leaf)
        cells = fn.__closure__ or ()
        names = _code_reads(fn.__code__)[0]
        self.functions.append((fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__, fn.__dict__, not fn.__dict__,
                               cells, tuple(c.cell_contents if _cell_filled(c) else _EMPTY for c in cells),
                               fn.__globals__, names, tuple(fn.__globals__.get(n, _MISSING) for n in names)))
        return super().function(fn, depth)

    def still(self) -> bool:
        """Whether every slot holds what it held and every leaf summarizes as it did."""
        for fn, code, defaults, kwdefaults, attrs, bare, cells, contents, g, names, found in self.functions:
            if (fn.__code__ is not code or fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kwdefaults
                    or fn.__dict__ is not attrs or (bare and attrs)):
                return False
            for c, v in zip(cells, contents):
                try:
                    if c.cell_contents is not v:
                        return False
                except ValueError:
                    if v is not _EMPTY:
                        return False
            for n, v in zip(names, found):
                if g.get(n, _MISSING) is not v:
                    return False
        for obj, depth, summary, empty in self.leaves:
            if empty:
                if obj:
                    return False
                continue
            plain = _Fingerprint(values=True)
            if plain(obj, depth) != summary or not plain.complete:
                return False
        return True


class ValueGuard:
    """``guard(objs)``: :func:`value_fingerprint` of the tuple ``objs``, revalidated cheaply.

    The guard of a traced graph runs on every call of a prepared operator. While the elements of
    ``objs`` are the same objects, every slot the last complete summary read holds the same object
    and every leaf (a tensor, a list, a dict, an ``nn.Module``, ...) summarizes as it did, the
    summary is the same: it is answered without walking the functions again. It keeps the
    objects of the last call (extra arguments included) alive until the next one."""

    def __init__(self):
        self._last: tuple | None = None  # (objs, watch, result) of the last complete summary

    def __call__(self, objs: tuple) -> tuple[object, bool]:
        last = self._last
        if last is not None:
            seen, w, result = last
            if len(objs) == len(seen) and all(map(operator.is_, objs, seen)) and w.still():
                return result
        w = _Watching()
        result = (w(objs), w.complete)
        self._last = (objs, w, result) if w.complete else None
        return result


def _weak_ident(f: Callable):
    """What identifies ``f`` in the cache: ``(references, key)``. A plain function is identified by
    its code object (held strongly: code lives as long as the module that defines it); a bound
    method by its function's code and, weakly, its object; anything else weakly by identity."""
    if isinstance(f, types.FunctionType):
        return (f.__code__,), ("code", id(f.__code__))
    if isinstance(f, types.MethodType) and isinstance(f.__func__, types.FunctionType):
        try:
            return (f.__func__.__code__, weakref.ref(f.__self__)), ("method", id(f.__func__.__code__), id(f.__self__))
        except TypeError:
            return None, None
    try:
        return (weakref.ref(f),), ("callable", id(f))
    except TypeError:
        return None, None


def _same_referents(refs: tuple, f: Callable) -> bool:
    """Whether the references of an entry still stand for ``f`` (codes equal, weak referents alive)."""
    now, _ = _weak_ident(f)
    if now is None or len(now) != len(refs):
        return False
    for a, b in zip(refs, now):
        if isinstance(a, weakref.ref):
            if a() is None or a() is not b():
                return False
        elif a is not b:
            return False
    return True


def cache_key(kind: str, f: Callable, x: torch.Tensor, options: dict):
    """The part of the key that is cheap to build; ``None`` when ``f`` cannot be referenced."""
    refs, ident = _weak_ident(f)
    if refs is None:
        return None
    # each option with its type: 1 == True, and compile=1 must not find the operator of compile=True
    # (a miss prepares a new operator, whose constructor refuses what it must)
    return (kind, ident, tuple(x.shape), x.dtype, str(x.device), bool(x.requires_grad), torch.is_grad_enabled(),
            tuple(sorted((k, type(v).__qualname__, v) for k, v in options.items())))


class _Entry:
    __slots__ = ("refs", "fingerprint", "op", "ready", "error")

    def __init__(self, refs, fp):
        self.refs, self.fingerprint, self.op = refs, fp, None
        self.ready = threading.Event()
        self.error = None

    def alive_for(self, f) -> bool:
        return _same_referents(self.refs, f)


class PatternCache:
    """A bounded, locked LRU cache of prepared operators (see the module docstring)."""

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        _CACHES.add(self)

    def _after_fork(self) -> None:
        """In a forked child: a free lock, and no entry that a parent's thread was still preparing
        (nothing there would ever finish it)."""
        self._lock = threading.Lock()
        self._data = OrderedDict((k, e) for k, e in self._data.items() if e.ready.is_set())

    def get_or_create(self, key, f: Callable, create: Callable):
        """``(operator, hit)``: the cached operator for ``key`` when ``f`` and its fingerprint still
        match, else a new one from ``create()`` (prepared once even when threads race). A hit may
        hold another function object with the same code: the caller rebinds it to ``f``."""
        if key is None:
            return create(), False
        try:
            hash(key)
        except TypeError:  # an unhashable option: no caching
            return create(), False
        fp = fingerprint(f)
        refs, _ = _weak_ident(f)
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and (not entry.alive_for(f) or (entry.ready.is_set() and entry.fingerprint != fp)):
                del self._data[key]
                entry = None
            owner = entry is None
            if owner:
                entry = self._data[key] = _Entry(refs, fp)
                self.misses += 1
            else:
                self._data.move_to_end(key)
                self.hits += 1
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        if owner:
            try:
                entry.op = create()
            except BaseException as exc:
                entry.error = exc
                with self._lock:
                    if self._data.get(key) is entry:
                        del self._data[key]
                raise
            finally:
                entry.ready.set()
            return entry.op, False
        entry.ready.wait()
        if entry.error is not None:
            return create(), False
        return entry.op, True

    def replace(self, key, f: Callable, op) -> None:
        """Store a freshly prepared operator for ``key``."""
        if key is None:
            return
        refs, _ = _weak_ident(f)
        entry = _Entry(refs, fingerprint(f))
        entry.op = op
        entry.ready.set()
        with self._lock:
            self._data[key] = entry

    def discard(self, key, op) -> None:
        """Forget ``key`` where it still holds ``op`` (an operator whose first call failed its check)."""
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and entry.op is op:
                del self._data[key]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


_CACHES: "weakref.WeakSet[PatternCache]" = weakref.WeakSet()
after_fork_in_child(lambda: [c._after_fork() for c in list(_CACHES)])

CACHE = PatternCache()
