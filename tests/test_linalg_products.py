"""asd.linalg.matmul / sampled_matmul against dense float64 references."""

import pytest
import torch

from asd.errors import InputError
from asd.linalg import matmul, sampled_matmul, with_values
from asd.linalg._testing import (assert_pattern_equal, check_sparse_grad, random_sparse,
                                 stored_values)

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]

LAYOUTS = [torch.sparse_csr, torch.sparse_coo]
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-4)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rhs", [(), (3,)])
def test_spmm_matches_dense(layout, dtype, rhs):
    S, D = random_sparse(7, 5, layout=layout, dtype=dtype, seed=1)
    x = torch.randn((5,) + rhs, dtype=dtype, requires_grad=True)
    y = matmul(S, x)
    Dd = D.clone().requires_grad_()
    xd = x.detach().clone().requires_grad_()
    yd = Dd @ xd
    torch.testing.assert_close(y, yd, **TOL[dtype])
    w = torch.randn_like(yd)
    (y * w).sum().backward()
    (yd * w).sum().backward()
    check_sparse_grad(S, Dd.grad, **TOL[dtype])
    torch.testing.assert_close(x.grad, xd.grad, **TOL[dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dense_times_sparse(layout):
    S, D = random_sparse(6, 4, layout=layout, seed=2)
    X = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    y = matmul(X, S)
    torch.testing.assert_close(y, X @ D)
    y.pow(2).sum().backward()
    Dd = D.clone().requires_grad_()
    (X.detach() @ Dd).pow(2).sum().backward()
    check_sparse_grad(S, Dd.grad)
    v = torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(matmul(v, S.detach()), v @ D)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rhs", [(), (2,)])
def test_batched_spmm(layout, rhs):
    S, D = random_sparse(5, 4, layout=layout, batch=3, seed=3)
    x = torch.randn((3, 4) + rhs, dtype=torch.float64, requires_grad=True)
    y = matmul(S, x)
    Dd = D.clone().requires_grad_()
    yd = (Dd @ x.detach().unsqueeze(-1)).squeeze(-1) if not rhs else Dd @ x.detach()
    torch.testing.assert_close(y, yd)
    y.sum().backward()
    yd.sum().backward()
    check_sparse_grad(S, Dd.grad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_spspmm(layout):
    A, DA = random_sparse(6, 5, layout=layout, seed=4)
    B, DB = random_sparse(5, 7, layout=layout, seed=5)
    C = matmul(A, B)
    assert C.layout == layout
    torch.testing.assert_close(C.to_dense(), DA @ DB)
    W = torch.randn(6, 7, dtype=torch.float64)
    (C.to_dense() * W).sum().backward()
    DAd, DBd = DA.clone().requires_grad_(), DB.clone().requires_grad_()
    (DAd @ DBd * W).sum().backward()
    check_sparse_grad(A, DAd.grad)
    check_sparse_grad(B, DBd.grad)


def test_spspmm_batched_coo():
    A, DA = random_sparse(4, 3, layout=torch.sparse_coo, batch=2, seed=6)
    B, DB = random_sparse(3, 5, layout=torch.sparse_coo, batch=2, seed=7)
    C = matmul(A, B)
    torch.testing.assert_close(C.to_dense(), DA @ DB)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sampled_matmul(layout):
    S, _ = random_sparse(6, 5, layout=layout, seed=8, requires_grad=False)
    U = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    V = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    R = sampled_matmul(U, V, S)
    assert_pattern_equal(R, S)
    mask = S.to_dense() != 0
    torch.testing.assert_close(R.to_dense(), (U @ V).detach() * mask)
    W = torch.randn(6, 5, dtype=torch.float64)
    (R.to_dense() * W).sum().backward()
    Ud, Vd = U.detach().clone().requires_grad_(), V.detach().clone().requires_grad_()
    ((Ud @ Vd) * mask * W).sum().backward()
    torch.testing.assert_close(U.grad, Ud.grad)
    torch.testing.assert_close(V.grad, Vd.grad)


def test_sampled_matmul_batched():
    S, _ = random_sparse(4, 5, layout=torch.sparse_coo, batch=2, seed=9, requires_grad=False)
    U = torch.randn(2, 4, 3, dtype=torch.float64)
    V = torch.randn(2, 3, 5, dtype=torch.float64)
    R = sampled_matmul(U, V, S)
    torch.testing.assert_close(R.to_dense(), (U @ V) * (S.to_dense() != 0))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck_and_double_backward(layout):
    S, _ = random_sparse(5, 4, layout=layout, seed=10, requires_grad=False)
    v = stored_values(S).clone().requires_grad_()
    x = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    f = lambda v, x: matmul(with_values(S, v), x)  # noqa: E731
    assert torch.autograd.gradcheck(f, (v, x))
    assert torch.autograd.gradgradcheck(f, (v, x))
    U = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    V = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    g = lambda U, V: sampled_matmul(U, V, S).to_dense()  # noqa: E731
    assert torch.autograd.gradgradcheck(g, (U, V))


def test_spspmm_gradcheck():
    A, _ = random_sparse(4, 3, seed=11, requires_grad=False)
    B, _ = random_sparse(3, 4, seed=12, requires_grad=False)
    a = stored_values(A).clone().requires_grad_()
    b = stored_values(B).clone().requires_grad_()
    f = lambda a, b: matmul(with_values(A, a), with_values(B, b)).to_dense()  # noqa: E731
    assert torch.autograd.gradcheck(f, (a, b))
    assert torch.autograd.gradgradcheck(f, (a, b))


def test_gradient_reaches_values_parameter():
    # a model holding a dense parameter of stored values and a fixed structure
    S, D = random_sparse(6, 6, seed=13, requires_grad=False)
    p = stored_values(S).clone().requires_grad_()
    A = torch.sparse_csr_tensor(S.crow_indices(), S.col_indices(), p, S.shape)
    x = torch.randn(6, dtype=torch.float64)
    matmul(A, x).sum().backward()
    Dd = D.clone().requires_grad_()
    (Dd @ x).sum().backward()
    torch.testing.assert_close(p.grad, Dd.grad[D != 0])


def test_uncoalesced_coo():
    i = torch.tensor([[0, 1, 0], [1, 0, 1]])
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    S = torch.sparse_coo_tensor(i, v, (2, 2)).requires_grad_()
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    y = matmul(S, x)
    torch.testing.assert_close(y, torch.tensor([4.0 * 2, 2.0], dtype=torch.float64))
    y.sum().backward()
    g = S.grad.coalesce()
    torch.testing.assert_close(g.to_dense(), torch.tensor([[0.0, 2.0], [1.0, 0.0]], dtype=torch.float64))


def test_bad_inputs():
    S, _ = random_sparse(4, 3, requires_grad=False)
    with pytest.raises(InputError, match="shape"):
        matmul(S, torch.randn(4, dtype=torch.float64))
    with pytest.raises(InputError, match="at least one"):
        matmul(torch.randn(2, 2), torch.randn(2, 2))
    with pytest.raises(InputError, match="dtype"):
        matmul(S, torch.randn(3, dtype=torch.float32))
    with pytest.raises(InputError, match="device"):
        matmul(S, torch.randn(3, dtype=torch.float64, device="meta"))
    B, _ = random_sparse(4, 4, requires_grad=False)
    with pytest.raises(InputError, match="shape mismatch"):
        matmul(S, B)
    with pytest.raises(InputError, match="shape mismatch"):
        sampled_matmul(torch.randn(4, 2, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64), S)
