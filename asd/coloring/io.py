"""Coloring results saved to and loaded from ``.npz`` files (no pickle)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from asd.coloring.result import AcyclicColoring, BiColoring, Coloring, ColumnColoring, RowColoring, StarColoring
from asd.errors import ColoringError
from asd.patterns import SparsityPattern

__all__ = ["save", "load"]

_FORMAT = "asd.Coloring/1"
_CLASSES = {cls.__name__: cls for cls in (ColumnColoring, RowColoring, StarColoring, AcyclicColoring, BiColoring)}


def save(coloring: Coloring, path) -> None:
    """Write ``coloring`` (its pattern, order and typed fields) to an ``.npz`` file."""
    if type(coloring).__name__ not in _CLASSES:
        raise TypeError(f"save expects an asd coloring result, got {type(coloring).__name__}")
    fields = {f.name: getattr(coloring, f.name) for f in dataclasses.fields(coloring)
              if f.name not in ("pattern", "order")}
    P = coloring.pattern
    np.savez(path, format=np.array(_FORMAT), cls=np.array(type(coloring).__name__), order=np.array(coloring.order),
             shape=np.asarray(P.shape, dtype=np.int64), indptr=P.indptr, indices=P.indices,
             input_shape=np.asarray(P.input_shape, dtype=np.int64),
             output_shape=np.asarray(P.output_shape, dtype=np.int64),
             **{"field_" + k: np.asarray(v) for k, v in fields.items()})


def load(path) -> Coloring:
    """Read a coloring written by :func:`save`; it is verified structurally before it is returned."""
    from asd.coloring.check import check

    with np.load(os.fspath(path), allow_pickle=False) as z:
        if "format" not in z or str(z["format"]) != _FORMAT or str(z["cls"]) not in _CLASSES:
            raise ColoringError(f"{os.fspath(path)!r} is not an asd coloring file")
        P = SparsityPattern.from_csr(z["indptr"], z["indices"], tuple(z["shape"]),
                                     input_shape=tuple(z["input_shape"]), output_shape=tuple(z["output_shape"]))
        cls = _CLASSES[str(z["cls"])]
        order = str(z["order"])
        fields = {k[len("field_"):]: z[k] for k in z.files if k.startswith("field_")}
    for k, v in fields.items():
        if v.ndim == 0:
            fields[k] = v.item()
    result = cls(P, order, **fields)
    check(P, result, rounds=1)
    return result

