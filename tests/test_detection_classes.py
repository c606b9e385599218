"""Whole op classes detected exactly: in-place twins of ruled ops, and ops whose derivative class
differs on complex tensors (``abs``, ``sgn``, ``angle``).

Each test compares the detected pattern with the nonzeros of dense float64 autograd derivatives at
random points (their union over a few points, so accidental zeros do not count).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asd.detection import hessian_sparsity, jacobian_sparsity
from asd.detection.table import RULES, inplace_twin

aten = torch.ops.aten


def _points(shape, k=3, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    for _ in range(k):
        x = torch.randn(shape, dtype=torch.float64, generator=g)
        yield x.abs() + 0.5 if positive else x


def dense_jacobian_nonzeros(f, shape, **kw) -> np.ndarray:
    nz = None
    for x in _points(shape, **kw):
        J = torch.autograd.functional.jacobian(f, x).reshape(-1, x.numel())
        z = (J != 0).numpy()
        nz = z if nz is None else nz | z
    return nz


def dense_hessian_nonzeros(f, shape, **kw) -> np.ndarray:
    nz = None
    for x in _points(shape, **kw):
        H = torch.autograd.functional.hessian(lambda z: f(z).sum(), x).reshape(x.numel(), x.numel())
        z = (H != 0).numpy()
        nz = z if nz is None else nz | z
    return nz


def assert_exact(pattern, dense: np.ndarray):
    P = pattern.toarray().astype(bool)
    assert P.shape == dense.shape
    assert not (dense & ~P).any(), "unsound: the pattern misses a nonzero of the dense derivative"
    assert (P == dense).all(), f"not exact: {int((P & ~dense).sum())} extra entries"


# -- in-place twins -----------------------------------------------------------------------------------

def test_every_rule_covers_its_inplace_variant():
    """Every registered overload whose in-place variant exists has that variant registered, with
    the same rule and second-order class."""
    missing = []
    for op, rule in RULES.items():
        twin = inplace_twin(op)
        if twin is None:
            continue
        if twin not in RULES:
            missing.append(str(twin))
    assert not missing, f"in-place variants without a rule: {missing}"
    assert RULES[aten.elu_.default].family == RULES[aten.elu.default].family
    assert RULES[aten.addmm_.default].second_order == RULES[aten.addmm.default].second_order
    assert RULES[aten.xlogy_.Tensor].pairs == RULES[aten.xlogy.Tensor].pairs


def test_inplace_twin_requires_the_same_arguments():
    assert inplace_twin(aten.elu.default) is aten.elu_.default
    assert inplace_twin(aten.elu_.default) is None  # already in place
    assert inplace_twin(aten.mm.default) is None  # no mm_


UNARY_INPLACE = {
    "elu": lambda x: F.elu(x - 4.0, inplace=True),  # the exponential regime
    "celu": lambda x: F.celu(x - 4.0, inplace=True),  # the exponential regime
    "selu": lambda x: F.selu(x - 4.0, inplace=True),  # the exponential regime
    "silu": lambda x: F.silu(x.clone(), inplace=True),
    "mish": lambda x: F.mish(x.clone(), inplace=True),
    "log1p_": lambda x: x.abs().log1p_(),
    "expm1_": lambda x: x.clone().expm1_(),
    "atan_": lambda x: x.clone().atan_(),
    "tan_": lambda x: x.clone().tan_(),
    "sinh_": lambda x: x.clone().sinh_(),
    "erf_": lambda x: x.clone().erf_(),
    "lgamma_": lambda x: (x.abs() + 0.5).lgamma_(),
    "xlogy_": lambda x: x.clone().xlogy_(x.abs() + 1.0),
}


@pytest.mark.parametrize("name", sorted(UNARY_INPLACE))
def test_inplace_elementwise_is_exact(name):
    f = UNARY_INPLACE[name]
    shape = (5, 8)
    x = torch.randn(shape, dtype=torch.float64)
    assert_exact(jacobian_sparsity(f, x, strict=True), dense_jacobian_nonzeros(f, shape))
    assert_exact(hessian_sparsity(lambda z: f(z).sum(), x, strict=True), dense_hessian_nonzeros(f, shape))


def test_inplace_elu_is_diagonal_not_dense():
    """The case of the issue: ``F.elu(x, inplace=True)`` gave a dense 40 x 40 pattern."""
    P = jacobian_sparsity(lambda x: F.elu(x * 1.0, inplace=True), torch.randn(40, dtype=torch.float64))
    assert P.nnz == 40


def test_inplace_remainder_is_exact():
    f = lambda x: (3.0 * x).remainder_(0.7)  # noqa: E731
    shape = (12,)
    x = torch.randn(shape, dtype=torch.float64)
    assert_exact(jacobian_sparsity(f, x, strict=True), dense_jacobian_nonzeros(f, shape))
    H = hessian_sparsity(lambda z: f(z).sum(), x, strict=True)
    assert H.nnz == 0 and not dense_hessian_nonzeros(f, shape).any()


def test_inplace_matrix_products_are_exact():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(4, 3, dtype=torch.float64, generator=g)
    B = torch.randn(2, 4, 5, dtype=torch.float64, generator=g)

    def addmm_(x):  # x: (3, 5), the bias from its first row
        return x[:1].repeat(4, 1).addmm_(A, x)

    def baddbmm_(x):  # x: (2, 3, 4)
        return x.new_zeros(2, 3, 5).baddbmm_(x, B) + 0.0

    for f, shape in ((addmm_, (3, 5)), (baddbmm_, (2, 3, 4))):
        x = torch.randn(shape, dtype=torch.float64)
        assert_exact(jacobian_sparsity(f, x, strict=True), dense_jacobian_nonzeros(f, shape))
        # a product with itself: x @ (A^T-like) cross terms, exact second order
        q = lambda z: (f(z) * f(z))  # noqa: E731
        assert_exact(hessian_sparsity(lambda z: q(z).sum(), x, strict=True), dense_hessian_nonzeros(q, shape))


# -- complex-aware rules ------------------------------------------------------------------------------

def _as_complex(x):
    return torch.view_as_complex(x.reshape(-1, 2))


COMPLEX = {
    "abs": lambda x: _as_complex(x).abs(),
    "sgn": lambda x: torch.view_as_real(_as_complex(x).sgn()).reshape(-1),
    "sgn_": lambda x: torch.view_as_real(_as_complex(x * 1.0).sgn_()).reshape(-1),
    "angle": lambda x: _as_complex(x).angle(),
    "abs_of_product": lambda x: (_as_complex(x)[:-1] * _as_complex(x)[1:]).abs(),
    "conj_physical": lambda x: torch.view_as_real(_as_complex(x).conj_physical() * (1 + 2j)).reshape(-1),
}


@pytest.mark.parametrize("name", sorted(COMPLEX))
def test_complex_ops_are_exact_against_real_pairs(name):
    """Complex ops through ``view_as_complex``/``view_as_real``: exact Jacobian and Hessian."""
    f = COMPLEX[name]
    shape = (12,)
    x = torch.randn(shape, dtype=torch.float64)
    assert_exact(jacobian_sparsity(f, x, strict=True), dense_jacobian_nonzeros(f, shape))
    w = torch.linspace(0.5, 1.5, f(x).numel(), dtype=torch.float64)
    q = lambda z: f(z) * w  # noqa: E731
    assert_exact(hessian_sparsity(lambda z: q(z).sum(), x, strict=True), dense_hessian_nonzeros(q, shape))


def test_abs_of_rfft_has_a_nonzero_hessian():
    """The case of the issue: ``rfft(x).abs().sum()`` had an empty Hessian pattern."""
    f = lambda x: torch.fft.rfft(x).abs()  # noqa: E731
    x = torch.randn(8, dtype=torch.float64)
    H = hessian_sparsity(lambda z: f(z).sum(), x)
    dense = dense_hessian_nonzeros(f, (8,))
    assert dense.any()
    assert_exact(H, dense)


def test_real_phase_ops_have_zero_derivatives():
    """On real tensors ``sgn`` and ``angle`` are piecewise constant, ``abs`` piecewise linear."""
    x = torch.randn(6, dtype=torch.float64)
    assert jacobian_sparsity(torch.sgn, x).nnz == 0
    assert jacobian_sparsity(torch.angle, x).nnz == 0
    assert jacobian_sparsity(torch.abs, x).nnz == 6
    assert hessian_sparsity(lambda z: z.abs().sum(), x).nnz == 0
    assert hessian_sparsity(lambda z: (z * 1.0).abs_().sum(), x).nnz == 0
