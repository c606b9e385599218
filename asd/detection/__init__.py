"""Sparsity detection by index-set tracing (see :mod:`asd.detection.tracer`)."""

from .jacobian import jacobian_sparsity

__all__ = ["jacobian_sparsity"]
