"""asd: automatic sparse differentiation for PyTorch.

Sparsity detection by index-set tracing, graph coloring, compressed JVPs/VJPs/HVPs and
decompression into CSR Jacobians and Hessians.
"""

import warnings as _warnings

# asd returns torch.sparse_csr results by contract; PyTorch's one-time "beta" notice about the
# layout is noise for asd's users.
_warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state", category=UserWarning)

from .api import (clear_cache, gradient_and_hessian, prepare_hessian, prepare_jacobian, sparse_hessian,
                  sparse_jacobian, to_cupy, to_scipy)
from .coloring import Coloring, color
from .detection import hessian_sparsity, jacobian_sparsity
from .detection.verify import VerifyReport, verify
from .errors import (ADGapError, ADGapWarning, AsdError, CheckError, ColoringError, ConvergenceWarning, DecompressionError, HostFallbackWarning,
                     InputError, PrecisionWarning, StalePatternWarning, TracingError, TransformUnsupported, UnsupportedOpError,
                     UnsupportedOpWarning)
from .operators import SparseHessian, SparseJacobian
from .patterns import SparsityPattern

from . import distributions, linalg  # noqa: E402  (sparsity-preserving sparse linear algebra)

__version__ = "0.1.0"

__all__ = [
    "SparsityPattern", "ADGapError", "ADGapWarning", "CheckError", "StalePatternWarning", "TransformUnsupported", "HostFallbackWarning",
    "jacobian_sparsity", "hessian_sparsity", "verify", "VerifyReport", "color", "Coloring", "sparse_jacobian", "prepare_jacobian",
    "SparseJacobian", "sparse_hessian", "prepare_hessian", "SparseHessian", "gradient_and_hessian",
    "clear_cache", "to_scipy", "to_cupy", "AsdError", "TracingError", "UnsupportedOpError", "UnsupportedOpWarning",
    "ColoringError", "DecompressionError", "InputError", "ConvergenceWarning", "PrecisionWarning", "linalg",
    "distributions",
]
