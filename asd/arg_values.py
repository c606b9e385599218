"""Value snapshots of a prepared operator's extra arguments (``f(x, *args, **kwargs)``).

A pattern is detected with the arguments given at preparation, and it may depend on their values
(``if c > 0``, ``torch.where(M > 0, ...)``), not only on the structure the cache's fingerprint
(:func:`asd.cache.fingerprint`) summarizes. A call whose arguments differ in value from those the
operator knows to be right is therefore checked by the cross-mode probe; a snapshot records the
values of a checked call. Numbers are compared by type and bits, dense tensors and numpy arrays by
content (one comparison per call, the size of the arguments); other tensors (sparse layouts) by
identity and version count, and every other object is left to the fingerprint.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["snapshot", "same"]

_MAX_DEPTH = 4


class _Other:
    """A slot whose value the fingerprint, not the snapshot, watches."""


_OTHER = _Other()


def snapshot(obj, depth: int = 0):
    """A private copy of the values in ``obj`` (tuples, lists and dicts walked)."""
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.strided:
            return obj.detach().clone()
        return ("sparse", id(obj), obj._version)
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, (bool, int, float, complex)):
        return _number(obj)
    if depth < _MAX_DEPTH and isinstance(obj, (list, tuple)):
        return (type(obj), tuple(snapshot(v, depth + 1) for v in obj))
    if depth < _MAX_DEPTH and isinstance(obj, dict):
        return ("dict", tuple((k, snapshot(v, depth + 1)) for k, v in obj.items()))
    return _OTHER


def same(obj, snap, depth: int = 0) -> bool:
    """Whether ``obj`` holds the values recorded in ``snap`` (a :func:`snapshot`)."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            return snap == ("sparse", id(obj), obj._version)
        return (isinstance(snap, torch.Tensor) and obj.shape == snap.shape and obj.dtype == snap.dtype
                and obj.device == snap.device and bool(torch.equal(obj.detach(), snap)))
    if isinstance(obj, np.ndarray):
        return (isinstance(snap, np.ndarray) and obj.shape == snap.shape and obj.dtype == snap.dtype
                and bool(np.array_equal(obj, snap, equal_nan=obj.dtype.kind in "fc")))
    if isinstance(obj, (bool, int, float, complex)):
        return snap == _number(obj)
    if depth < _MAX_DEPTH and isinstance(obj, (list, tuple)):
        return (isinstance(snap, tuple) and len(snap) == 2 and snap[0] is type(obj) and len(snap[1]) == len(obj)
                and all(same(v, s, depth + 1) for v, s in zip(obj, snap[1])))
    if depth < _MAX_DEPTH and isinstance(obj, dict):
        return (isinstance(snap, tuple) and len(snap) == 2 and snap[0] == "dict" and len(snap[1]) == len(obj)
                and all(k == ks and same(v, s, depth + 1) for (k, v), (ks, s) in zip(obj.items(), snap[1])))
    return snap is _OTHER


def _number(v) -> tuple:
    if isinstance(v, int):  # bool included
        return (type(v), v)
    if isinstance(v, complex):
        return (type(v), float(v.real).hex(), float(v.imag).hex())
    return (type(v), float(v).hex())
