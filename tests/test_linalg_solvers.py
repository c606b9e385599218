"""Solver objects of asd.linalg against dense float64 torch (values and autograd gradients)."""

import warnings

import pytest
import scipy.sparse.linalg as spla
import torch

import asd.linalg as al
from asd.errors import ConvergenceWarning, InputError
from asd.linalg import (CG, GMRES, LSMR, LU, MINRES, BiCGStab, Cholesky, SingularMatrixError,
                        SolveInfo, solve, with_values)
from asd.linalg._testing import check_sparse_grad, random_sparse, stored_values
from asd.linalg.solve import solver_for

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]
F64 = torch.float64


def _sparse(D, layout=torch.sparse_csr):
    A = D.to_sparse_csr() if layout == torch.sparse_csr else D.to_sparse()
    return A.detach().requires_grad_()


def _matrix(kind, n=9, m=None, seed=0):
    """Dense twin of a test matrix: spd, general, symmetric indefinite, tall or wide."""
    g = torch.Generator().manual_seed(seed)
    if kind in ("tall", "wide"):
        r, c = (n + 4, n) if kind == "tall" else (n, n + 4)
        D = torch.randn(r, c, generator=g, dtype=F64) * (torch.rand(r, c, generator=g) < 0.4)
        k = min(r, c)
        return D + torch.cat([torch.cat([3 * torch.eye(k, dtype=F64), torch.zeros(k, c - k, dtype=F64)], 1),
                              torch.zeros(r - k, c, dtype=F64)], 0)
    S = torch.randn(n, n, generator=g, dtype=F64) * (torch.rand(n, n, generator=g) < 0.3)
    if kind == "general":
        return S + (S.abs().sum(1).max() + 1) * torch.eye(n, dtype=F64)
    S = S + S.t()
    shift = S.abs().sum(1).max() + 1
    if kind == "spd":
        return S + shift * torch.eye(n, dtype=F64)
    signs = torch.tensor([1.0 if i % 2 else -1.0 for i in range(n)], dtype=F64)
    return S + shift * torch.diag(signs)                       # symmetric indefinite


def _dense_solution(D, B):
    """x = D^+ B, differentiable: solve, least squares (tall) or minimum norm (wide)."""
    r, c = D.shape
    if r == c:
        return torch.linalg.solve(D, B)
    if r > c:
        return torch.linalg.solve(D.t() @ D, D.t() @ B)
    return D.t() @ torch.linalg.solve(D @ D.t(), B)


CASES = [(LU(), "general"), (Cholesky(), "spd"), (CG(rtol=1e-13), "spd"),
         (BiCGStab(rtol=1e-13), "general"), (MINRES(rtol=1e-13), "indefinite"),
         (GMRES(rtol=1e-13, restart=4), "general"), (LSMR(rtol=1e-14), "general"),
         (LSMR(rtol=1e-14, maxiter=500), "tall"), (LSMR(rtol=1e-14, maxiter=500), "wide")]
IDS = [f"{type(s).__name__}-{k}" for s, k in CASES]


@pytest.mark.parametrize("solver,kind", CASES, ids=IDS)
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_solver_matches_dense_with_gradients(solver, kind, layout):
    D = _matrix(kind, seed=1)
    A = _sparse(D, layout)
    b = torch.randn(D.shape[0], 3, dtype=F64, requires_grad=True)
    x, info = solve(A, b, solver, return_info=True)
    Dd = D.clone().requires_grad_()
    bd = b.detach().clone().requires_grad_()
    xd = _dense_solution(Dd, bd)
    torch.testing.assert_close(x, xd, rtol=1e-7, atol=1e-8)
    assert isinstance(info, SolveInfo) and info.converged
    assert info.solver == type(solver).__name__
    assert len(info.per_column) == 3 and info.residual == max(c[2] for c in info.per_column)
    if kind in ("tall",):                                   # least squares: the residual stays
        assert info.residual > 1e-3
    else:
        assert info.residual < 1e-9
    W = torch.randn_like(xd)
    (x * W).sum().backward()
    (xd * W).sum().backward()
    check_sparse_grad(A, Dd.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b.grad, bd.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("solver,kind", CASES, ids=IDS)
def test_solver_gradcheck(solver, kind):
    D = _matrix(kind, n=5, seed=2)
    A = D.to_sparse_csr()
    v = stored_values(A).clone().requires_grad_()
    b = torch.randn(D.shape[0], 2, dtype=F64, requires_grad=True)
    perm = al._sparse.get_pattern(A).transpose()[1]

    def f(v, b):
        if isinstance(solver, Cholesky):                    # defined on symmetric A only
            v = 0.5 * (v + v[perm])
        return solve(with_values(A, v), b, solver)

    assert torch.autograd.gradcheck(f, (v, b), atol=1e-6)


@pytest.mark.parametrize("solver,kind", [(LU(), "general"), (LSMR(rtol=1e-14, maxiter=500), "tall"),
                                         (LSMR(rtol=1e-14, maxiter=500), "wide")], ids=["LU", "tall", "wide"])
def test_solver_gradgradcheck(solver, kind):
    D = _matrix(kind, n=4, seed=3)
    A = D.to_sparse_csr()
    v = stored_values(A).clone().requires_grad_()
    b = torch.randn(D.shape[0], dtype=F64, requires_grad=True)
    f = lambda v, b: solve(with_values(A, v), b, solver)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (v, b), atol=1e-5)


def test_lu_factorization_is_reused(monkeypatch):
    calls = []
    real = spla.splu
    monkeypatch.setattr(spla, "splu", lambda *a, **k: calls.append(1) or real(*a, **k))
    D = _matrix("general", seed=4)
    A = _sparse(D)
    state = LU().init(A)
    assert len(calls) == 1
    b1, b2 = torch.randn(9, dtype=F64), torch.randn(9, 2, dtype=F64)
    x1, _ = LU().compute(state, b1)
    x2, info = LU().compute(state, b2)
    x3 = solve(A, b1, state)                               # solver= a prepared state
    (x1.sum() + x2.sum() + x3.sum()).backward()            # adjoint solves through the same factors
    assert len(calls) == 1
    torch.testing.assert_close(x1, torch.linalg.solve(D, b1))
    torch.testing.assert_close(x2, torch.linalg.solve(D, b2))
    torch.testing.assert_close(x3, x1)
    Dd = D.clone().requires_grad_()
    (2 * torch.linalg.solve(Dd, b1).sum() + torch.linalg.solve(Dd, b2).sum()).backward()
    check_sparse_grad(A, Dd.grad)
    assert info.iterations == 0 and info.converged


def test_transposed_state_shares_the_factorization():
    D = _matrix("general", seed=5)
    state = LU().init(D.to_sparse_csr())
    t = LU().transpose(state)
    assert t.factor is state.factor and t.transposed and LU().transpose(t).transposed is False
    b = torch.randn(9, dtype=F64)
    torch.testing.assert_close(LU().compute(t, b)[0], torch.linalg.solve(D.t(), b))


def test_state_of_another_matrix_is_rejected():
    D = _matrix("general", seed=6)
    state = LU().init(D.to_sparse_csr())
    with pytest.raises(InputError, match="different matrix"):
        solve((2 * D).to_sparse_csr(), torch.randn(9, dtype=F64), state)
    with pytest.raises(InputError, match="this solver"):
        CG().compute(state, torch.randn(9, dtype=F64))


def test_string_shorthand_maps_to_objects():
    for method, cls in [("direct", LU), ("lu", LU), ("cholesky", Cholesky), ("cg", CG),
                        ("bicgstab", BiCGStab), ("minres", MINRES), ("gmres", GMRES), ("lsmr", LSMR)]:
        assert type(solver_for(method)) is cls
    assert solver_for("gmres", rtol=1e-9, restart=5, maxiter=40) == GMRES(rtol=1e-9, restart=5, maxiter=40)
    D = _matrix("spd", seed=7)
    A = D.to_sparse_csr()
    b = torch.randn(9, dtype=F64)
    x1, i1 = solve(A, b, "cg", rtol=1e-12, return_info=True)
    x2, i2 = solve(A, b, method="cg", rtol=1e-12, return_info=True)
    x3, i3 = solve(A, b, CG(rtol=1e-12), return_info=True)
    assert torch.equal(x1, x3) and torch.equal(x2, x3) and i1 == i3
    with pytest.raises(InputError, match="set them on it"):
        solve(A, b, CG(), rtol=1e-3)
    with pytest.raises(InputError, match="not both"):
        solve(A, b, "cg", method="cg")
    with pytest.raises(InputError, match="solver object"):
        solve(A, b, 3)


def test_cholesky_checks_spd_and_symmetry():
    Dind = _matrix("indefinite", seed=8)
    with pytest.raises(SingularMatrixError, match="not positive definite"):
        solve(Dind.to_sparse_csr(), torch.randn(9, dtype=F64), Cholesky())
    with pytest.raises(SingularMatrixError, match="not positive definite"):
        solve(Dind.to_sparse_csr(), torch.randn(9, dtype=F64), method="cholesky")
    with pytest.raises(InputError, match="symmetric"):
        solve(_matrix("general", seed=8).to_sparse_csr(), torch.randn(9, dtype=F64), Cholesky())
    with pytest.raises(SingularMatrixError, match="not positive definite"):
        solve(-_matrix("spd", seed=8).to_sparse_csr(), torch.randn(9, dtype=F64), Cholesky())


def test_square_solvers_reject_rectangular_a():
    A = _matrix("tall", seed=9).to_sparse_csr()
    for s in (LU(), Cholesky(), CG(), GMRES()):
        with pytest.raises(InputError, match="square.*LSMR"):
            s.init(A)


def test_nonconvergence_warns_forward_and_adjoint():
    D = _matrix("spd", n=30, seed=10)
    A = _sparse(D)
    b = torch.randn(30, dtype=F64)
    with pytest.warns(ConvergenceWarning, match=r"CG solve did not converge: 2 iterations, residual"):
        x, info = solve(A, b, CG(rtol=1e-14, maxiter=2), return_info=True)
    assert not info.converged and info.iterations == 2 and info.residual > info.tolerance > 0
    with pytest.warns(ConvergenceWarning, match="adjoint"):
        x.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solve(A, b, CG(rtol=1e-14, maxiter=2), warn=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_b_is_named(bad):
    A = _matrix("general", seed=11).to_sparse_csr()
    b = torch.randn(9, dtype=F64)
    b[3] = bad
    for s in (LU(), CG(), GMRES()):
        with pytest.raises(ValueError, match=r"\bb contains NaN or inf"):
            solve(A, b, s)


def test_nonfinite_a_is_named():
    D = _matrix("general", seed=11)
    D[0, 0] = float("nan")
    with pytest.raises(ValueError, match="A has NaN or inf"):
        solve(D.to_sparse_csr(), torch.randn(9, dtype=F64))


@pytest.mark.parametrize("make,name", [
    (lambda: CG(maxiter=0), "maxiter"), (lambda: GMRES(maxiter=-3), "maxiter"),
    (lambda: CG(maxiter=2.5), "maxiter"), (lambda: GMRES(restart=0), "restart"),
    (lambda: CG(rtol=-1e-3), "rtol"), (lambda: BiCGStab(rtol=float("nan")), "rtol"),
    (lambda: MINRES(rtol=1.5), "rtol"), (lambda: LSMR(rtol="tight"), "rtol"),
    (lambda: CG(atol=float("inf")), "atol"), (lambda: LSMR(preconditioner=lambda r: r), "preconditioner"),
])
def test_bad_options_are_named(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_bad_options_in_the_string_form():
    A = _matrix("spd", seed=12).to_sparse_csr()
    b = torch.randn(9, dtype=F64)
    with pytest.raises(ValueError, match="maxiter"):
        solve(A, b, "cg", maxiter=0)
    with pytest.raises(ValueError, match="restart"):
        solve(A, b, "gmres", restart=0)
    with pytest.raises(ValueError, match="rtol"):
        solve(A, b, "bicgstab", rtol=-1.0)


def test_compute_differentiates_the_matrix_given_to_init():
    D = _matrix("spd", seed=13)
    A = _sparse(D)
    solver = CG(rtol=1e-13, preconditioner=torch.diag(1 / torch.diag(D)).to_sparse_csr())
    state = solver.init(A)
    B = torch.randn(9, 2, dtype=F64)
    x, info = solver.compute(state, B)
    assert info.converged
    x.pow(2).sum().backward()
    Dd = D.clone().requires_grad_()
    torch.linalg.solve(Dd, B).pow(2).sum().backward()
    check_sparse_grad(A, Dd.grad, rtol=1e-7, atol=1e-8)


def test_batched_lsmr_and_minres():
    S, D = random_sparse(5, 5, layout=torch.sparse_coo, batch=2, seed=14, density=0.3)
    D = D + D.transpose(1, 2) + 6 * torch.eye(5, dtype=F64)
    A = D.to_sparse(3).detach().requires_grad_()
    b = torch.randn(2, 5, dtype=F64)
    for s in (MINRES(rtol=1e-13), LSMR(rtol=1e-14)):
        torch.testing.assert_close(solve(A, b, s), torch.linalg.solve(D, b))


def test_newton_with_solver_objects_and_factorization_reuse():
    from asd.problems import brusselator
    from asd.solvers import newton

    N = 5
    f = brusselator(N)
    x0 = torch.cat([torch.full((N * N,), 1.2), torch.full((N * N,), 3.0)]).double()
    ref = newton(f, x0, tol=1e-10)
    for kw in (dict(solver=GMRES(rtol=1e-12)), dict(solver=BiCGStab(rtol=1e-12)),
               dict(refactor_every=3)):
        res = newton(f, x0, tol=1e-10, maxiter=100, **kw)
        assert res.converged, kw
        torch.testing.assert_close(res.x, ref.x, rtol=1e-8, atol=1e-8)
    with pytest.raises(ValueError, match="refactor_every"):
        newton(f, x0, refactor_every=0)
    with pytest.raises(ValueError, match="solver"):
        newton(f, x0, solver="lu")


KRYLOV = [(CG, "spd"), (BiCGStab, "general"), (MINRES, "indefinite"), (GMRES, "general"),
          (LSMR, "general")]


@pytest.mark.parametrize("cls,kind", KRYLOV, ids=[c.__name__ for c, _ in KRYLOV])
def test_convergence_is_tested_every_check_every_iterations(cls, kind):
    D = _matrix(kind, n=40, seed=15)
    A = D.to_sparse_csr()
    b = torch.randn(40, dtype=F64)
    ref = torch.linalg.solve(D, b)
    for k in (1, 3, 7):
        x, info = solve(A, b, cls(rtol=1e-12, check_every=k, maxiter=2000), return_info=True)
        assert info.converged
        assert info.iterations % k == 0
        torch.testing.assert_close(x, ref, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("cls", [c for c, _ in KRYLOV], ids=[c.__name__ for c, _ in KRYLOV])
def test_krylov_loop_reads_back_once_per_block(cls, monkeypatch):
    """Host transfers (float/bool/item/tolist of a tensor) grow with the blocks, not the iterations."""
    n = 300                                              # 1-D Laplacian: needs ~n iterations
    D = 2 * torch.eye(n, dtype=F64) - torch.diag(torch.ones(n - 1, dtype=F64), 1) \
        - torch.diag(torch.ones(n - 1, dtype=F64), -1)
    A = D.to_sparse_csr()
    b = torch.randn(n, dtype=F64)
    state = cls(rtol=1e-15, atol=0.0, maxiter=40, check_every=10).init(A)
    counts = []
    for name in ("__float__", "__bool__", "item", "tolist"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, **k):
            counts.append(1)
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, spy)
    Bm = b.reshape(-1, 1)
    X, info = state.solver._run(state, Bm, None)
    monkeypatch.undo()
    assert info.iterations == 40
    assert len(counts) <= 4 + 8, len(counts)           # 4 blocks (+ a few per solve, not per step)


def test_check_every_is_validated():
    with pytest.raises(ValueError, match="check_every"):
        CG(check_every=0)


@pytest.mark.parametrize("shape,empty", [((6, 6), "row"), ((6, 6), "column"), ((9, 5), "column"),
                                         ((5, 9), "row")], ids=["square-row", "square-column", "tall", "wide"])
def test_lsmr_gradient_of_a_rank_deficient_matrix_is_the_pseudo_inverses(shape, empty):
    """LSMR gives the minimum-norm least-squares solution ``A^+ b`` of a rank-deficient A; its
    gradient took the pseudo-inverse's correction terms from the shape alone, and a square A with an
    empty row or column got neither (0.04 off at |grad| 0.2, silently; found by an adversarial
    review). Checked against central differences of ``pinv`` under perturbations that keep the rank
    (the empty line stays empty)."""
    g = torch.Generator().manual_seed(5)
    r, c = shape
    D = torch.randn(r, c, generator=g, dtype=F64) * (torch.rand(r, c, generator=g, dtype=F64) < 0.5)
    D[torch.arange(min(r, c)), torch.arange(min(r, c))] += 3.0
    if empty == "row":
        D[2] = 0.0
    else:
        D[:, 2] = 0.0
    idx = (D != 0).nonzero().T
    A = torch.sparse_coo_tensor(idx, D[tuple(idx)], (r, c)).coalesce().requires_grad_()
    b = torch.randn(r, generator=g, dtype=F64)
    W = torch.randn(c, generator=g, dtype=F64)
    x = solve(A, b, LSMR(rtol=1e-14, atol=1e-14, maxiter=1000))
    torch.testing.assert_close(x, torch.linalg.pinv(D) @ b, rtol=1e-10, atol=1e-12)
    (x * W).sum().backward()
    vals = A.detach().values()

    def loss(v):
        M = torch.zeros(r, c, dtype=F64).index_put((idx[0], idx[1]), v)
        return (torch.linalg.pinv(M) @ b * W).sum()

    h = 1e-6
    fd = torch.stack([(loss(vals + h * e) - loss(vals - h * e)) / (2 * h) for e in torch.eye(len(vals), dtype=F64)])
    torch.testing.assert_close(A.grad.coalesce().values(), fd, rtol=1e-6, atol=1e-7)
