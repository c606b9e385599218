"""asd for JAX: sparsity detection on jaxprs, coloring, and jitted compressed AD with BCSR results.

``import asd`` never imports JAX; this subpackage does (``pip install asd[jax]``).
"""

try:
    import jax  # noqa: F401
    from jax.experimental import sparse as _jsparse  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ImportError("asd.jax needs JAX: install it with `pip install asd[jax]` (or `pip install jax`)") from exc

from ..coloring import Coloring, color
from ..errors import UnsupportedOpWarning
from .api import gradient_and_hessian, prepare_hessian, prepare_jacobian, sparse_hessian, sparse_jacobian, to_scipy
from .detection import hessian_sparsity, jacobian_sparsity
from .operators import SparseHessian, SparseJacobian
from .verify import verify

__all__ = ["jacobian_sparsity", "hessian_sparsity", "color", "Coloring", "sparse_jacobian", "sparse_hessian",
           "prepare_jacobian", "prepare_hessian", "gradient_and_hessian", "SparseJacobian", "SparseHessian",
           "to_scipy", "verify", "UnsupportedOpWarning"]
