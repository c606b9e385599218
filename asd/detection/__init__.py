"""Sparsity detection by index-set tracing.

Modules, each importing only those before it: :mod:`~asd.detection.sets` (index-set operations,
torch-free), :mod:`~asd.detection._core` (traced tensors and the call record rules see),
:mod:`~asd.detection.table` (the rule table), :mod:`~asd.detection.rules` (the op families, which
fill the table on import), :mod:`~asd.detection.torch_tracer` (the ``__torch_dispatch__`` front
end), then :mod:`~asd.detection.jacobian`, :mod:`~asd.detection.hessian` and
:mod:`~asd.detection.verify`.
"""

from . import rules  # noqa: F401  (registers every family: the table is complete after import)
from .hessian import hessian_pattern, hessian_sparsity
from .jacobian import jacobian_pattern, jacobian_sparsity
from .table import register_rule

__all__ = ["hessian_pattern", "hessian_sparsity", "jacobian_pattern", "jacobian_sparsity", "register_rule"]
