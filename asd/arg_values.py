"""Value snapshots of a prepared operator's extra arguments (``f(x, *args, **kwargs)``).

A pattern is detected with the arguments given at preparation, and it may depend on their values
(``if c > 0``, ``torch.where(M > 0, ...)``), not only on the structure the cache's fingerprint
(:func:`asd.cache.fingerprint`) summarizes. A call whose arguments differ in value from those the
operator knows to be right is therefore checked by the cross-mode probe; a snapshot records the
values of a checked call. Numbers, dense tensors and numpy arrays are compared by their bits (NaN
equals itself, -0.0 differs from 0.0; one comparison per call, the size of the arguments); other
tensors (sparse layouts) by the bits of their COO indices and values; any other object by its
``values=True`` fingerprint (:func:`asd.cache.fingerprint`: float attributes by value, tensors in it
by identity, so the operator keeps the arguments of a snapshot alive). Containers nested deeper than
the snapshot walks always count as different.

:func:`digest` summarizes the same values as one number that is the same in every process (what
the ranks of a process group compare): other objects count there by their type's name only.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from .cache import fingerprint

__all__ = ["snapshot", "same", "digest", "bits_digest"]

_MAX_DEPTH = 4


class _Deep:
    """A container nested past :data:`_MAX_DEPTH`: never the same (the call is checked)."""


_DEEP = _Deep()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(0, dtype=torch.uint8, device=t.device)
    return flat.contiguous().view(torch.uint8)


def snapshot(obj):
    """A private copy of the values in ``obj`` (tuples, lists and dicts walked); what cannot be
    copied is never the same."""
    try:
        return _snapshot(obj, 0)
    except Exception:  # noqa: BLE001 - e.g. a tensor subclass without storage: the call is checked
        return _DEEP


def same(obj, snap) -> bool:
    """Whether ``obj`` holds the values recorded in ``snap`` (a :func:`snapshot`); ``False`` where
    they cannot be compared."""
    try:
        return _same(obj, snap, 0)
    except Exception:  # noqa: BLE001
        return False


def _snapshot(obj, depth: int):
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.strided:
            return ("tensor", tuple(obj.shape), obj.dtype, obj.device, _bytes(obj).clone())
        return _sparse(obj)
    if isinstance(obj, np.ndarray):
        return ("array", obj.shape, obj.dtype, np.ascontiguousarray(obj).tobytes())
    if isinstance(obj, (bool, int, float, complex)):
        return _number(obj)
    if isinstance(obj, (list, tuple, dict)):
        if depth >= _MAX_DEPTH:
            return _DEEP
        if isinstance(obj, dict):
            return ("dict", tuple((k, _snapshot(v, depth + 1)) for k, v in obj.items()))
        return (type(obj), tuple(_snapshot(v, depth + 1) for v in obj))
    return ("object", fingerprint(obj, values=True))


def _same(obj, snap, depth: int) -> bool:
    if snap is _DEEP:
        return False
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            fresh = _sparse(obj)
            return (isinstance(snap, tuple) and len(snap) == 6 and snap[:4] == fresh[:4]
                    and all(torch.equal(a, b) for a, b in zip(snap[4:], fresh[4:])))
        return (isinstance(snap, tuple) and len(snap) == 5 and snap[0] == "tensor"
                and snap[1:4] == (tuple(obj.shape), obj.dtype, obj.device) and bool(torch.equal(_bytes(obj), snap[4])))
    if isinstance(obj, np.ndarray):
        return (isinstance(snap, tuple) and len(snap) == 4 and snap[0] == "array" and snap[1:3] == (obj.shape, obj.dtype)
                and np.ascontiguousarray(obj).tobytes() == snap[3])
    if isinstance(obj, (bool, int, float, complex)):
        return snap == _number(obj)
    if isinstance(obj, dict):
        return (isinstance(snap, tuple) and len(snap) == 2 and snap[0] == "dict" and len(snap[1]) == len(obj)
                and all(k == ks and _same(v, s, depth + 1) for (k, v), (ks, s) in zip(obj.items(), snap[1])))
    if isinstance(obj, (list, tuple)):
        return (isinstance(snap, tuple) and len(snap) == 2 and snap[0] is type(obj) and len(snap[1]) == len(obj)
                and all(_same(v, s, depth + 1) for v, s in zip(obj, snap[1])))
    return snap == ("object", fingerprint(obj, values=True))


def _sparse(t: torch.Tensor) -> tuple:
    """A sparse tensor by layout, shape, dtype and the bits of its COO indices and values (in the
    stored order)."""
    coo = t.detach().to_sparse_coo() if t.layout != torch.sparse_coo else t.detach()
    return ("sparse", t.layout, tuple(t.shape), t.dtype, _bytes(coo._indices()).clone(), _bytes(coo._values()).clone())


def _number(v) -> tuple:
    if isinstance(v, int):  # bool included
        return (type(v), v)
    if isinstance(v, complex):
        return (type(v), float(v.real).hex(), float(v.imag).hex())
    return (type(v), float(v).hex())


def digest(obj) -> int:
    """A hash of the values in ``obj`` that is the same in every process for the same values:
    tensors and arrays by their bits (sparse ones by their coalesced COO indices and values; meta
    ones by shape and dtype), numbers by value, containers and dict keys by their items, any other
    object by its type's name."""
    h = hashlib.blake2b(digest_size=8)
    _feed(h, obj, 0)
    return int.from_bytes(h.digest(), "little")


def _feed(h, obj, depth: int) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        h.update(f"T{tuple(t.shape)}{t.dtype}{t.layout}".encode())
        if t.is_meta:
            return
        try:
            if t.layout != torch.strided:
                coo = t.to_sparse_coo().coalesce()
                h.update(str(bits_digest(coo.indices())).encode())
                t = coo.values()
            h.update(str(bits_digest(t.resolve_conj().resolve_neg())).encode())
        except Exception:  # noqa: BLE001 - a kind of tensor whose bits cannot be read: shape and dtype only
            h.update(b"?")
    elif isinstance(obj, np.ndarray):
        h.update(f"A{obj.shape}{obj.dtype}".encode() + np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (bool, int, float, complex)):
        h.update(repr(_number(obj)).encode())
    elif isinstance(obj, (str, bytes, type(None))):
        h.update(f"{type(obj).__name__}:{obj!r}".encode())
    elif isinstance(obj, (list, tuple, dict)) and depth < _MAX_DEPTH:
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        parts = []
        for k, v in items:
            sub = hashlib.blake2b(digest_size=8)
            if isinstance(obj, dict):
                _feed(sub, k, depth + 1)
            _feed(sub, v, depth + 1)
            parts.append(sub.digest())
        h.update(f"{type(obj).__name__}[".encode() + b"".join(sorted(parts) if isinstance(obj, dict) else parts) + b"]")
    else:
        h.update(type(obj).__qualname__.encode())


def bits_digest(t: torch.Tensor) -> int:
    """An integer digest of a dense tensor's bit pattern, reduced on its device (one number comes
    to the host, not the data): the same in every process for the same bits."""
    flat = t.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    if flat.numel() == 0:
        return 0
    size = flat.element_size()
    ints = flat.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[size]).to(torch.int64)
    w = (torch.arange(ints.numel(), dtype=torch.int64, device=ints.device) * 40503 + 12345) % 32749 + 1
    h = 0
    for k in range(0, 8 * size, 16):  # 16-bit pieces: the weighted sums stay far from overflow
        h = h * 1000003 + int(((ints >> k) & 0xFFFF).mul_(w).sum())
    return h
