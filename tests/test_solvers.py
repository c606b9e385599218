"""Solver hookups: Newton, SciPy least_squares/minimize, IPOPT (when cyipopt is installed)."""

import warnings

import numpy as np
import pytest
import torch

import asd
from asd.problems import brusselator, rosenbrock
from asd.solvers import least_squares, minimize, newton


def test_newton_brusselator_steady_state():
    N = 6
    f = brusselator(N)
    x0 = torch.cat([torch.full((N * N,), 1.2), torch.full((N * N,), 3.0)]).double()
    res = newton(f, x0, tol=1e-10)
    assert res.converged and res.iterations <= 10
    torch.testing.assert_close(res.x[: N * N], torch.ones(N * N, dtype=torch.float64))
    torch.testing.assert_close(res.x[N * N:], torch.full((N * N,), 3.4, dtype=torch.float64))
    assert res.history[-1] <= 1e-10 < res.history[0]


def test_newton_reports_non_convergence():
    f = brusselator(4)
    x0 = torch.rand(32, dtype=torch.float64)
    with pytest.warns(asd.ConvergenceWarning, match="stopped after 1 iterations"):
        res = newton(f, x0, maxiter=1, tol=1e-14)
    assert not res.converged and res.iterations == 1


def test_newton_rejects_non_square():
    with pytest.raises(asd.InputError, match="square"):
        newton(lambda v: v[:2] ** 2, torch.ones(3, dtype=torch.float64))


def test_least_squares_rosenbrock_residuals():
    def residuals(x):
        return torch.cat([10 * (x[1:] - x[:-1] ** 2), 1 - x[:-1]])

    res = least_squares(residuals, np.full(20, -0.5), xtol=1e-14, ftol=1e-14, gtol=1e-14)
    assert res.success
    np.testing.assert_allclose(res.x, np.ones(20), atol=1e-6)
    assert res.jac.nnz == 3 * 19  # the sparse Jacobian went to SciPy


@pytest.mark.parametrize("method", ["trust-constr", "Newton-CG"])
def test_minimize_rosenbrock(method):
    res = minimize(rosenbrock, np.full(30, 0.5), method=method, tol=1e-12, options={"maxiter": 500})
    np.testing.assert_allclose(res.x, np.ones(30), atol=1e-4)


def test_ipopt_constrained_problem():
    pytest.importorskip("cyipopt", reason="cyipopt is an optional extra (pip install cyipopt-wheels)")
    from asd.solvers.ipopt import IpoptProblem

    # minimize sum (x_i - 1)^2 + x_i x_{i+1} subject to x_i^2 + x_{i+1}^2 = 1 for even i
    n = 10

    def f(x):
        return ((x - 1) ** 2).sum() + (x[1:] * x[:-1]).sum()

    def c(x):
        return x[0::2] ** 2 + x[1::2] ** 2

    x0 = np.full(n, 0.7)
    prob = IpoptProblem(f, c, x0)
    # derivative structures are exact against dense autograd
    J = torch.autograd.functional.jacobian(c, torch.tensor(x0))
    rows, cols = prob.jacobianstructure()
    np.testing.assert_allclose(prob.jacobian(x0), J.numpy()[rows, cols])
    lam = np.arange(1.0, n // 2 + 1)
    Hd = torch.autograd.functional.hessian(lambda v: 2.0 * f(v) + (torch.tensor(lam) * c(v)).sum(), torch.tensor(x0))
    hr, hc = prob.hessianstructure()
    assert (hr >= hc).all()
    np.testing.assert_allclose(prob.hessian(x0, lam, 2.0), Hd.numpy()[hr, hc])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, info = prob.solve(x0, cl=np.ones(n // 2), cu=np.ones(n // 2), print_level=0, tol=1e-10)
    assert info["status"] == 0
    np.testing.assert_allclose(c(torch.tensor(x)).numpy(), 1.0, atol=1e-8)


def test_ipopt_options_per_operator_and_bounds_only():
    pytest.importorskip("cyipopt", reason="cyipopt is an optional extra (pip install cyipopt-wheels)")
    from asd.solvers.ipopt import IpoptProblem

    def f(x):
        return ((x - 2) ** 2).sum() + (x[1:] * x[:-1]).sum() * 0.1

    def c(x):
        return x[0::2] ** 2 + x[1::2] ** 2

    x0 = np.full(8, 0.5)
    prob = IpoptProblem(f, c, x0, mode="reverse", hvp="reverse_over_forward",
                        jacobian_options={"coloring": "bidirectional"}, hessian_options={"coloring": "acyclic"})
    assert prob.jac.mode == "bidirectional" and prob.hess.hvp == "reverse_over_forward"
    assert prob.hess.coloring.problem == "acyclic"
    with pytest.raises(asd.InputError, match="jacobian_options"):
        IpoptProblem(f, c, x0, coloring="star")
    # bounds only: the unconstrained optimum clipped to the box
    prob = IpoptProblem(f, None, x0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, info = prob.solve(x0, lb=np.full(8, -1.0), ub=np.full(8, 1.5), print_level=0, tol=1e-10)
    assert info["status"] == 0
    grad = torch.func.grad(f)(torch.tensor(x)).numpy()
    free = (x > -1 + 1e-6) & (x < 1.5 - 1e-6)
    np.testing.assert_allclose(grad[free], 0, atol=1e-6)


def test_ipopt_cartpole_small():
    pytest.importorskip("cyipopt", reason="cyipopt is an optional extra (pip install cyipopt-wheels)")
    from asd.problems import cartpole
    from asd.solvers.ipopt import IpoptProblem

    f, c, x0, lb, ub = cartpole(40)
    prob = IpoptProblem(f, c, x0)
    x0t = torch.tensor(x0)
    lam = np.linspace(-1, 1, prob.m)
    H = torch.autograd.functional.hessian(lambda v: 0.5 * f(v) + (torch.tensor(lam) * c(v)).sum(), x0t).numpy()
    hr, hc = prob.hessianstructure()
    np.testing.assert_allclose(prob.hessian(x0, lam, 0.5), H[hr, hc], atol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, info = prob.solve(x0, lb=lb, ub=ub, print_level=0, tol=1e-8)
    assert info["status"] == 0
    np.testing.assert_allclose(np.abs(c(torch.tensor(x)).numpy()).max(), 0, atol=1e-7)


def test_newton_accepts_numpy_and_lists():
    f = lambda x: torch.cat([x[:1] - 2, x[1:] - 0.5 * x[:-1] ** 2])  # noqa: E731
    for x0 in (np.ones(5), [1.0] * 5):
        res = newton(f, x0)
        assert res.converged and res.status == "converged" and res.x.dtype == torch.float64
        np.testing.assert_allclose(f(res.x).numpy(), 0, atol=1e-10)


def test_newton_default_tolerance_follows_the_dtype():
    f = lambda x: x ** 3 - 8  # noqa: E731
    res = newton(f, torch.full((4,), 3.0, dtype=torch.float32))
    assert res.converged and res.tol > 1e-8
    torch.testing.assert_close(res.x, torch.full((4,), 2.0))


def test_newton_without_a_solution_stops_early():
    f = lambda x: x ** 2 + 1  # noqa: E731 - no real root: |f| is smallest where the Jacobian is singular
    with pytest.warns(asd.ConvergenceWarning):
        res = newton(f, torch.full((3,), 0.5, dtype=torch.float64), maxiter=50)
    assert not res.converged and res.status in ("stagnated", "singular") and res.iterations < 50


def test_newton_unreachable_tolerance_in_float32_stops():
    f = lambda x: x ** 3 - 7  # noqa: E731 - the root is not a float32 number: |f| cannot reach 1e-12
    with pytest.warns(asd.ConvergenceWarning, match="below what torch.float32 can reach"):
        res = newton(f, torch.full((4,), 3.0, dtype=torch.float32), tol=1e-12, maxiter=40)
    assert res.status == "stagnated" and res.iterations < 40


def test_newton_from_a_point_where_f_is_not_finite_reports_divergence():
    with pytest.warns(asd.ConvergenceWarning, match="f\\(x0\\) is not finite"):
        res = newton(torch.log, torch.full((3,), -1.0, dtype=torch.float64))
    assert res.status == "diverged" and res.iterations == 0 and not res.converged


def test_newton_undamped_step_to_an_overflow_reports_divergence():
    f = lambda x: torch.exp(x) - 1  # noqa: E731 - from x0 = -30 the full Newton step lands near e^30
    with pytest.warns(asd.ConvergenceWarning, match="no longer finite"):
        res = newton(f, torch.full((2,), -30.0, dtype=torch.float64), damping=False)
    assert res.status == "diverged" and res.iterations == 1
    res = newton(f, torch.full((2,), -8.0, dtype=torch.float64))  # damped, the step is halved: converges to 0
    assert res.converged
    torch.testing.assert_close(res.x, torch.zeros(2, dtype=torch.float64), atol=1e-10, rtol=0)


def test_newton_undamped_runaway_reports_divergence_early():
    """Undamped Newton on the cube root doubles |x| (with a sign flip) at every step: the residual
    climbs forever without overflowing; the iteration stops once it has climbed DIVERGING_FACTOR
    times above its start, long before maxiter."""
    from asd.solvers.newton import DIVERGING_FACTOR

    f = lambda x: torch.sign(x) * x.abs() ** (1.0 / 3.0)  # noqa: E731
    with pytest.warns(asd.ConvergenceWarning, match="grew at each of the last"):
        res = newton(f, torch.full((3,), 0.5, dtype=torch.float64), damping=False, maxiter=500)
    assert res.status == "diverged" and res.iterations < 100 and not res.converged
    assert all(b > a for a, b in zip(res.history, res.history[1:]))
    assert res.history[-1] > DIVERGING_FACTOR * res.history[0] > res.history[-2]
    damped = newton(f, torch.full((3,), 0.5, dtype=torch.float64), maxiter=200)  # halved steps reach the root
    assert damped.converged and float(damped.x.abs().max()) < 1e-20
