"""asd inside SciPy the way SciPy's users write it: every minimize method that takes jac, hess or
hessp; solve_ivp's stiff methods, least_squares and root with asd.scipy callables. Results are
checked against the known optimum / dense references in float64."""

import numpy as np
import pytest
import scipy.optimize as so
import scipy.sparse as sp
import torch
from scipy.integrate import solve_ivp

import asd
import asd.scipy
from asd.problems import rosenbrock
from asd.solvers import minimize

GRADIENT_METHODS = ["CG", "BFGS", "L-BFGS-B", "TNC", "SLSQP"]
HESSIAN_METHODS = ["Newton-CG", "trust-constr", "trust-ncg", "trust-krylov", "trust-exact", "dogleg"]


@pytest.mark.parametrize("method", GRADIENT_METHODS + HESSIAN_METHODS)
def test_minimize_every_method(method):
    if method == "dogleg":  # needs a positive definite Hessian everywhere on its path
        f = lambda x: ((x - 1) ** 2).sum() + 0.1 * (x[1:] * x[:-1]).sum() + (x ** 4).sum() * 0.01  # noqa: E731
        x0 = np.zeros(12)
    else:
        f, x0 = rosenbrock, np.full(12, 0.5)
    res = minimize(f, x0, method=method, tol=1e-10, options={"maxiter": 5000})
    ref = so.minimize(lambda z: float(f(torch.tensor(z))), x0, method="BFGS", tol=1e-12,
                      jac=lambda z: torch.func.grad(f)(torch.tensor(z)).numpy())
    np.testing.assert_allclose(res.x, ref.x, atol=2e-4)


def test_gradient_methods_never_compute_a_hessian(monkeypatch):
    calls = []
    real = asd.scipy._Scalar.hessian
    monkeypatch.setattr(asd.scipy._Scalar, "hessian", lambda self, *a: calls.append(1) or real(self, *a))
    minimize(rosenbrock, np.full(10, 0.5), method="L-BFGS-B")
    assert not calls


def _counting(monkeypatch, count: dict) -> None:
    """Count the evaluations of ``f`` outside ``f``: a counter ``f`` itself updates is state it reads,
    which rightly makes every call a new one."""
    real = asd.scipy._Adapter.of_variable

    def of_variable(self, *a):
        count["f"] += 1
        return real(self, *a)
    monkeypatch.setattr(asd.scipy._Adapter, "of_variable", of_variable)


def test_value_and_gradient_share_one_evaluation(monkeypatch):
    count = {"f": 0}
    _counting(monkeypatch, count)
    s = asd.scipy._Scalar(rosenbrock, np.full(5, 0.3), 0, (), torch.float64, "cpu", {})
    z = np.full(5, 0.7)
    s.value_and_grad(z)
    before = count["f"]
    s.value_and_grad(z)
    assert s.value(z) == s.value_and_grad(z)[0]
    assert count["f"] == before


def test_dense_hessian_methods_refuse_huge_problems(monkeypatch):
    import asd.solvers.scipy as ss

    monkeypatch.setattr(ss, "MAX_DENSE_HESSIAN", 5)
    with pytest.raises(asd.InputError, match="trust-krylov"):
        minimize(rosenbrock, np.full(10, 0.5), method="trust-exact")


def robertson(t, y):
    k1, k2, k3 = 0.04, 3e7, 1e4
    y1, y2, y3 = y[0::3], y[1::3], y[2::3]
    d1 = -k1 * y1 + k3 * y2 * y3
    d2 = k1 * y1 - k3 * y2 * y3 - k2 * y2 ** 2
    d3 = k2 * y2 ** 2
    return torch.stack([d1, d2, d3], dim=1).reshape(-1) * (1 + 0 * t)


@pytest.mark.parametrize("method", ["BDF", "Radau"])
def test_solve_ivp_with_sparse_jacobian(method):
    y0 = np.tile([1.0, 0.0, 0.0], 4)
    jac = asd.scipy.jac(robertson, y0, argnum=1, args=(0.0,))
    fun = asd.scipy.fun(robertson, argnum=1)
    J = jac(0.3, y0 + 0.1)
    assert sp.issparse(J) and J.nnz < 12 * 12
    dense = torch.autograd.functional.jacobian(lambda y: robertson(0.3, y), torch.tensor(y0 + 0.1))
    np.testing.assert_allclose(J.toarray(), dense.numpy())
    sol = solve_ivp(fun, (0, 10.0), y0, method=method, jac=jac, rtol=1e-8, atol=1e-10)
    ref = solve_ivp(fun, (0, 10.0), y0, method=method, rtol=1e-8, atol=1e-10)
    assert sol.success
    np.testing.assert_allclose(sol.y[:, -1], ref.y[:, -1], rtol=1e-5, atol=1e-9)


def test_least_squares_and_root():
    def r(x):
        return torch.cat([10 * (x[1:] - x[:-1] ** 2), 1 - x[:-1]])

    x0 = np.full(15, -0.5)
    res = so.least_squares(asd.scipy.fun(r), x0, jac=asd.scipy.jac(r, x0), xtol=1e-14, ftol=1e-14, gtol=1e-14)
    np.testing.assert_allclose(res.x, np.ones(15), atol=1e-6)

    def F(x):
        return torch.cat([x[:1] - 2, x[1:] - 0.5 * x[:-1] ** 2])

    # root's MINPACK methods take dense Jacobians only: one prepared operator, dense=True
    jac = asd.scipy.jac(F, np.ones(6), dense=True)
    J = jac(np.full(6, 0.3))
    assert isinstance(J, np.ndarray)
    dense = torch.autograd.functional.jacobian(F, torch.full((6,), 0.3, dtype=torch.float64))
    np.testing.assert_allclose(J, dense.numpy())
    for method in ("hybr", "lm"):
        sol = so.root(asd.scipy.fun(F), np.ones(6), jac=jac, method=method)
        assert sol.success
        np.testing.assert_allclose(F(torch.tensor(sol.x)).numpy(), 0, atol=1e-10)


def test_hess_and_hessp_callables_with_extra_args():
    def f(x, a):
        return a * ((x[1:] - x[:-1] ** 2) ** 2).sum() + ((1 - x) ** 2).sum()

    x0 = np.full(8, 0.3)
    H = asd.scipy.hess(f, x0, args=(100.0,))(x0, 100.0)
    dense = torch.autograd.functional.hessian(lambda z: f(z, 100.0), torch.tensor(x0)).numpy()
    np.testing.assert_allclose(H.toarray(), dense)
    p = np.arange(8.0)
    np.testing.assert_allclose(asd.scipy.hessp(f, x0, args=(100.0,))(x0, p, 100.0), dense @ p)
    res = so.minimize(asd.scipy.fun(f), x0, args=(100.0,), jac=asd.scipy.grad(f, x0, args=(100.0,)),
                      hessp=asd.scipy.hessp(f, x0, args=(100.0,)), method="trust-krylov", tol=1e-10)
    np.testing.assert_allclose(res.x, np.ones(8), atol=1e-5)
    hess = asd.scipy.hess(f, x0, args=(100.0,))
    res = so.minimize(asd.scipy.fun(f), x0, args=(100.0,), jac=asd.scipy.grad(f, x0, args=(100.0,)), hess=hess,
                      method="trust-constr", tol=1e-12)
    np.testing.assert_allclose(res.x, np.ones(8), atol=1e-5)
    assert res.nhev > 0 and sp.issparse(hess(res.x, 100.0))  # the sparse Hessian went to SciPy


# -- every Hessian method gets asd's exact Hessian, computed once per point ------------------------

@pytest.mark.parametrize("method", HESSIAN_METHODS)
def test_hessian_methods_use_the_exact_hessian_once_per_point(method, monkeypatch):
    """The Hessian (or hessp) reaches the method - Newton-CG and trust-constr would otherwise fall
    back to finite differences or quasi-Newton updates - and is evaluated once per point however
    often the method asks (trust-ncg/krylov call hessp many times per point)."""
    evaluated = []
    real = asd.SparseHessian.values
    monkeypatch.setattr(asd.SparseHessian, "values",
                        lambda self, x, *a, **k: evaluated.append(x.detach().clone()) or real(self, x, *a, **k))
    asked = []
    real_hessian = asd.scipy._Scalar.kept_hessian  # what hessian() and the products read
    monkeypatch.setattr(asd.scipy._Scalar, "kept_hessian", lambda self, *a: asked.append(1) or real_hessian(self, *a))
    if method == "dogleg":
        f = lambda x: ((x - 1) ** 2).sum() + 0.1 * (x[1:] * x[:-1]).sum() + (x ** 4).sum() * 0.01  # noqa: E731
        x0 = np.zeros(12)
    else:
        f, x0 = rosenbrock, np.full(12, 0.5)
    res = minimize(f, x0, method=method, tol=1e-10)
    assert evaluated, "the method never received asd's Hessian"
    points = {x.numpy().tobytes() for x in evaluated}
    assert len(points) == len(evaluated) <= len(asked)
    ref = torch.func.hessian(f)(torch.tensor(res.x)).numpy()
    np.testing.assert_allclose(asd.scipy.hess(f, x0)(res.x).toarray(), ref, atol=1e-12)


def test_value_gradient_and_hessian_are_reused_at_the_same_point(monkeypatch):
    count = {"f": 0, "H": 0}
    _counting(monkeypatch, count)
    s = asd.scipy._Scalar(rosenbrock, np.full(6, 0.3), 0, (), torch.float64, "cpu", {})
    z = np.full(6, 0.7)
    real = s.op.values
    s.op.values = lambda *a, **k: count.__setitem__("H", count["H"] + 1) or real(*a, **k)
    H1, vg1 = s.hessian(z), s.value_and_grad(z)
    before = dict(count)
    H2, vg2 = s.hessian(z.copy()), s.value_and_grad(z.copy())
    assert count == before and vg2[0] == vg1[0]
    # each call hands out a matrix of its own: editing one does not change the next
    assert H2 is not H1 and (H2 != H1).nnz == 0 and np.shares_memory(s.kept_hessian(z).data, s.kept_hessian(z).data)
    dense = torch.func.hessian(rosenbrock)(torch.tensor(z)).numpy()
    np.testing.assert_allclose(H1.toarray(), dense)
    s.hessian(z + 0.1)
    assert count["H"] == before["H"] + 1
    # a hessp with several vectors at one x: one Hessian
    hp = asd.scipy.hessp(rosenbrock, z)
    p, q = np.arange(6.0), np.ones(6)
    np.testing.assert_allclose(hp(z, p), dense @ p)
    np.testing.assert_allclose(hp(z, q), dense @ q)


def test_extra_argument_arrays_are_compared_whole():
    """A cached gradient is reused only for the same extra arguments: two large arrays that differ
    in the middle (which repr abbreviates) are two points."""
    def f(x, w):
        return (w * x ** 2).sum()

    x0, w1 = np.ones(3000), np.ones(3000)
    w2 = w1.copy()
    w2[1500] = 5.0
    g = asd.scipy.grad(f, x0, args=(w1,))
    assert g(x0, w1)[1500] == 2.0 and g(x0, w2)[1500] == 10.0


@pytest.mark.parametrize("method", ["L-BFGS-B", "SLSQP", "Newton-CG", "trust-constr", "trust-krylov", "trust-exact",
                                    "Nelder-Mead"])
def test_minimize_passes_scipys_args_to_every_callable(method):
    def f(x, a):
        return a * ((x[1:] - x[:-1] ** 2) ** 2).sum() + ((1 - x) ** 2).sum()

    x0 = np.full(6, 0.3)
    options = {"maxiter": 20000, "xatol": 1e-10, "fatol": 1e-14} if method == "Nelder-Mead" else {}
    res = minimize(f, x0, args=(10.0,), method=method, tol=1e-12, options=options)
    np.testing.assert_allclose(res.x, np.ones(6), atol=1e-4)


def test_least_squares_passes_scipys_args():
    from asd.solvers import least_squares

    def r(x, a, shift=0.0):
        return torch.cat([a * (x[1:] - x[:-1] ** 2), 1 + shift - x[:-1]])

    res = least_squares(r, np.full(8, -0.5), args=(10.0,), kwargs={"shift": 0.0}, xtol=1e-14, ftol=1e-14, gtol=1e-14)
    np.testing.assert_allclose(res.x, np.ones(8), atol=1e-6)
    dense = torch.autograd.functional.jacobian(lambda z: r(z, 10.0), torch.tensor(res.x))
    np.testing.assert_allclose(res.jac.toarray(), dense.numpy(), atol=1e-12)


# -- prepared operators take numpy input (what SciPy's callbacks pass) -------------------------------

def test_operators_accept_numpy_input():
    def F(x):
        return torch.cat([x[:1] ** 2, x[1:] * x[:-1]]).sin()

    x = np.linspace(0.1, 1.0, 7)
    xt = torch.tensor(x)
    ref = torch.autograd.functional.jacobian(F, xt)
    op = asd.prepare_jacobian(F, x)  # a numpy example input: float64
    assert op.dtype == torch.float64
    torch.testing.assert_close(op(x).to_dense(), ref)
    torch.testing.assert_close(op.values(x.astype(np.float32)), op.values(xt), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(asd.sparse_jacobian(F, x).to_dense(), ref)
    grid = asd.prepare_jacobian(lambda X: F(X.reshape(-1)), xt.reshape(1, 7))
    torch.testing.assert_close(grid(x).to_dense(), ref)  # a flat array of the right size is reshaped
    g = lambda z: (F(z) ** 2).sum()  # noqa: E731
    H = asd.prepare_hessian(g, xt)
    torch.testing.assert_close(H(x).to_dense(), torch.func.hessian(g)(xt))
    value, grad, Hs = H.value_grad_hessian(x)
    torch.testing.assert_close(grad, torch.func.grad(g)(xt))
    torch.testing.assert_close(asd.sparse_hessian(g, x).to_dense(), torch.func.hessian(g)(xt))
    with pytest.raises(asd.InputError, match="shape"):
        op(np.ones(5))


@pytest.mark.parametrize("write", ["numpy", "data"])
def test_a_large_tensor_changed_without_a_version_bump_is_never_served_stale(write):
    """``f`` reads a tensor too large to hash at every callback (100,000 elements); the caller
    changes it through ``.numpy()`` or ``.data``, which bump no version counter. The gradient and
    Hessian at the same x were served from before while ``fun`` saw the change (found by an
    adversarial review): such state is not summarized whole, so nothing is reused."""
    torch.manual_seed(0)
    n = 20
    C = torch.ones(100_000, dtype=torch.float64)

    def f(z):
        return (C[:n - 1] * z[1:] * z[:-1] ** 2).sum() + (z ** 2).sum()

    x = np.random.default_rng(0).standard_normal(n)
    fun, grad, hess = asd.scipy.fun(f), asd.scipy.grad(f, x), asd.scipy.hess(f, x)
    hessp = asd.scipy.hessp(f, x)
    grad(x), hess(x), hessp(x, np.ones(n))
    if write == "numpy":
        C.numpy()[:n] = 3.0
    else:
        C.data[:n] = 3.0
    xt = torch.tensor(x)
    assert fun(x) == pytest.approx(float(f(xt)), rel=1e-14)
    np.testing.assert_allclose(grad(x), torch.func.grad(f)(xt).numpy(), rtol=1e-12, atol=1e-12)
    H = torch.func.hessian(f)(xt).numpy()
    np.testing.assert_allclose(hess(x).toarray(), H, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hessp(x, np.ones(n)), H @ np.ones(n), rtol=1e-12, atol=1e-12)


def test_ipopt_problem_gradient_sees_a_large_tensor_changed_through_numpy():
    from asd.solvers.ipopt import IpoptProblem

    p = torch.ones(100_000, dtype=torch.float64)
    f = lambda x: ((x - p[:3]) ** 2).sum()  # noqa: E731
    P = IpoptProblem(f, None, np.zeros(3))
    x = np.array([0.5, 0.5, 0.5])
    np.testing.assert_allclose(P.gradient(x), [-1.0, -1.0, -1.0])
    p.numpy()[:3] = 3.0  # no version counter moves
    np.testing.assert_allclose(P.gradient(x), [-5.0, -5.0, -5.0])
    assert P.objective(x) == pytest.approx(18.75)


def test_a_coo_tensors_indices_changed_through_numpy_are_seen():
    """The state fingerprint hashed a COO tensor's values but not its indices and called itself
    complete: an edit of the indices through numpy served the old gradient (the final review)."""
    i = torch.tensor([[0, 1, 2], [0, 1, 2]])
    A = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), (3, 3)).coalesce()
    f = lambda z: ((A @ z) ** 2).sum()  # noqa: E731
    grad = asd.scipy.grad(f, np.ones(3))
    x = np.array([1.0, 2.0, 3.0])
    grad(x)
    A._indices().numpy()[1, 2] = 0  # entry (2, 2) moves to (2, 0)
    np.testing.assert_allclose(grad(x), torch.func.grad(f)(torch.tensor(x)).numpy(), rtol=1e-12)
