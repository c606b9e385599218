"""One operator suite run over every evaluation backend (the backend protocol of asd.backends).

A new backend is one file in asd/backends plus one entry in JACOBIAN_BACKENDS or HESSIAN_BACKENDS.
Every backend is checked against dense float64 torch.func derivatives at random points, its
compressed products against the coloring's seeds applied to the dense derivative, chunking,
and a clear error when it is given a coloring it cannot evaluate.
"""

import numpy as np
import pytest
import torch

import asd
from asd.backends import (Bidirectional, ForwardJVP, ForwardOverReverseHVP, FusedGather, ReverseOverForwardHVP,
                          ReverseVJP, default_backend)
from asd.coloring import AcyclicColoring, BiColoring, ColumnColoring, RowColoring, StarColoring
from asd.errors import InputError

JACOBIAN_BACKENDS = {
    "jvp": ("column", ForwardJVP()),
    "jvp+gather": ("column", FusedGather(ForwardJVP())),
    "vjp": ("row", ReverseVJP()),
    "vjp+gather": ("row", FusedGather(ReverseVJP())),
    "bidirectional": ("bidirectional", Bidirectional()),
}
HESSIAN_BACKENDS = {
    "fwd-over-rev/star": ("star", ForwardOverReverseHVP()),
    "fwd-over-rev/star+gather": ("star", FusedGather(ForwardOverReverseHVP())),
    "rev-over-fwd/star": ("star", ReverseOverForwardHVP()),
    "fwd-over-rev/acyclic": ("acyclic", ForwardOverReverseHVP()),
    "rev-over-fwd/acyclic": ("acyclic", ReverseOverForwardHVP()),
}


def jac_f(x):
    # a stencil, one dense output row and one dense input column: every coloring has work to do
    y = x[1:] * x[:-1] + torch.sin(x[1:])
    return torch.cat([y, x.sum(0, keepdim=True) ** 2, x[:1] * x[2:]])


def hess_f(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum() + x[0] * x[::3].sum() + torch.exp(x).prod()


def _points(n, k=2):
    g = torch.Generator().manual_seed(n)
    return [torch.rand(n, dtype=torch.float64, generator=g) * 0.5 for _ in range(k)]


@pytest.mark.parametrize("name", list(JACOBIAN_BACKENDS))
@pytest.mark.parametrize("batch_size", [None, 2])
def test_jacobian_backend(name, batch_size):
    coloring, backend = JACOBIAN_BACKENDS[name]
    if isinstance(backend, FusedGather) and batch_size is not None:
        pytest.skip("the fused gather evaluates all colors in one batch by construction")
    x0 = _points(9, 1)[0]
    op = asd.prepare_jacobian(jac_f, x0, coloring=coloring, backend=backend, batch_size=batch_size)
    assert op.backend is backend
    for x in _points(9):
        dense = torch.func.jacrev(jac_f)(x)
        J = op(x)
        assert J.layout == torch.sparse_csr and J.dtype == x.dtype
        torch.testing.assert_close(J.to_dense(), dense, rtol=1e-12, atol=1e-12)
        # the compressed products are the seeds applied to the dense Jacobian
        vals = dense.numpy()[op.pattern.rows, op.pattern.indices]
        np.testing.assert_allclose(op.compressed(x).numpy(), op.coloring.compress(vals), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(HESSIAN_BACKENDS))
@pytest.mark.parametrize("batch_size", [None, 1])
def test_hessian_backend(name, batch_size):
    coloring, backend = HESSIAN_BACKENDS[name]
    if isinstance(backend, FusedGather) and batch_size is not None:
        pytest.skip("the fused gather evaluates all colors in one batch by construction")
    x0 = _points(10, 1)[0]
    op = asd.prepare_hessian(hess_f, x0, coloring=coloring, backend=backend, batch_size=batch_size)
    assert isinstance(op.coloring, StarColoring if coloring == "star" else AcyclicColoring)
    for x in _points(10):
        dense = torch.func.hessian(hess_f)(x)
        torch.testing.assert_close(op(x).to_dense(), dense, rtol=1e-10, atol=1e-10)
        vals = dense.numpy()[op.pattern.rows, op.pattern.indices]
        np.testing.assert_allclose(op.compressed(x).numpy(), op.coloring.compress(vals), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("coloring, backend", [
    ("column", ReverseVJP()), ("row", ForwardJVP()), ("column", Bidirectional()),
    ("bidirectional", ForwardJVP()), ("bidirectional", FusedGather(ForwardJVP())),
])
def test_backend_refuses_a_coloring_it_cannot_evaluate(coloring, backend):
    with pytest.raises(InputError):
        asd.prepare_jacobian(jac_f, _points(9, 1)[0], coloring=coloring, backend=backend)


def test_acyclic_cannot_be_fused():
    with pytest.raises(InputError, match="direct"):
        asd.prepare_hessian(hess_f, _points(10, 1)[0], coloring="acyclic",
                            backend=FusedGather(ForwardOverReverseHVP()))


@pytest.mark.parametrize("cls, expected", [
    (ColumnColoring, FusedGather), (RowColoring, FusedGather), (BiColoring, Bidirectional),
    (StarColoring, FusedGather), (AcyclicColoring, ForwardOverReverseHVP),
])
def test_default_backend_dispatches_on_the_coloring_class(cls, expected):
    x = _points(10, 1)[0]
    if cls in (StarColoring, AcyclicColoring):
        op = asd.prepare_hessian(hess_f, x, coloring=cls.problem)
    else:
        op = asd.prepare_jacobian(jac_f, x, coloring=cls.problem)
    assert isinstance(op.coloring, cls)
    assert isinstance(default_backend(op.coloring), expected)
    # with chunks, the gather cannot be fused into one batch
    assert not isinstance(default_backend(op.coloring, batch_size=1), FusedGather) or op.ncolors <= 1
