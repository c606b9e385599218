"""Sparsity detection by index-set tracing (see :mod:`asd.detection.tracer`)."""

from .hessian import hessian_sparsity
from .jacobian import jacobian_sparsity

__all__ = ["hessian_sparsity", "jacobian_sparsity"]
