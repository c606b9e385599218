"""Evaluation backends: compressed derivative products of a coloring (see :mod:`asd.backends.base`).

One file per backend: :mod:`~asd.backends.jvp` (forward), :mod:`~asd.backends.vjp` (reverse),
:mod:`~asd.backends.hvp` (two Hessian-vector product flavours), :mod:`~asd.backends.bidirectional`
(JVPs and VJPs together) and :mod:`~asd.backends.fused` (the direct gather fused into the products).
:func:`default_backend` picks the backend of a coloring result.
"""

from __future__ import annotations

from functools import singledispatch

from ..coloring.result import AcyclicColoring, BiColoring, ColumnColoring, RowColoring, StarColoring
from .base import Backend, BatchedProducts, SingleDirection, flatten_function, scalar_function
from .bidirectional import Bidirectional
from .fused import FusedGather
from .hvp import ForwardOverReverseHVP, ReverseOverForwardHVP
from .jvp import ForwardJVP
from .vjp import ReverseVJP

__all__ = ["Backend", "SingleDirection", "BatchedProducts", "ForwardJVP", "ReverseVJP", "ForwardOverReverseHVP",
           "ReverseOverForwardHVP", "Bidirectional", "FusedGather", "default_backend", "HVP_BACKENDS",
           "flatten_function", "scalar_function"]

#: the ``hvp=`` option of Hessian operators
HVP_BACKENDS = {"forward_over_reverse": ForwardOverReverseHVP, "reverse_over_forward": ReverseOverForwardHVP}


@singledispatch
def _products_backend(coloring, hvp):
    raise TypeError(f"no backend evaluates a {type(coloring).__name__}")


@_products_backend.register
def _(coloring: ColumnColoring, hvp):
    return ForwardJVP()


@_products_backend.register
def _(coloring: RowColoring, hvp):
    return ReverseVJP()


@_products_backend.register
def _(coloring: BiColoring, hvp):
    return Bidirectional()


@_products_backend.register(StarColoring)
@_products_backend.register(AcyclicColoring)
def _(coloring, hvp):
    return hvp()


def default_backend(coloring, *, batch_size: int | None = None, hvp: type = ForwardOverReverseHVP) -> Backend:
    """The backend that evaluates ``coloring``: its product backend, with the gather fused in
    when the plan is direct and all colors fit in one batch."""
    backend = _products_backend(coloring, hvp)
    if isinstance(backend, SingleDirection) and FusedGather.applies(coloring, batch_size):
        return FusedGather(backend)
    return backend
