"""asd.linalg.add and triangular_solve against dense float64 references."""

import pytest
import torch

from asd.errors import InputError
from asd.linalg import add, triangular_solve, with_values
from asd.linalg._testing import check_sparse_grad, random_sparse, stored_values

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]
LAYOUTS = [torch.sparse_csr, torch.sparse_coo]
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-4)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_add_union_pattern(layout, dtype):
    A, DA = random_sparse(6, 5, layout=layout, dtype=dtype, seed=1)
    B, DB = random_sparse(6, 5, layout=layout, dtype=dtype, seed=2)
    C = add(A, B, alpha=2.0, beta=-0.5)
    assert C.layout == layout
    union = (DA != 0) | (DB != 0)
    assert int(union.sum()) == (C._nnz() if layout == torch.sparse_coo else C.values().numel())
    torch.testing.assert_close(C.to_dense(), 2 * DA - 0.5 * DB, **TOL[dtype])
    W = torch.randn(6, 5, dtype=dtype)
    (C.to_dense() * W).sum().backward()
    check_sparse_grad(A, 2 * W, **TOL[dtype])
    check_sparse_grad(B, -0.5 * W, **TOL[dtype])


def test_add_tensor_scalars_and_mixed_layouts():
    A, DA = random_sparse(5, 5, layout=torch.sparse_csr, seed=3)
    B, DB = random_sparse(5, 5, layout=torch.sparse_coo, seed=4)
    a = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    C = add(A, B, alpha=a)
    assert C.layout == torch.sparse_csr
    torch.testing.assert_close(C.to_dense(), 1.5 * DA + DB)
    C.to_dense().sum().backward()
    torch.testing.assert_close(a.grad, DA.sum())


def test_add_batched_and_gradcheck():
    A, DA = random_sparse(4, 4, layout=torch.sparse_coo, batch=2, seed=5)
    B, DB = random_sparse(4, 4, layout=torch.sparse_coo, batch=2, seed=6)
    torch.testing.assert_close(add(A, B).to_dense(), DA + DB)
    A2, _ = random_sparse(4, 4, seed=7, requires_grad=False)
    B2, _ = random_sparse(4, 4, seed=8, requires_grad=False)
    a, b = stored_values(A2).clone().requires_grad_(), stored_values(B2).clone().requires_grad_()
    f = lambda a, b: add(with_values(A2, a), with_values(B2, b), 0.3, 2.0).to_dense()  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (a, b))


def test_add_shape_mismatch():
    A, _ = random_sparse(4, 4, requires_grad=False)
    B, _ = random_sparse(4, 5, requires_grad=False)
    with pytest.raises(InputError, match="shape mismatch"):
        add(A, B)


FLAGS = [(u, t, d) for u in (False, True) for t in (False, True) for d in (False, True)]


@pytest.mark.parametrize("upper,transpose,unit", FLAGS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triangular_solve(upper, transpose, unit, layout):
    tri = "upper" if upper else "lower"
    L, D = random_sparse(7, 7, layout=layout, seed=9, diag=3.0, tri=tri)
    b = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    x = triangular_solve(L, b, upper=upper, unit_diagonal=unit, transpose=transpose)
    Dd = D.clone().requires_grad_()
    T = Dd - torch.diag(torch.diag(Dd)) + torch.eye(7, dtype=torch.float64) if unit else Dd
    op = T.t() if transpose else T
    bd = b.detach().clone().requires_grad_()
    xd = torch.linalg.solve(op, bd)
    torch.testing.assert_close(x, xd)
    W = torch.randn(7, 2, dtype=torch.float64)
    (x * W).sum().backward()
    (xd * W).sum().backward()
    check_sparse_grad(L, Dd.grad)
    torch.testing.assert_close(b.grad, bd.grad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_triangular_batched_float32(layout):
    L, D = random_sparse(6, 6, layout=layout, seed=10, diag=3.0, tri="lower", batch=3,
                         dtype=torch.float32)
    b = torch.randn(3, 6, dtype=torch.float32)
    x = triangular_solve(L, b)
    xd = torch.linalg.solve_triangular(D, b.unsqueeze(-1), upper=False).squeeze(-1)
    torch.testing.assert_close(x, xd, rtol=1e-4, atol=1e-4)
    x.sum().backward()
    Dd = D.clone().requires_grad_()
    torch.linalg.solve_triangular(Dd, b.unsqueeze(-1), upper=False).sum().backward()
    check_sparse_grad(L, Dd.grad, rtol=1e-3, atol=1e-4)


def test_triangular_gradgradcheck():
    L, _ = random_sparse(5, 5, seed=11, diag=3.0, tri="lower", requires_grad=False)
    v = stored_values(L).clone().requires_grad_()
    b = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    for t in (False, True):
        f = lambda v, b: triangular_solve(with_values(L, v), b, transpose=t)  # noqa: E731
        assert torch.autograd.gradcheck(f, (v, b))
        assert torch.autograd.gradgradcheck(f, (v, b))


def test_triangular_errors():
    L, _ = random_sparse(5, 5, seed=12, diag=3.0, tri="lower", requires_grad=False)
    with pytest.raises(InputError, match="above the diagonal"):
        triangular_solve(random_sparse(5, 5, seed=1, density=0.8, requires_grad=False)[0],
                         torch.randn(5, dtype=torch.float64))
    with pytest.raises(InputError, match="below the diagonal"):
        triangular_solve(L, torch.randn(5, dtype=torch.float64), upper=True)
    S, _ = random_sparse(5, 5, seed=13, tri="strict", requires_grad=False)
    with pytest.raises(InputError, match="singular"):
        triangular_solve(S, torch.randn(5, dtype=torch.float64))
    # a strictly lower factor is fine with unit_diagonal
    triangular_solve(S, torch.randn(5, dtype=torch.float64), unit_diagonal=True)
    with pytest.raises(InputError, match="square"):
        triangular_solve(random_sparse(5, 4, requires_grad=False)[0], torch.randn(5, dtype=torch.float64))
    with pytest.raises(InputError, match="sparse COO or CSR"):
        triangular_solve(torch.eye(3), torch.randn(3))
    with pytest.raises(InputError, match="device"):
        triangular_solve(L, torch.randn(5, dtype=torch.float64, device="meta"))
