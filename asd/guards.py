"""Module state restored around asd's own calls of the user's function.

Detection runs ``f`` once more than the user asked for, and a failed evaluation may stop halfway
through ``f``: neither may leave a trace in the user's ``nn.Module``s (BatchNorm's running
statistics and ``num_batches_tracked``, any registered buffer). :class:`ModuleStateGuard` finds
the modules ``f`` reaches (``f`` itself, a bound method's object, closure cells, globals it names,
default arguments), snapshots their buffers and restores them.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Callable

import torch

__all__ = ["modules_of", "ModuleStateGuard"]


def _children(obj) -> list:
    if isinstance(obj, types.MethodType):
        return [obj.__func__, obj.__self__]
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, types.FunctionType):
        out = [c.cell_contents for c in (obj.__closure__ or ()) if _filled(c)]
        out += [obj.__globals__[n] for n in obj.__code__.co_names if n in obj.__globals__]
        out += list(obj.__defaults__ or ())
        return out
    if isinstance(obj, (list, tuple)):
        return list(obj[:64])
    if isinstance(obj, dict):
        return list(obj.values())[:64]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and not isinstance(obj, (type, types.ModuleType)):
        return list(state.values())[:64]
    return []


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def modules_of(f: Callable, depth: int = 3) -> list[torch.nn.Module]:
    """The top-level ``nn.Module``s reachable from ``f`` (their submodules are included by them)."""
    found: dict[int, torch.nn.Module] = {}
    seen: set[int] = set()
    stack = [(f, 0)]
    while stack:
        obj, d = stack.pop()
        if id(obj) in seen or d > depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            found[id(obj)] = obj
            continue
        if d == depth or isinstance(obj, (torch.Tensor, types.ModuleType, type, str, bytes, int, float)):
            continue
        stack.extend((c, d + 1) for c in _children(obj))
    return list(found.values())


class ModuleStateGuard:
    """Snapshots the buffers of the modules a call of ``f`` reaches; :meth:`restore` puts them back.

    Use as ``with guard.protect(always=..., args=...)``: restores on an exception, and always when
    asked (detection, which must leave no trace). The modules are those ``f`` reaches (found once,
    three levels deep), those two levels deep at this call where ``f`` reached any at all (a module
    bound since preparation to a global ``f`` or a helper reads, or to an attribute of an object
    ``f`` holds, in place of another), and those in the call's extra arguments ``args``.
    """

    def __init__(self, f: Callable):
        self._f = f
        self._modules = [weakref.ref(m) for m in modules_of(f)]

    @property
    def watches_modules(self) -> bool:
        """Whether ``f`` reached modules at preparation (then every call looks for them again)."""
        return bool(self._modules)

    def modules(self, args=()) -> list[torch.nn.Module]:
        found = {}
        for ref in self._modules:
            m = ref()
            if m is not None:
                found[id(m)] = m
        if self._modules:
            # again at each call, two levels deep (f's slots, and theirs: a global a helper reads, an
            # attribute of a bound method's object): a module bound there since preparation, for a
            # function that reached modules at all (the others pay no walk per call)
            found.update((id(m), m) for m in modules_of(self._f, depth=2))
        if args and args != ((), {}):
            found.update((id(m), m) for m in modules_of(args, depth=4))
        return list(found.values())

    def snapshot(self, args=()) -> list:
        snap = []
        for mod in self.modules(args):
            for buf in mod.buffers():
                if buf is not None and buf.device.type != "meta":
                    snap.append((buf, buf.detach().clone(), buf._version))
        return snap

    @staticmethod
    def restore(snap: list) -> None:
        with torch.no_grad():
            for buf, saved, version in snap:
                if buf._version != version or not torch.equal(buf, saved):
                    buf.copy_(saved)

    def protect(self, *, always: bool = False, args=()):
        """``args``: the call's extra arguments (``(args, kwargs)`` or a tuple), searched for modules."""
        return _Protect(self, always, args)


class _Protect:
    def __init__(self, guard: ModuleStateGuard, always: bool, args):
        self.guard, self.always, self.args, self.snap = guard, always, args, None

    def __enter__(self):
        self.snap = self.guard.snapshot(self.args)
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.snap and (self.always or exc_type is not None):
            ModuleStateGuard.restore(self.snap)
        return False
