"""asd: automatic sparse differentiation for PyTorch.

Sparsity detection by index-set tracing, graph coloring, compressed JVPs/VJPs/HVPs and
decompression into CSR Jacobians and Hessians.
"""

from .api import clear_cache, prepare_jacobian, sparse_jacobian, to_scipy
from .coloring import Coloring, color
from .detection import jacobian_sparsity
from .errors import (AsdError, ColoringError, ConvergenceWarning, DecompressionError, InputError, TracingError,
                     UnsupportedOpError, UnsupportedOpWarning)
from .operators import SparseJacobian

__version__ = "0.1.0"

__all__ = [
    "jacobian_sparsity", "color", "Coloring", "sparse_jacobian", "prepare_jacobian", "SparseJacobian",
    "clear_cache", "to_scipy", "AsdError", "TracingError", "UnsupportedOpError", "UnsupportedOpWarning",
    "ColoringError", "DecompressionError", "InputError", "ConvergenceWarning",
]
