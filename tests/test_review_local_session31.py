"""Tracing at a point that holds a NaN, and the probe where a product is not finite.

PyTorch's derivative formulas zero a derivative where a comparison holds (``x <= 0`` for relu) and
no comparison with a NaN does: the derivative passes there. The local rules kept an element where
the opposite comparison held (``x > 0``), so at a NaN they dropped it; ``max``/``amax`` matched the
selected element by ``==``, which a NaN result never meets; ``prod`` dropped the neighbours of a
zero also where a NaN made their derivative NaN. The probe passed over a product that was not
finite somewhere, so a stale local pattern missing a NaN column passed its check.
"""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import asd
from asd.errors import CheckError

NAN = float("nan")


def _t(*v):
    return torch.tensor(v, dtype=torch.float64)


_JACOBIANS = {
    "relu": (torch.relu, _t(NAN, 1.0, -1.0)),
    "hardtanh": (F.hardtanh, _t(NAN, 0.5, 2.0)),
    "relu6": (F.relu6, _t(NAN, 0.5, 7.0)),
    "hardsigmoid": (F.hardsigmoid, _t(NAN, 0.5, 4.0)),
    "softshrink": (F.softshrink, _t(NAN, 2.0, 0.1)),
    "hardshrink": (F.hardshrink, _t(NAN, 2.0, 0.1)),
    "threshold": (lambda x: F.threshold(x, 0.1, 0.0), _t(NAN, 2.0, 0.0)),
    "hardswish": (F.hardswish, _t(NAN, 1.0, -4.0)),
    "clamp": (lambda x: x.clamp(-1, 1), _t(NAN, 0.5, 2.0)),
    "maximum": (lambda x: torch.maximum(x[:3], x[3:]), _t(NAN, 1.0, NAN, 1.0, NAN, NAN)),
    "minimum": (lambda x: torch.minimum(x[:3], x[3:]), _t(NAN, 1.0, NAN, 1.0, NAN, NAN)),
    "fmax": (lambda x: torch.fmax(x[:4], x[4:]), _t(NAN, 1.0, NAN, 2.0, 1.0, NAN, NAN, 2.0)),
    "fmin": (lambda x: torch.fmin(x[:4], x[4:]), _t(NAN, 1.0, NAN, 2.0, 1.0, NAN, NAN, 2.0)),
    "max": (lambda x: x.max().reshape(1), _t(NAN, 1.0, 2.0)),
    "amax": (lambda x: x.amax().reshape(1), _t(NAN, 1.0, 2.0)),
    "norm_inf": (lambda x: torch.linalg.vector_norm(x.reshape(2, 3), float("inf"), dim=1),
                 _t(NAN, 1.0, 2.0, 3.0, -5.0, 4.0)),
    "prod_zero_nan": (lambda x: x.prod().reshape(1), _t(NAN, 0.0, 2.0)),
    "prod_zero_inf": (lambda x: x.prod().reshape(1), _t(float("inf"), 0.0, 2.0)),
}


def _support(J: torch.Tensor) -> np.ndarray:
    return ((J != 0) | torch.isnan(J)).numpy()


@pytest.mark.parametrize("name", sorted(_JACOBIANS))
def test_a_local_pattern_at_a_nan_keeps_what_either_mode_passes(name):
    f, x = _JACOBIANS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P = asd.jacobian_sparsity(f, x, local=True).toarray()
    for dense in (torch.func.jacrev(f)(x), torch.func.jacfwd(f)(x)):
        missing = _support(dense.reshape(P.shape)) & ~P
        assert not missing.any(), f"missing {np.argwhere(missing).tolist()}"


def test_a_local_hessian_through_maximum_at_a_nan():
    """The pattern only: PyTorch's own Hessian there is not symmetric (H[0, 2] = 2, H[2, 0] = 0),
    so no symmetric matrix equals it. (Nor is a NaN that a formula's 0/0 spreads over a whole
    tensor, such as amax(dim) at a NaN, a dependence: the global pattern leaves it out as well.)"""
    f = lambda x: (torch.maximum(x[:2], x[2:]) ** 2).sum()  # noqa: E731
    x = _t(NAN, 1.0, 2.0, 1.0)
    H = torch.func.hessian(f)(x)
    P = asd.hessian_sparsity(f, x, local=True).toarray()
    assert not (_support(H) & ~P).any()


def test_a_local_prod_still_drops_the_neighbours_of_a_single_zero():
    x = _t(3.0, 0.0, 2.0)
    P = asd.jacobian_sparsity(lambda z: z.prod().reshape(1), x, local=True).toarray()
    assert P.tolist() == [[False, True, False]]


def _relu_sqrt(x):
    return torch.stack([torch.sqrt(torch.relu(x[0]) - 1.0), torch.relu(x[1]), x[2]])


def test_a_stale_local_pattern_missing_a_nan_column_fails_its_check():
    x1 = _t(-1.0, -1.0, 1.0)  # the local pattern here: (2, 2) alone
    x2 = _t(0.5, 1.0, 1.0)  # here d f1 / d x1 = 1 and column 0 is NaN
    op = asd.prepare_jacobian(_relu_sqrt, x1, local=True)
    with pytest.raises(CheckError):
        op(x2)

    def g(x):
        return torch.sqrt(torch.relu(x[0]) - 1.0) + torch.relu(x[1]) ** 3 + x[2] ** 2

    oph = asd.prepare_hessian(g, x1, local=True)
    with pytest.raises(CheckError):
        oph(x2)


def test_a_nan_that_only_the_probe_computes_is_no_evidence():
    """where(x > 0, sqrt(x), 0) at 0: reverse mode's derivative is NaN in column 0 (0 times inf),
    forward mode's is finite; JVP values pass a check whose first product, a VJP, is NaN there."""
    f = lambda x: torch.where(x > 0, torch.sqrt(x), 0.0) * x.roll(1)  # noqa: E731
    x = _t(0.0, 1.0, 4.0, 2.0)
    assert torch.isnan(torch.func.jacrev(f)(x)[:, 0]).all()
    op = asd.prepare_jacobian(f, x, mode="forward", check=True)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    assert op.last_check.ok
