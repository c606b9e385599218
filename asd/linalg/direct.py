"""Direct sparse solvers: ``LU`` and ``Cholesky`` (SuperLU through scipy, on the host).

scipy has no sparse Cholesky (and scikit-sparse's CHOLMOD is not a dependency), so
:class:`Cholesky` factorizes with SuperLU in symmetric mode: a fill-reducing symmetric ordering
and diagonal pivots only, which for a symmetric matrix is its LDL^T factorization (``U = D L^T``).
A symmetric matrix is positive definite exactly when every pivot ``D_kk`` is positive, so the
factorization doubles as the SPD check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from asd.errors import InputError
from asd.linalg._sparse import Pattern
from asd.linalg.base import SingularMatrixError, SolveInfo, Solver, SolverState, residual_norms

__all__ = ["LU", "Cholesky", "DirectState"]


@dataclass(frozen=True, eq=False)
class DirectState(SolverState):
    """A factorization (``factor``: scipy ``SuperLU``) of A, shared by the state of A^T."""

    factor: object = None


class _Direct(Solver):
    def _run(self, state: SolverState, Bm: torch.Tensor,
             X0: Optional[torch.Tensor]) -> tuple[torch.Tensor, SolveInfo]:
        B = np.ascontiguousarray(Bm.cpu().numpy())
        X = state.factor.solve(B, trans="T" if state.transposed else "N")
        if not np.all(np.isfinite(X)):
            raise SingularMatrixError("A is numerically singular: the direct solve produced "
                                      "non-finite values")
        X = torch.from_numpy(np.ascontiguousarray(X)).to(device=Bm.device, dtype=Bm.dtype)
        res = residual_norms(state, Bm, X)
        per = tuple((True, 0, r) for r in res)
        return X, SolveInfo(self.name, True, 0, max(res), float("nan"), per)


def _host_csc(P: Pattern, vals: torch.Tensor):
    if vals.dtype not in (torch.float32, torch.float64):
        raise InputError(f"direct solves need float32 or float64 values, got {vals.dtype}")
    return P.scipy(vals).tocsc()


@dataclass(frozen=True)
class LU(_Direct):
    """Sparse LU factorization with partial pivoting (scipy SuperLU, computed on the host).

    ``init`` factorizes once; the state solves any number of right-hand sides, and its transpose
    (used by the backward pass) reuses the same factors.
    """

    def _prepare(self, P: Pattern, vals: torch.Tensor) -> DirectState:
        import scipy.sparse.linalg as spla

        try:
            lu = spla.splu(_host_csc(P, vals))
        except RuntimeError as e:
            raise SingularMatrixError(
                f"A is singular ({e}); LU needs a nonsingular matrix, or use asd.linalg.LSMR() "
                f"for a least-squares solution") from None
        return DirectState(self, P, vals, False, lu)


@dataclass(frozen=True)
class Cholesky(_Direct):
    """Factorization of a symmetric positive definite A (SuperLU LDL^T with diagonal pivots).

    ``init`` raises :class:`~asd.linalg.SingularMatrixError` when A is not symmetric positive
    definite (naming the first non-positive pivot), :class:`~asd.errors.InputError` when A is not
    symmetric.
    """

    def _prepare(self, P: Pattern, vals: torch.Tensor) -> DirectState:
        import scipy.sparse.linalg as spla

        A = _host_csc(P, vals)
        scale = float(abs(A).max()) if A.nnz else 0.0
        asym = float(abs(A - A.T).max()) if A.nnz else 0.0
        if asym > 100 * np.finfo(A.dtype).eps * scale:
            raise InputError(f"Cholesky needs a symmetric A, but max |A - A^T| = {asym:.3e} "
                             f"(max |A| = {scale:.3e}); use asd.linalg.LU() or GMRES()")
        try:
            lu = spla.splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                           options=dict(SymmetricMode=True))
        except RuntimeError as e:
            raise SingularMatrixError(f"A is singular ({e}), so not positive definite; Cholesky "
                                      f"needs a symmetric positive definite A") from None
        if not np.array_equal(lu.perm_r, lu.perm_c):
            raise SingularMatrixError("A is not positive definite: its LDL^T factorization met a "
                                      "zero pivot; use asd.linalg.LU() or MINRES()")
        d = lu.U.diagonal()
        bad = np.flatnonzero(~(d > 0))
        if bad.size:
            k = int(bad[0])
            raise SingularMatrixError(
                f"A is not positive definite: pivot {k} of its LDL^T factorization is "
                f"{d[k]:.3e} <= 0 (at row {int(np.flatnonzero(lu.perm_c == k)[0])}); use asd.linalg.LU() or MINRES() "
                f"for symmetric indefinite matrices")
        return DirectState(self, P, vals, False, lu)
