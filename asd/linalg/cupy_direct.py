"""``CupyLU``: an LU solver whose solves run on the GPU through CuPy (``pip install asd[cuda]``).

SuperLU factorizes on the host once (CuPy's ``splu`` does the same); every solve after that,
the backward pass's adjoint solves included, runs cuSPARSE triangular solves on the GPU, and
arrays cross between torch and CuPy through DLPack without copies.  CuPy is imported only when
a ``CupyLU`` is used on a CUDA tensor.

This path has not run on a GPU in asd's test environment; ``tests/test_linalg_device.py`` holds
its GPU test, which skips without CUDA and CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asd.errors import InputError
from asd.linalg._device import warn_host_fallback
from asd.linalg._sparse import Pattern
from asd.linalg.direct import LU, DirectState, singular_lu

__all__ = ["CupyLU"]


def _cupy():
    try:
        import cupy
        import cupyx.scipy.sparse as csp
        import cupyx.scipy.sparse.linalg as cspla
    except ImportError as e:
        raise ImportError("asd.linalg.CupyLU needs CuPy: pip install asd[cuda] (or the "
                          "cupy-cudaXXx wheel matching your CUDA), or use asd.linalg.LU()") from e
    return cupy, csp, cspla


@dataclass(frozen=True)
class CupyLU(LU):
    """LU of a CUDA sparse matrix: host factorization once, GPU solves (CuPy, cuSPARSE).

    Takes CUDA (or meta) tensors only; on CPU use :class:`~asd.linalg.LU`.
    """

    def _factor(self, P: Pattern, vals: torch.Tensor):
        if P.device.type != "cuda":
            raise InputError(f"CupyLU solves CUDA tensors, A is on {P.device.type}; use "
                             f"asd.linalg.LU()")
        cupy, csp, cspla = _cupy()
        warn_host_fallback("the factorization of CupyLU (SuperLU)", P.device,
                           "the matrix once per factorization; solves stay on the GPU")
        A = csp.csr_matrix((cupy.from_dlpack(vals.detach().contiguous()),
                            cupy.from_dlpack(P.col).astype(cupy.int32),
                            cupy.from_dlpack(P.crow).astype(cupy.int32)),
                           shape=(P.n_rows, P.n_cols))
        try:
            return cspla.splu(A.tocsc())
        except RuntimeError as e:
            raise singular_lu(e) from None

    def _solve(self, state: DirectState, Bm: torch.Tensor) -> torch.Tensor:
        cupy, _, _ = _cupy()
        B = cupy.from_dlpack(Bm.detach().contiguous())
        X = state.factor.solve(B, trans="T" if state.transposed else "N")
        return torch.from_dlpack(cupy.ascontiguousarray(X))
