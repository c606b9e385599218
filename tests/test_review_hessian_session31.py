"""Hessians traced at a point (``local=True``) where a factor or the gradient is zero there, and the
SciPy helpers' cached results.

A local Hessian pattern dropped true nonzeros wherever a factor was zero at the point: the rule of
``x * y`` run through one operand alone took the other (whose sets it was made not to see) for a
constant and cut its rows at its zeros, and ``prod``'s exact first-order sets at the point (an element
next to a zero has a zero derivative, not a zero second derivative) also cut the final pattern down
to the inputs with a nonzero gradient. ``asd.scipy.grad`` / ``hess`` handed out the arrays they keep
for the next call at the same point.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import asd
import asd.scipy as ascipy

_CASES = {
    "x0*x1": lambda x: x[0] * x[1],
    "sin(x1)*x0": lambda x: torch.sin(x[1]) * x[0],
    "prod": lambda x: x[:4].prod(),
    "square_times": lambda x: (x[:8] ** 2 * x[8:]).sum(),
    "torch.square": lambda x: (torch.square(x[:8]) * x[8:]).sum(),
    "abs_times": lambda x: (x[:8].abs() * x[8:]).sum(),
    "relu_times": lambda x: (F.relu(x[:8] + 1) * x[8:]).sum(),
    "sin_times": lambda x: (torch.sin(x[:8]) * x[8:]).sum(),
    "times_element": lambda x: (x[:8] * x[8]).sum(),
    "outer": lambda x: torch.outer(x[:4], x[4:8]).sum(),
    "kron": lambda x: torch.kron(x[:4], x[4:8]).sum(),
    "prod_dim": lambda x: x.reshape(4, 4).prod(1).sum(),
    "matmul": lambda x: (x.reshape(4, 4) @ x.reshape(4, 4)).sum(),
    "mv": lambda x: torch.mv(x[:12].reshape(3, 4), x[12:]).sum(),
    "conv": lambda x: F.conv1d(x[:10].reshape(1, 1, 10), x[10:13].reshape(1, 1, 3)).sum(),
    "constant_between": lambda x: (x * torch.tensor([0.0, 1.0] * 8, dtype=torch.float64) * x.flip(0)).sum(),
}


def _point(seed: int) -> torch.Tensor:
    x = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x[::3] = 0.0  # zero factors
    return x


@pytest.mark.parametrize("name", sorted(_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_a_local_hessian_keeps_the_entries_a_zero_factor_does_not_remove(name, seed):
    f = _CASES[name]
    x = _point(seed)
    dense = torch.func.hessian(f)(x).reshape(16, 16)
    P = asd.hessian_sparsity(f, x, local=True).toarray()
    missing = (dense != 0).numpy() & ~P
    assert not missing.any(), f"local pattern misses {np.argwhere(missing).tolist()}"
    H = asd.sparse_hessian(f, x, local=True, check=False, cache=False).to_dense()
    torch.testing.assert_close(H, dense, rtol=1e-12, atol=1e-12)


def test_two_element_products_at_a_zero_are_exact():
    x = torch.tensor([1.0, 0.0], dtype=torch.float64)
    for f in (_CASES["x0*x1"], _CASES["sin(x1)*x0"], lambda z: z.prod()):
        assert asd.hessian_sparsity(f, x, local=True).toarray()[0, 1]
        torch.testing.assert_close(asd.sparse_hessian(f, x, local=True, check=False, cache=False).to_dense(),
                                   torch.func.hessian(f)(x), rtol=0, atol=0)


def test_a_local_jacobian_still_drops_what_vanishes_at_the_point():
    """First order is exact at the point, as before: d prod / d x_i is zero where another element is."""
    x = torch.tensor([[1.0, 0.0, 2.0], [3.0, 4.0, 5.0]], dtype=torch.float64)
    P = asd.jacobian_sparsity(lambda z: z.prod(1), x, local=True).toarray()
    assert P.tolist() == [[False, True, False, False, False, False], [False, False, False, True, True, True]]
    # a constant zero factor (a dependence absent around the point) is dropped at second order too
    c = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    H = asd.hessian_sparsity(lambda z: (z * c * z).sum(), x[0], local=True).toarray()
    assert not H[0].any() and H[1, 1] and H[2, 2]


def test_scipy_grad_and_hess_hand_out_arrays_of_the_callers_own():
    f = lambda x: (x ** 3).sum() + (x[1:] * x[:-1]).sum()  # noqa: E731
    x = np.array([1.0, 2.0, 3.0])
    g = ascipy.grad(f, x)
    g1 = g(x)
    g1 *= 0
    np.testing.assert_array_equal(g(x), [5.0, 16.0, 29.0])
    H = ascipy.hess(f, x)
    H1 = H(x)
    H1.data[:] = 0
    H1.indices[:] = 0
    np.testing.assert_array_equal(H(x).toarray(), [[6.0, 1.0, 0.0], [1.0, 12.0, 1.0], [0.0, 1.0, 18.0]])
    hp = ascipy.hessp(f, x)
    np.testing.assert_array_equal(hp(x, np.array([1.0, 0.0, 0.0])), [6.0, 1.0, 0.0])
