"""Newton's default convergence test also takes the Newton step at the final point: a residual
that is small only because ``f``'s values are small for its units is not a root (session 37: a
``1e-12``-scaled system was reported converged at ``x0`` after 0 iterations)."""

from __future__ import annotations

import pytest
import torch

from asd.errors import ConvergenceWarning
from asd.solvers import newton


def _cubes(scale):
    def f(x):
        return scale * (x ** 3 - torch.arange(1.0, x.numel() + 1, dtype=x.dtype))
    return f


@pytest.mark.parametrize("scale", [1.0, 1e-12, 1e-30, 1e12])
def test_a_scaled_system_is_solved_not_accepted_at_x0(scale):
    x0 = torch.full((5,), 3.0, dtype=torch.float64)
    res = newton(_cubes(scale), x0)
    root = torch.arange(1.0, 6.0, dtype=torch.float64) ** (1 / 3)
    assert res.converged and res.status == "converged" and res.iterations > 0
    torch.testing.assert_close(res.x, root, rtol=1e-10, atol=0)


def test_an_explicit_tol_keeps_the_residual_test_alone():
    # the documented rule of an explicit tol: ||f(x)||_inf <= tol, here already at x0
    x0 = torch.full((5,), 3.0, dtype=torch.float64)
    res = newton(_cubes(1e-12), x0, tol=1e-9)
    assert res.converged and res.iterations == 0


def test_a_root_at_x0_is_accepted_without_a_step():
    x0 = torch.arange(1.0, 6.0, dtype=torch.float64) ** (1 / 3)
    res = newton(_cubes(1.0), x0)
    assert res.converged and res.iterations <= 1


def test_a_double_root_at_x0_with_a_singular_jacobian_is_accepted():
    res = newton(lambda x: x ** 2, torch.zeros(3, dtype=torch.float64))
    assert res.converged and res.iterations == 0


def test_a_root_at_zero_is_reached():
    res = newton(lambda x: x + x ** 2, torch.ones(4, dtype=torch.float64))
    assert res.converged and float(res.x.abs().max()) < 1e-10


def test_maxiter_zero_judges_x0_by_both_tests():
    x0 = torch.full((5,), 3.0, dtype=torch.float64)
    with pytest.warns(ConvergenceWarning):
        res = newton(_cubes(1e-12), x0, maxiter=0)
    assert not res.converged and res.status == "maxiter" and res.iterations == 0
