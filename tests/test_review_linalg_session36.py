"""Review of the sparse solvers (session 36): LSMR on rank-deficient and ill-conditioned systems,
direct solves of singular matrices, GMRES on singular matrices, non-finite triangular solves and
misused preconditioners.  Each test failed before its fix, except the ``*_not_flagged`` guards,
which hold the new checks to no false alarms."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.sparse.linalg as spla
import torch

import asd.linalg as L
from asd.errors import ConvergenceWarning, InputError
from asd.solvers import newton

D = torch.float64
EMPTY_ROW = torch.tensor([[1., 2, 0], [0, 0, 0], [3, 0, 4]], dtype=D)
RANK_TWO = torch.tensor([[0.1, 0.2, 0.7], [0.3, 0.5, 0.1], [0.4, 0.7, 0.8]], dtype=D)


def _solve(A: torch.Tensor, b: torch.Tensor, solver):
    """``solve`` of the dense ``A`` as CSR, with its info and the ConvergenceWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        x, info = L.solve(A.to_sparse_csr(), b, solver, return_info=True)
    return x, info, [w for w in caught if issubclass(w.category, ConvergenceWarning)]


def _min_norm_lstsq(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    rcond = 10 * max(A.shape) * torch.finfo(A.dtype).eps
    return torch.linalg.lstsq(A, b.unsqueeze(1), rcond=rcond, driver="gelsd").solution.squeeze(1)


def _ill_conditioned(n: int, m: int, log_cond: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An ``(m, n)`` matrix of condition number ``10**log_cond`` and an orthonormal basis of its
    range."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=D))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=D))
    return U @ torch.diag(torch.logspace(0, -log_cond, n, dtype=D)) @ V.T, U


# 1. LSMR on rank-deficient matrices: the steps past the exhausted Krylov space blew x up.

def test_lsmr_rank_deficient_matches_scipy():
    b = torch.tensor([1., 2, 3], dtype=D)
    x, info, warned = _solve(EMPTY_ROW, b, L.LSMR())
    ref = spla.lsmr(EMPTY_ROW.numpy(), b.numpy(), atol=1e-12, btol=1e-12)[0]
    torch.testing.assert_close(x, torch.from_numpy(ref), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(x, _min_norm_lstsq(EMPTY_ROW, b), rtol=1e-10, atol=1e-12)
    assert info.converged and not warned
    assert info.residual == pytest.approx(2.0, rel=1e-10)


@pytest.mark.parametrize("m,n,rank", [(6, 4, 2), (8, 5, 3), (20, 15, 7), (30, 30, 12), (12, 12, 11),
                                      (4, 6, 2), (15, 25, 8), (40, 60, 20), (100, 80, 30)])
def test_lsmr_rank_deficient_gives_the_minimum_norm_solution(m, n, rank):
    g = torch.Generator().manual_seed(m * n + rank)
    for _ in range(6):
        A = torch.randn(m, rank, generator=g, dtype=D) @ torch.randn(rank, n, generator=g, dtype=D)
        b = torch.randn(m, generator=g, dtype=D)
        x, info, _ = _solve(A, b, L.LSMR(rtol=1e-12, maxiter=10 * n))
        ref = _min_norm_lstsq(A, b)
        assert info.converged
        torch.testing.assert_close(x, ref, rtol=1e-7, atol=1e-9 * ref.norm().item())
        assert info.residual == pytest.approx((A @ ref - b).norm().item(), rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_lsmr_least_squares_convergence_is_the_documented_rule(dtype):
    g = torch.Generator().manual_seed(3)
    A = (torch.randn(200, 60, generator=g, dtype=D) * (torch.rand(200, 60, generator=g, dtype=D) < 0.3))
    b = torch.randn(200, generator=g, dtype=D)
    x, info, warned = _solve(A.to(dtype), b.to(dtype), L.LSMR())
    assert info.converged and not warned and info.residual > info.tolerance
    r = b - A @ x.double()
    eps = torch.finfo(dtype).eps
    # ||A^T r|| <= rtol ||A|| ||r|| (rtol 1e-6, on the recurrence's estimates), up to float32's rounding of r
    assert (A.T @ r).norm() <= 10 * max(1e-6, 1e3 * eps) * A.norm() * r.norm()
    ref = _min_norm_lstsq(A, b)
    torch.testing.assert_close(x.double(), ref, rtol=1e-4, atol=1e-4 * ref.norm().item())


# 3. Direct solves of numerically singular matrices were reported converged.

def test_lu_reports_a_numerically_singular_matrix():
    b = torch.tensor([1., 0, 0], dtype=D)
    x, info, warned = _solve(RANK_TWO, b, L.LU())
    assert not info.converged and not info.per_column[0][0]
    assert info.tolerance == pytest.approx(torch.finfo(D).eps ** 0.25)
    assert info.residual > 0.5
    assert len(warned) == 1 and "numerically singular" in str(warned[0].message)


def test_lu_judges_each_right_hand_side():
    B = torch.stack([RANK_TWO @ torch.tensor([1., 2, 3], dtype=D), torch.tensor([1., 0, 0], dtype=D)], 1)
    _, info, _ = _solve(RANK_TWO, B, L.LU())
    assert [c[0] for c in info.per_column] == [True, False] and not info.converged


def test_cholesky_refuses_a_singular_positive_semidefinite_matrix():
    with pytest.raises(L.SingularMatrixError, match="numerically singular, so not positive definite"):
        L.solve((RANK_TWO.T @ RANK_TWO).to_sparse_csr(), torch.tensor([1., 0, 0], dtype=D), L.Cholesky())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_well_conditioned_direct_solves_are_not_flagged(dtype):
    g = torch.Generator().manual_seed(5)
    for n in [2, 7, 40, 300]:
        for _ in range(4):
            R = torch.randn(n, n, generator=g, dtype=D) * (torch.rand(n, n, generator=g, dtype=D) < min(1, 8 / n))
            signs = torch.sign(torch.randn(n, generator=g, dtype=D))
            general = R + torch.diag(signs * (R.abs().sum(1) + 1))
            spd = R @ R.T + torch.diag(R.abs().sum(1) ** 2 + 1)
            scale = 10.0 ** torch.randint(-20, 20, (1,), generator=g).item()
            B = torch.randn(n, 2, generator=g, dtype=D) * 10.0 ** torch.randint(-10, 10, (1,), generator=g).item()
            for M, solver in [(general, L.LU()), (spd, L.Cholesky()), (spd, L.LU())]:
                x, info, warned = _solve((scale * M).to(dtype), B.to(dtype), solver)
                assert info.converged and not warned, (n, solver, info)
                assert info.residual <= 1e-2 * info.tolerance


# 4. GMRES returned NaN on singular matrices.

@pytest.mark.parametrize("A,b,best", [
    (torch.tensor([[1., 0], [0, 0]], dtype=D), torch.tensor([1., 1], dtype=D), 1.0),
    (EMPTY_ROW, torch.tensor([1., 2, 3], dtype=D), 2.0),
    (torch.tensor([[0., 1], [0, 0]], dtype=D), torch.tensor([1., 0], dtype=D), 1.0),
], ids=["diagonal", "empty-row", "nilpotent"])
@pytest.mark.parametrize("maxiter", [None, 200])
def test_gmres_on_a_singular_matrix_returns_its_best_iterate(A, b, best, maxiter):
    x, info, warned = _solve(A, b, L.GMRES(maxiter=maxiter))
    assert torch.isfinite(x).all() and math.isfinite(info.residual)
    assert info.residual == pytest.approx(best, rel=1e-10)
    assert (A @ x - b).norm().item() == pytest.approx(best, rel=1e-10)
    assert not info.converged and len(warned) == 1


# 5. triangular_solve accepted NaN and inf.

def test_triangular_solve_refuses_non_finite_values():
    T = torch.tensor([[2., 0, 0], [1, 3, 0], [0, 1, 4]], dtype=D)
    b = torch.ones(3, dtype=D)
    with pytest.raises(InputError, match="L has NaN or inf"):
        L.triangular_solve(torch.tril(T * math.inf).to_sparse_csr(), b)
    with pytest.raises(InputError, match="b contains NaN or inf"):
        L.triangular_solve(T.to_sparse_csr(), torch.tensor([1., math.nan, 1], dtype=D))
    with pytest.raises(InputError, match="b contains NaN or inf"):
        L.triangular_solve(T.to_sparse_coo(), torch.tensor([[1.], [math.inf], [1]], dtype=D), transpose=True)


# 6. Misused preconditioners gave raw errors, or none.

SPD = torch.tensor([[4., 1, 0], [1, 3, 1], [0, 1, 2]], dtype=D)


@pytest.mark.parametrize("solver", [L.CG, L.BiCGStab, L.MINRES, L.GMRES], ids=lambda s: s.__name__)
@pytest.mark.parametrize("M,got", [(lambda r: r[:2], r"shape \(2,\)"), (lambda r: r.numpy(), "a ndarray"),
                                   (lambda r: r.float(), r"shape \(3,\), torch.float32"),
                                   (lambda r: r.tolist(), "a list")], ids=["short", "numpy", "float32", "list"])
def test_a_callable_preconditioner_with_a_wrong_output_is_named(solver, M, got):
    with pytest.raises(InputError, match=rf"preconditioner must map the residual r .*shape \(3,\), "
                                         rf"torch.float64.* but returned {got}"):
        L.solve(SPD.to_sparse_csr(), torch.ones(3, dtype=D), solver(preconditioner=M))


def test_a_sparse_preconditioner_of_another_dtype_is_refused():
    M = torch.eye(3).to_sparse_csr()
    with pytest.raises(InputError, match=r"preconditioner is torch.float32 but A is torch.float64; cast"):
        L.solve(SPD.to_sparse_csr(), torch.ones(3, dtype=D), L.CG(preconditioner=M))
    x = L.solve(SPD.to_sparse_csr(), torch.ones(3, dtype=D), L.CG(preconditioner=M.to(D), rtol=1e-12))
    torch.testing.assert_close(x, torch.linalg.solve(SPD, torch.ones(3, dtype=D)))


def test_a_good_callable_preconditioner_still_works():
    diag = SPD.diagonal()
    x, info, warned = _solve(SPD, torch.ones(3, dtype=D), L.CG(preconditioner=lambda r: r / diag, rtol=1e-12))
    assert info.converged and not warned
    torch.testing.assert_close(x, torch.linalg.solve(SPD, torch.ones(3, dtype=D)))
    assert np.isfinite(info.residual)
