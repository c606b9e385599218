"""The implicit cache of prepared operators used by :func:`asd.sparse_jacobian` and friends."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch


class PatternCache:
    """A bounded LRU cache of prepared operators keyed on the function and the input's metadata."""

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        self._data: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get_or_create(self, key, create: Callable):
        try:
            op = self._data.pop(key)
            self.hits += 1
        except KeyError:
            self.misses += 1
            op = create()
        except TypeError:  # unhashable option: no caching
            self.misses += 1
            return create()
        self._data[key] = op
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return op

    def clear(self) -> None:
        self._data.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


CACHE = PatternCache()


def cache_key(kind: str, f: Callable, x: torch.Tensor, options: dict):
    return (kind, f, tuple(x.shape), x.dtype, str(x.device), tuple(sorted(options.items())))
