"""The device-agnostic torch code paths (used off the CPU) agree with the Numba kernels."""

import pytest
import torch

from asd.linalg import _kernels as K
from asd.linalg import add, matmul, sampled_matmul, solve
from asd.linalg._testing import check_sparse_grad, random_sparse

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]


@pytest.fixture
def torch_kernels(monkeypatch):
    monkeypatch.setattr(K, "_use_numba", lambda t: False)


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_products_without_numba(torch_kernels, layout):
    S, D = random_sparse(6, 5, layout=layout, seed=1)
    x = torch.randn(5, 3, dtype=torch.float64)
    y = matmul(S, x)
    torch.testing.assert_close(y, D @ x)
    y.pow(2).sum().backward()
    Dd = D.clone().requires_grad_()
    (Dd @ x).pow(2).sum().backward()
    check_sparse_grad(S, Dd.grad)
    U, V = torch.randn(6, 2, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    torch.testing.assert_close(sampled_matmul(U, V, S.detach()).to_dense(), (U @ V) * (D != 0))
    B, DB = random_sparse(6, 5, layout=layout, seed=2)
    torch.testing.assert_close(add(S.detach(), B, 2.0, 3.0).to_dense(), 2 * D + 3 * DB)


def test_krylov_without_numba(torch_kernels):
    S, D = random_sparse(8, 8, layout=torch.sparse_coo, seed=3, density=0.2)
    D = D + D.t() + 10 * torch.eye(8, dtype=torch.float64)
    A = D.to_sparse_csr().requires_grad_()
    b = torch.randn(8, dtype=torch.float64)
    x = solve(A, b, "cg", rtol=1e-12)
    torch.testing.assert_close(x, torch.linalg.solve(D, b))
    x.sum().backward()
    Dd = D.clone().requires_grad_()
    torch.linalg.solve(Dd, b).sum().backward()
    check_sparse_grad(A, Dd.grad, rtol=1e-7, atol=1e-8)
