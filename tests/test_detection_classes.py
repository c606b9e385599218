"""Whole op classes detected exactly: in-place twins of ruled ops, ops whose derivative class
differs on complex tensors (``abs``, ``sgn``, ``angle``), value-dependent ops traced at a point,
second-order classes (piecewise linear norms and running extrema, constant powers, ``det``),
structure-aware linear algebra, and indices computed from the input (a sound union, a warning).

Each test compares the detected pattern with the nonzeros of dense float64 autograd derivatives at
random points (their union over a few points, so accidental zeros do not count).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import asd

from asd.detection import hessian_sparsity, jacobian_sparsity
from asd.detection.table import RULES, inplace_twin
from asd.errors import TracingError, UnsupportedOpWarning

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


# -- local pruning: value-dependent ops traced at a point ----------------------------------------------

def _dense_at(f, x) -> np.ndarray:
    J = torch.autograd.functional.jacobian(f, x)
    return (J.reshape(-1, x.numel()) != 0).numpy()


def _dense_hessian_at(f, x) -> np.ndarray:
    H = torch.func.hessian(lambda z: f(z).sum())(x)
    return (H.reshape(x.numel(), x.numel()) != 0).numpy()


LOCAL = {
    "clamp": lambda x: x.clamp(-0.5, 0.7),
    "clamp_tensor_bounds": lambda x: torch.clamp(x[0], x[1] - 0.5, x[2] + 0.5),
    "clamp_constant_tensor_bounds": lambda x: torch.clamp(x, torch.full_like(x, -0.5), torch.full_like(x, 0.5)),
    "clamp_min_tensor": lambda x: torch.clamp_min(x[0], x[1]),
    "clamp_max_tensor": lambda x: torch.clamp_max(x[0], x[1]),
    "softshrink": lambda x: F.softshrink(x, 0.6),
    "hardshrink": lambda x: F.hardshrink(x, 0.6),
    "relu6": lambda x: F.relu6(3 * x),
    "threshold": lambda x: F.threshold(x, 0.2, -1.0),
    "cummax": lambda x: torch.cummax(x, 1).values,
    "cummin": lambda x: torch.cummin(x, 0).values,
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1),
    "vector_norm_-inf": lambda x: torch.linalg.vector_norm(x, -float("inf"), dim=0),
}


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_local_pruning_is_exact(name):
    f = LOCAL[name]
    for x in _points((3, 6), seed=11):
        P = jacobian_sparsity(f, x, local=True, strict=True)
        assert_exact(P, _dense_at(f, x))
    G = jacobian_sparsity(f, x, strict=True).toarray()
    assert not (dense_jacobian_nonzeros(f, (3, 6), seed=5, k=6) & ~G).any(), "global pattern unsound"


CURVED_WHERE = {  # smooth on part of the domain, linear on the rest
    "elu": F.elu, "celu": lambda x: F.celu(x, 0.7), "selu": F.selu, "hardswish": lambda x: F.hardswish(4 * x),
}


@pytest.mark.parametrize("name", sorted(CURVED_WHERE))
def test_second_order_class_in_the_linear_regime(name):
    """Traced at a point, elu/celu/selu/hardswish interact only where they are curved."""
    f = CURVED_WHERE[name]
    x = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    H = hessian_sparsity(lambda z: f(z).sum(), x, local=True, strict=True)
    dense = _dense_hessian_at(f, x)
    assert 0 < dense.sum() < 12
    assert_exact(H, dense)
    assert hessian_sparsity(lambda z: f(z).sum(), x).nnz == 12  # globally: the diagonal


def test_inplace_mask_ops_are_sound_at_a_point():
    """In-place clamp/hardtanh/relu6/threshold: the mask is read from the written values, which is
    sound (pruning needs the values before the write, which the tracer does not keep)."""
    for f in (lambda x: (x * 1.0).clamp_(-0.5, 0.5), lambda x: F.hardtanh(x * 1.0, inplace=True),
              lambda x: F.relu6(3 * x, inplace=True), lambda x: F.threshold(x * 1.0, 0.2, -1.0, inplace=True),
              lambda x: F.relu(x * 1.0, inplace=True)):
        for x in _points((12,), seed=4):
            P = jacobian_sparsity(f, x, local=True).toarray()
            assert not (_dense_at(f, x) & ~P).any()
    relu_ = lambda x: F.relu(x * 1.0, inplace=True)  # noqa: E731
    x = torch.randn(12, dtype=torch.float64)
    assert_exact(jacobian_sparsity(relu_, x, local=True), _dense_at(relu_, x))


# -- second-order classes ------------------------------------------------------------------------------

ZERO_HESSIAN = {
    "vector_norm_1": lambda x: torch.linalg.vector_norm(x, 1, dim=1),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1),
    "matrix_norm_1": lambda x: torch.linalg.matrix_norm(x, 1).reshape(1),
    "matrix_norm_inf": lambda x: torch.linalg.matrix_norm(x, float("inf")).reshape(1),
    "cummax": lambda x: torch.cummax(x, 1).values,
    "cummin": lambda x: torch.cummin(x, 0).values,
    "pow_1": lambda x: x ** 1,
    "pow_1_inplace": lambda x: (x * 2.0).pow_(1.0),
}


@pytest.mark.parametrize("name", sorted(ZERO_HESSIAN))
def test_piecewise_linear_ops_have_zero_hessians(name):
    f = ZERO_HESSIAN[name]
    shape = (3, 4)
    w = torch.linspace(0.5, 1.5, f(torch.ones(shape, dtype=torch.float64)).numel(), dtype=torch.float64)
    q = lambda z: f(z).reshape(-1) * w  # noqa: E731
    x = torch.randn(shape, dtype=torch.float64)
    assert not dense_hessian_nonzeros(q, shape).any()
    assert hessian_sparsity(lambda z: q(z).sum(), x, strict=True).nnz == 0
    assert not (dense_jacobian_nonzeros(f, shape) & ~jacobian_sparsity(f, x, strict=True).toarray()).any()


def test_power_zero_has_a_zero_jacobian_and_other_powers_interact():
    x = torch.randn(5, dtype=torch.float64)
    assert jacobian_sparsity(lambda z: z ** 0, x, strict=True).nnz == 0
    assert not dense_jacobian_nonzeros(lambda z: z ** 0, (5,)).any()
    for c in (2, 0.5, -1.5):
        f = lambda z: (z.abs() + 1) ** c  # noqa: E731
        assert_exact(hessian_sparsity(lambda z: f(z).sum(), x, strict=True), dense_hessian_nonzeros(f, (5,)))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_det_is_multilinear(n):
    """``det`` is linear in each row and each column: its Hessian pairs entries in distinct rows and
    columns only (no diagonal)."""
    f = lambda z: torch.linalg.det(z).reshape(1)  # noqa: E731
    x = torch.randn(n, n, dtype=torch.float64)
    H = hessian_sparsity(lambda z: f(z).sum(), x, strict=True)
    nz = None
    for z in _points((n, n), seed=1):  # forward-over-reverse det is a known AD gap: reverse twice
        Hd = torch.func.jacrev(torch.func.jacrev(lambda t: torch.linalg.det(t)))(z).reshape(n * n, n * n)
        big = (Hd.abs() > 1e-10 * Hd.abs().max()).numpy()  # above the rounding of det's backward
        nz = big if nz is None else nz | big
    assert_exact(H, nz)


# -- structure-aware linear algebra --------------------------------------------------------------------

def _spd(z):
    n = z.shape[-1]
    return z @ z.mT + n * torch.eye(n, dtype=z.dtype)


def _rounded_dense(f, shape, k=3, seed=0):
    """Nonzeros of the dense Jacobian above the rounding residue of matrix backward formulas."""
    nz = None
    for x in _points(shape, k=k, seed=seed):
        J = torch.autograd.functional.jacobian(f, x).reshape(-1, x.numel())
        z = (J.abs() > 1e-10 * J.abs().max()).numpy()
        nz = z if nz is None else nz | z
    return nz


STRUCTURED = {
    "cholesky": lambda z: torch.linalg.cholesky(_spd(z)),
    "cholesky_upper": lambda z: torch.linalg.cholesky(_spd(z), upper=True),
    "qr_R": lambda z: torch.linalg.qr(z).R,
    "solve_triangular_lower": lambda z: torch.linalg.solve_triangular(z + 5 * torch.eye(5, dtype=z.dtype),
                                                                      z[:, :2], upper=False),
    "solve_triangular_right_upper": lambda z: torch.linalg.solve_triangular(z + 5 * torch.eye(5, dtype=z.dtype),
                                                                            z[:2], upper=True, left=False),
    "triangular_inverse_lower": lambda z: torch.linalg.solve_triangular(z + 5 * torch.eye(5, dtype=z.dtype),
                                                                        torch.eye(5, dtype=z.dtype), upper=False),
    "triangular_inverse_upper_unit": lambda z: torch.linalg.solve_triangular(
        z, torch.eye(5, dtype=z.dtype), upper=True, unitriangular=True),
    "triangular_solve_inverse": lambda z: torch.triangular_solve(torch.eye(5, dtype=z.dtype),
                                                                 z + 5 * torch.eye(5, dtype=z.dtype),
                                                                 upper=False).solution,
    "slogdet": lambda z: torch.stack(torch.linalg.slogdet(z + 5 * torch.eye(5, dtype=z.dtype))),
}


# a constant right-hand side's zeros are read only at a point: a prepared operator may change it
_CONSTANT_ZEROS = {"triangular_inverse_lower", "triangular_inverse_upper_unit", "triangular_solve_inverse"}


@pytest.mark.parametrize("name", sorted(STRUCTURED))
def test_structured_linear_algebra_is_exact(name):
    f = STRUCTURED[name]
    shape = (5, 5)
    x = torch.randn(shape, dtype=torch.float64)
    P = jacobian_sparsity(f, x, strict=True, local=name in _CONSTANT_ZEROS)
    dense = _rounded_dense(f, shape)
    assert_exact(P, dense)
    assert P.nnz < P.shape[0] * P.shape[1]
    if name in _CONSTANT_ZEROS:
        G = jacobian_sparsity(f, x, strict=True)  # globally: sound, the constant's zeros not assumed
        assert not (dense & ~G.toarray().astype(bool)).any() and G.nnz > P.nnz


def test_triangular_solve_pattern_does_not_assume_a_changeable_constant():
    """A prepared operator called with another right-hand side of the same shape stays right."""
    def f(a, B):
        return torch.linalg.solve_triangular(a.reshape(4, 4).tril() + 3 * torch.eye(4, dtype=a.dtype), B, upper=False)

    x = torch.randn(16, dtype=torch.float64)
    B1 = torch.randn(4, 4, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, args=(torch.eye(4, dtype=torch.float64),))
    dense = torch.autograd.functional.jacobian(lambda a: f(a, B1), x).reshape(16, 16)
    torch.testing.assert_close(op(x, B1).to_dense(), dense)


def test_lu_factors_have_zero_triangles():
    """With pivoting the factors' entries read whole columns (the pivots depend on the values), but
    ``L``'s upper and ``U``'s lower triangles are identically zero."""
    x = torch.randn(5, 5, dtype=torch.float64)
    for i, triangle in ((1, np.triu_indices(5, 1)), (2, np.tril_indices(5, -1))):
        f = lambda z: torch.linalg.lu(z)[i]  # noqa: E731
        P = jacobian_sparsity(f, x, strict=True).toarray().reshape(5, 5, 25)
        assert not P[triangle].any()
        assert not (_rounded_dense(f, (5, 5)) & ~P.reshape(25, 25)).any()


def test_slogdet_sign_has_no_dependence():
    P = jacobian_sparsity(lambda z: torch.linalg.slogdet(z)[0].reshape(1), torch.randn(4, 4, dtype=torch.float64))
    assert P.nnz == 0


# -- indices computed from the input: a sound union and a warning ------------------------------------

DATA_DEPENDENT = {
    "index_put_at_argmax": lambda z: z.index_put((torch.arange(4), z.argmax(1)), z[:, 0] * 2),
    "index_put_accumulate": lambda z: z.index_put((z.argmin(0),), z[0] * 1.0, accumulate=True),
    "scatter_at_argmax": lambda z: torch.zeros_like(z).scatter(1, z.argmax(1, keepdim=True), z[:, :1]),
    "scatter_add_at_argmax": lambda z: z.scatter_add(1, z.argmax(1, keepdim=True), z[:, 2:3]),
    "scatter_value_at_argmax": lambda z: z.scatter(1, z.argmax(1, keepdim=True), 0.0),
    "index_add_at_argsort": lambda z: z.index_add(0, z[:, 0].argsort(), z * 0.5),
    "narrow_tensor_start": lambda z: z.narrow(1, z[0].argmax() % 3, 3),
    "gather_argsort": lambda z: z.gather(1, z.argsort(1)[:, :2]),
    "index_at_argmax": lambda z: z[torch.arange(4), z.argmax(1)],
    "index_select_argsort": lambda z: z.index_select(1, z[0].argsort()[:3]),
    "take_argsort": lambda z: z.take(z.reshape(-1).argsort()[:3]),
}


def _union_over_index_values(f, shape):
    """Nonzeros of the dense Jacobian over many points: the indices take many values."""
    return dense_jacobian_nonzeros(f, shape, k=200, seed=3)


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT))
def test_data_dependent_indices_give_a_sound_pattern_and_a_warning(name):
    f = DATA_DEPENDENT[name]
    shape = (4, 5)
    x = torch.randn(shape, dtype=torch.float64)
    with pytest.warns(UnsupportedOpWarning, match="computed from the input"):
        P = jacobian_sparsity(f, x)
    dense = _union_over_index_values(f, shape)
    assert not (dense & ~P.toarray()).any(), "unsound"
    assert P.nnz < P.shape[0] * P.shape[1] or name == "take_argsort"
    assert_exact(jacobian_sparsity(f, x, local=True), _dense_at(f, x) | _local_structure(f, x))


def _local_structure(f, x):
    """The local pattern is that of the indices at ``x``: dense nonzeros at nearby points with the
    same indices (tiny perturbations) cover accidental zeros."""
    nz = _dense_at(f, x)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        nz |= _dense_at(f, x + 1e-9 * torch.randn(x.shape, dtype=x.dtype, generator=g))
    return nz


def test_writing_through_a_narrow_at_an_unknown_start_is_refused():
    def f(z):
        y = z * 1.0
        y.narrow(1, z[0].argmax() % 3, 2).zero_()
        return y

    with pytest.warns(UnsupportedOpWarning), pytest.raises(TracingError, match="narrow"):
        jacobian_sparsity(f, torch.randn(4, 5, dtype=torch.float64))


# -- exact at a point: pivots, extrema, zeros and NaNs, sampling grids --------------------------------

AT_A_POINT = {
    "lu_L": lambda z: torch.linalg.lu(z)[1],
    "lu_U": lambda z: torch.linalg.lu(z)[2],
    "lu_factor": lambda z: torch.linalg.lu_factor(z).LU,
    "lu_factor_wide": lambda z: torch.linalg.lu_factor(z[:, :4].T.contiguous()).LU,
    "cdist_inf": lambda z: torch.cdist(z[:3], z[3:], p=float("inf")),
    "prod_with_zeros": lambda z: torch.where(z.abs() < 0.5, 0.0, z).prod(1),
    "nansum": lambda z: torch.where(z.abs() < 0.3, float("nan"), z).nansum(0),
    "grid_sample_bilinear": lambda z: F.grid_sample(z.reshape(1, 1, 6, 6), GRID, align_corners=False),
    "grid_sample_bicubic_border": lambda z: F.grid_sample(z.reshape(1, 1, 6, 6), GRID, mode="bicubic",
                                                          padding_mode="border", align_corners=True),
}
GRID = torch.rand(1, 3, 4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * 2.4 - 1.2


@pytest.mark.parametrize("name", sorted(AT_A_POINT))
def test_exact_at_a_point(name):
    f = AT_A_POINT[name]
    for x in _points((6, 6), seed=9):
        L = jacobian_sparsity(f, x, local=True, strict=True).toarray()
        J = torch.autograd.functional.jacobian(f, x).reshape(L.shape)
        dense = ((J.abs() > 1e-12 * J.abs().max()) & ~J.isnan()).numpy()
        assert not (dense & ~L).any(), "unsound at the point"
        if name != "nansum":  # NaN entries of the dense reference are unknown
            assert (L == dense).all(), f"not exact: {int((L & ~dense).sum())} extra entries"
        G = jacobian_sparsity(f, x, strict=True).toarray()
        assert not (L & ~G).any() and G.sum() >= L.sum()


def test_cdist_zero_norm_has_no_dependence():
    x = torch.randn(5, 3, dtype=torch.float64)
    assert jacobian_sparsity(lambda z: torch.cdist(z[:2], z[2:], p=0.0), x).nnz == 0


def test_grid_sample_nearest_does_not_depend_on_the_grid():
    img = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    f = lambda g: F.grid_sample(img, g.reshape(1, 2, 2, 2), mode="nearest", align_corners=False)  # noqa: E731
    assert jacobian_sparsity(f, torch.rand(8, dtype=torch.float64)).nnz == 0
    bilinear = lambda g: F.grid_sample(img, g.reshape(1, 2, 2, 2), align_corners=False)  # noqa: E731
    assert_exact(jacobian_sparsity(bilinear, torch.rand(8, dtype=torch.float64)),
                 dense_jacobian_nonzeros(bilinear, (8,)))


@pytest.mark.parametrize("left, transpose", [(True, False), (True, True), (False, False), (False, True)])
def test_ormqr_reads_the_reflectors_it_applies(left, transpose):
    """Only the Householder vectors below the diagonal, and in ``Q^T C`` / ``C Q`` row (column)
    ``t`` reads the reflectors ``0..t`` only."""
    g = torch.Generator().manual_seed(1)
    C = torch.randn(5, 4, dtype=torch.float64, generator=g)
    tau = torch.rand(4, dtype=torch.float64, generator=g) + 0.5
    shape = (5, 4) if left else (4, 4)
    other = C if left else C[:4].T.contiguous()
    f = lambda a: torch.ormqr(a, tau[:a.shape[1]], other, left=left, transpose=transpose)  # noqa: E731
    assert_exact(jacobian_sparsity(f, torch.randn(shape, dtype=torch.float64), strict=True),
                 dense_jacobian_nonzeros(f, shape))


INPLACE_MASKS = {
    "clamp_": lambda z: (z * 1).clamp_(-1, 1),
    "hardtanh_": lambda z: F.hardtanh(z * 1, -0.9, 0.9, inplace=True),
    "relu6_inplace": lambda z: F.relu6(z * 2.5, inplace=True),
    "threshold_": lambda z: F.threshold(z * 1, 0.5, 0.0, inplace=True),
}


@pytest.mark.parametrize("name", sorted(INPLACE_MASKS))
def test_inplace_masks_are_read_before_the_write(name):
    """Traced locally, an in-place op's rule sees the values it overwrote (as its out-of-place
    variant does), so the masks prune exactly; the op still returns the tensor it wrote into."""
    f = INPLACE_MASKS[name]
    x = torch.linspace(-2.05, 2.05, 8, dtype=torch.float64)  # no point on a kink
    P = jacobian_sparsity(f, x, local=True).toarray()
    dense = (torch.autograd.functional.jacobian(f, x) != 0).numpy()
    assert (P == dense).all()
    assert jacobian_sparsity(f, x).nnz == x.numel()  # globally every element may be in the linear zone

    def returns_itself(z):
        w = z * 1
        assert w.clamp_(-1, 1) is w
        return w

    jacobian_sparsity(returns_itself, x, local=True)
