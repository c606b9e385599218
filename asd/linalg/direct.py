"""Direct sparse solvers: ``LU`` and ``Cholesky`` (SuperLU through scipy, on the host).

scipy has no sparse Cholesky (and scikit-sparse's CHOLMOD is not a dependency), so
:class:`Cholesky` factorizes with SuperLU in symmetric mode: a fill-reducing symmetric ordering
and diagonal pivots only, which for a symmetric matrix is its LDL^T factorization (``U = D L^T``).
A symmetric matrix is positive definite exactly when every pivot ``D_kk`` is positive, so the
factorization doubles as the SPD check.

A factorization of a numerically singular A can still go through, on a pivot that is rounding
noise, and give a backward-stable ``x`` of norm ``~1/eps`` that solves nothing: a direct solve is
therefore judged by its residual, ``converged`` when ``||b - op(A) x|| <= eps^(1/4) ||b||``
(:func:`residual_tolerance`), and reported (``converged=False`` and a
:class:`~asd.errors.ConvergenceWarning`) otherwise.

Factorizations run on the host: off the CPU, A and each right-hand side are copied there and the
solution back (a :class:`~asd.errors.HostFallbackWarning`, once).  On ``meta`` nothing is
factorized and solves return shape-only results.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np
import torch

from asd.errors import InputError
from asd.linalg._device import all_finite, warn_host_fallback
from asd.linalg._sparse import Pattern
from asd.linalg.base import SingularMatrixError, SolveInfo, Solver, SolverState, residual_norms

__all__ = ["LU", "Cholesky", "DirectState"]

PIVOT_FACTOR = 100.0
"""A Cholesky pivot below ``PIVOT_FACTOR * eps`` times its diagonal entry is rounding noise."""


def residual_tolerance(Bm: torch.Tensor) -> list[float]:
    """``eps^(1/4) ||b||`` per column: the residual above which a direct solve is unreliable.

    A backward-stable solve leaves ``||b - A x|| <= eps cond(A) ||b||`` (roughly), so a system the
    dtype resolves (``cond(A)`` up to about ``1e5`` in float32, ``5e11`` in float64) stays below; a
    singular one leaves the part of ``b`` outside A's range, ``O(||b||)``.
    """
    eps = torch.finfo(Bm.dtype).eps
    return [eps ** 0.25 * n for n in torch.linalg.vector_norm(Bm, dim=0).tolist()]


@dataclass(frozen=True, eq=False)
class DirectState(SolverState):
    """A factorization (``factor``: scipy ``SuperLU``; ``None`` on meta) of A, shared by the state
    of A^T."""

    factor: object = None


class _Direct(Solver):
    remedy: ClassVar[str] = ("A is numerically singular or too ill-conditioned for its dtype; for a "
                             "least-squares solution use asd.linalg.LSMR()")

    def _prepare(self, P: Pattern, vals: torch.Tensor) -> DirectState:
        if vals.dtype not in (torch.float32, torch.float64):
            raise InputError(f"direct solves need float32 or float64 values, got {vals.dtype}")
        if P.on_meta:
            return DirectState(self, P, vals, False, None)
        return DirectState(self, P, vals, False, self._factor(P, vals))

    def _factor(self, P: Pattern, vals: torch.Tensor):
        """The factorization of A (on the host, whatever A's device)."""
        if P.device.type != "cpu":
            warn_host_fallback("a direct sparse solve (SuperLU)", P.device,
                               "the matrix once per factorization, each right-hand side per solve")
        return self._factorize(P.scipy(vals).tocsc())

    @abstractmethod
    def _factorize(self, A):
        """scipy ``SuperLU`` of the host CSC matrix ``A``."""

    def _solve(self, state: DirectState, Bm: torch.Tensor) -> torch.Tensor:
        """``op(A)^{-1} Bm`` with the host factorization (``Bm`` copied there and back)."""
        B = np.ascontiguousarray(Bm.cpu().numpy())
        X = state.factor.solve(B, trans="T" if state.transposed else "N")
        return torch.from_numpy(np.ascontiguousarray(X)).to(device=Bm.device, dtype=Bm.dtype)

    def _run(self, state: SolverState, Bm: torch.Tensor,
             X0: Optional[torch.Tensor]) -> tuple[torch.Tensor, SolveInfo]:
        if state.factor is None:                                  # meta: shapes only
            X = Bm.new_empty((state.shape[1], Bm.shape[1]))
            per = tuple((False, 0, float("nan")) for _ in range(Bm.shape[1]))
            return X, SolveInfo(self.name, False, 0, float("nan"), float("nan"), per)
        X = self._solve(state, Bm)
        if not all_finite(X):
            raise SingularMatrixError("A is numerically singular: the direct solve produced "
                                      "non-finite values")
        res = residual_norms(state, Bm, X)
        tol = residual_tolerance(Bm)
        per = tuple((r <= t, 0, r) for r, t in zip(res, tol))
        return X, SolveInfo(self.name, all(p[0] for p in per), 0, max(res), max(tol), per)


@dataclass(frozen=True)
class LU(_Direct):
    """Sparse LU factorization with partial pivoting (scipy SuperLU, computed on the host).

    ``init`` factorizes once; the state solves any number of right-hand sides, and its transpose
    (used by the backward pass) reuses the same factors.
    """

    def _factorize(self, A):
        import scipy.sparse.linalg as spla

        try:
            return spla.splu(A)
        except RuntimeError as e:
            raise singular_lu(e) from None


def singular_lu(e: Exception) -> SingularMatrixError:
    """The error of an LU factorization that met a singular matrix."""
    return SingularMatrixError(f"A is singular ({e}); LU needs a nonsingular matrix, or use "
                               f"asd.linalg.LSMR() for a least-squares solution")


@dataclass(frozen=True)
class Cholesky(_Direct):
    """Factorization of a symmetric positive definite A (SuperLU LDL^T with diagonal pivots).

    ``init`` raises :class:`~asd.linalg.SingularMatrixError` when A is not symmetric positive
    definite to working precision (naming the first pivot that is not positive, or no larger than
    ``100 eps`` times its diagonal entry: rounding noise of a singular A), and
    :class:`~asd.errors.InputError` when A is not symmetric.
    """

    def _factorize(self, A):
        import scipy.sparse.linalg as spla

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
        _check_pivots(d, A.diagonal()[np.argsort(lu.perm_c)], lu.perm_c)
        return lu


def _check_pivots(d: np.ndarray, diag: np.ndarray, perm: np.ndarray) -> None:
    """Raise if a positive LDL^T pivot ``d_k`` is no larger than ``PIVOT_FACTOR eps`` times its
    diagonal entry ``diag_k``: what a singular positive semidefinite A leaves in place of 0.

    ``d_k >= lambda_min(A)`` and ``diag_k <= lambda_max(A)``, so such a pivot means
    ``cond(A) >= 1 / (PIVOT_FACTOR eps)``.
    """
    small = np.flatnonzero(d <= PIVOT_FACTOR * np.finfo(d.dtype).eps * diag)
    if small.size:
        k = int(small[0])
        raise SingularMatrixError(
            f"A is numerically singular, so not positive definite: pivot {k} of its LDL^T "
            f"factorization is {d[k]:.3e}, rounding noise next to its diagonal entry {diag[k]:.3e} "
            f"(at row {int(np.flatnonzero(perm == k)[0])}); use asd.linalg.LSMR() for a "
            f"least-squares solution, or regularize A")
