"""asd.linalg.solve (direct and Krylov) against dense float64 references."""

import pytest
import torch

from asd.errors import ConvergenceWarning, InputError
from asd.linalg import CG, GMRES, SolveInfo, solve, with_values
from asd.linalg._sparse import get_pattern
from asd.linalg._testing import check_sparse_grad, random_sparse, stored_values

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]
LAYOUTS = [torch.sparse_csr, torch.sparse_coo]


def _spd(n, layout, seed, dtype=torch.float64, batch=None):
    S, D = random_sparse(n, n, layout=torch.sparse_coo, seed=seed, density=0.25, dtype=dtype)
    D = D + D.t() + (2 * D.abs().sum(1).max() + 1) * torch.eye(n, dtype=dtype)
    A = D.to_sparse_csr() if layout == torch.sparse_csr else D.to_sparse()
    return A.detach().requires_grad_(), D


def _general(n, layout, seed, dtype=torch.float64):
    S, D = random_sparse(n, n, layout=layout, seed=seed, density=0.3, dtype=dtype)
    D = D + (D.abs().sum(1).max() + 1) * torch.eye(n, dtype=dtype)
    A = D.to_sparse_csr() if layout == torch.sparse_csr else D.to_sparse()
    return A.detach().requires_grad_(), D


METHODS = [("direct", False), ("lu", False), ("cholesky", True), ("cg", True), ("minres", True),
           ("bicgstab", False), ("gmres", False), ("lsmr", False)]


@pytest.mark.parametrize("method,spd", METHODS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_solve_matches_dense(method, spd, layout):
    A, D = (_spd if spd else _general)(9, layout, seed=1)
    b = torch.randn(9, 2, dtype=torch.float64, requires_grad=True)
    x, info = solve(A, b, method, rtol=1e-13, return_info=True)
    assert isinstance(info, SolveInfo) and info.converged
    Dd = D.clone().requires_grad_()
    bd = b.detach().clone().requires_grad_()
    xd = torch.linalg.solve(Dd, bd)
    torch.testing.assert_close(x, xd, rtol=1e-8, atol=1e-9)
    W = torch.randn(9, 2, dtype=torch.float64)
    (x * W).sum().backward()
    (xd * W).sum().backward()
    check_sparse_grad(A, Dd.grad, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(b.grad, bd.grad, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("method", ["direct", "cg", "gmres"])
def test_solve_float32(method):
    A, D = _spd(10, torch.sparse_csr, seed=2, dtype=torch.float32)
    b = torch.randn(10, dtype=torch.float32)
    x = solve(A, b, method, rtol=1e-6)
    torch.testing.assert_close(x, torch.linalg.solve(D, b), rtol=1e-4, atol=1e-4)
    assert x.dtype == torch.float32
    x.sum().backward()
    Dd = D.clone().requires_grad_()
    torch.linalg.solve(Dd, b).sum().backward()
    check_sparse_grad(A, Dd.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("method", ["direct", "cg"])
def test_solve_batched(method):
    S, D = random_sparse(6, 6, layout=torch.sparse_coo, batch=2, seed=3, density=0.3)
    D = D + D.transpose(1, 2) + 8 * torch.eye(6, dtype=torch.float64)
    A = D.to_sparse(3).detach().requires_grad_()
    b = torch.randn(2, 6, dtype=torch.float64)
    x = solve(A, b, method, rtol=1e-12)
    torch.testing.assert_close(x, torch.linalg.solve(D, b), rtol=1e-8, atol=1e-9)
    x.sum().backward()
    Dd = D.clone().requires_grad_()
    torch.linalg.solve(Dd, b).sum().backward()
    check_sparse_grad(A, Dd.grad, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("method", ["direct", "cholesky", "cg"])
def test_solve_gradgradcheck(method):
    A, _ = _spd(6, torch.sparse_csr, seed=4)
    v = stored_values(A).detach().clone().requires_grad_()
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    perm = get_pattern(A.detach()).transpose()[1]     # A^T's values in A's (symmetric) pattern

    def f(v, b):
        if method == "cholesky":                          # Cholesky is defined on symmetric A only
            v = 0.5 * (v + v[perm])
        return solve(with_values(A.detach(), v), b, method, rtol=1e-13)

    assert torch.autograd.gradcheck(f, (v, b), atol=1e-6)
    assert torch.autograd.gradgradcheck(f, (v, b), atol=1e-5)


@pytest.mark.parametrize("method", ["cg", "bicgstab", "gmres", "minres"])
def test_preconditioners(method):
    A, D = _spd(12, torch.sparse_csr, seed=5)
    b = torch.randn(12, dtype=torch.float64)
    dinv = 1 / torch.diag(D)
    Msp = torch.diag(dinv).to_sparse_csr()
    x1, i1 = solve(A, b, method, rtol=1e-12, M=Msp, return_info=True)
    x2, i2 = solve(A, b, method, rtol=1e-12, M=lambda r: dinv * r, return_info=True)
    ref = torch.linalg.solve(D, b)
    torch.testing.assert_close(x1, ref, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(x2, ref, rtol=1e-8, atol=1e-9)
    assert i1.converged and i2.converged


def test_krylov_restart_and_x0():
    A, D = _general(8, torch.sparse_csr, seed=6)
    b = torch.randn(8, dtype=torch.float64)
    x, info = solve(A, b, GMRES(rtol=1e-12, restart=3), return_info=True)
    torch.testing.assert_close(x, torch.linalg.solve(D, b), rtol=1e-8, atol=1e-9)
    assert info.solver == "GMRES" and info.iterations > 3
    A2, D2 = _spd(8, torch.sparse_csr, seed=6)
    ref = torch.linalg.solve(D2, b)
    x, info = solve(A2, b, CG(rtol=1e-10), x0=ref.clone(), return_info=True)
    assert info.iterations == 0


def test_nonconvergence_warns_and_reports():
    A, D = _spd(30, torch.sparse_csr, seed=7)
    b = torch.randn(30, dtype=torch.float64)
    with pytest.warns(ConvergenceWarning, match=r"CG solve did not converge: 2 iterations"):
        x, info = solve(A, b, "cg", rtol=1e-14, maxiter=2, return_info=True)
    assert not info.converged and info.iterations == 2
    assert info.residual > info.tolerance
    assert torch.isfinite(x).all()


def test_solve_errors():
    A, _ = _general(5, torch.sparse_csr, seed=8)
    with pytest.raises(InputError, match="square"):
        solve(random_sparse(5, 4, requires_grad=False)[0], torch.randn(5, dtype=torch.float64))
    with pytest.raises(InputError, match="shape"):
        solve(A, torch.randn(4, dtype=torch.float64))
    with pytest.raises(InputError, match="unknown method"):
        solve(A, torch.randn(5, dtype=torch.float64), method="qr")
    with pytest.raises(InputError, match="sparse COO or CSR"):
        solve(torch.eye(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64))
    with pytest.raises(InputError, match="device"):
        solve(A, torch.randn(5, dtype=torch.float64, device="meta"))
    sing = torch.zeros(5, 5, dtype=torch.float64)
    sing[0, 0] = 1.0
    sing[1, 1] = 1.0
    sing[2, 3] = 1.0
    with pytest.raises(InputError, match="singular"):
        solve(sing.to_sparse_csr(), torch.randn(5, dtype=torch.float64))


@pytest.mark.parametrize("make", ["LU", "Cholesky", "CG"])
def test_a_state_of_values_changed_in_place_is_refused(make):
    """A prepared state shares A's values tensor: after A.values().mul_() (an optimizer step) the
    factorization was of the old A and solve(A, b, state) returned the old A's solution (found by
    an adversarial review). A copy taken at init tells them apart."""
    import asd.linalg as L

    A, D = _spd(7, torch.sparse_csr, seed=3)
    A = A.detach()
    b = torch.randn(7, dtype=torch.float64)
    state = getattr(L, make)().init(A)
    torch.testing.assert_close(solve(A, b, state), torch.linalg.solve(D, b))
    with torch.no_grad():
        A.values().mul_(3.0)
    with pytest.raises(InputError, match="changed in place since solver.init"):
        solve(A, b, state)
    with pytest.raises(InputError, match="changed in place since solver.init"):
        state.solver.compute(state, b)
    with pytest.raises(InputError, match="changed in place since solver.init"):
        state.solver.compute(state.solver.transpose(state), b)
    fresh = state.solver.init(A)
    torch.testing.assert_close(solve(A, b, fresh), torch.linalg.solve(A.to_dense(), b))
    A.values().numpy()[0] += 1.0  # no version count: compared by content
    with pytest.raises(InputError, match="changed in place"):
        solve(A, b, fresh)
