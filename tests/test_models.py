"""Model code the way its users write it: torch.sparse products with a constant sparse matrix,
inference mode, autocast. Every Jacobian is checked against dense float64 autograd."""

import pytest
import torch

import asd

A = torch.tensor([[2.0, 1.0, 0.0, 0.0], [0.0, 3.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 4.0]],
                 dtype=torch.float64).to_sparse_csr()
torch.manual_seed(0)
LIN = torch.nn.Linear(3, 3).double()
X = torch.rand(4, 3, dtype=torch.float64)

PRODUCTS = {
    "torch.sparse.mm": lambda X: torch.relu(torch.sparse.mm(A, LIN(X))),
    "torch.sparse.addmm": lambda X: torch.sparse.addmm(X, A, LIN(X), beta=0.5, alpha=2.0),
    "torch.spmm": lambda X: torch.tanh(torch.spmm(A, LIN(X))),
    "A @ H": lambda X: torch.sin(A @ LIN(X)),
}


@pytest.mark.parametrize("name", list(PRODUCTS))
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_sparse_products_with_a_constant_sparse_matrix(name, mode):
    f = PRODUCTS[name]
    J = asd.sparse_jacobian(f, X, mode=mode, cache=False)
    ref = torch.autograd.functional.jacobian(f, X).reshape(12, 12)
    torch.testing.assert_close(J.to_dense(), ref)
    # the pattern keeps A's sparsity (a row of the output reads only the rows A couples)
    assert J.to_dense().count_nonzero() < 12 * 12


def test_inference_mode_is_a_clear_error():
    with torch.inference_mode():
        x = torch.rand(4, dtype=torch.float64)
    with pytest.raises(asd.InputError, match="inference"):
        asd.sparse_jacobian(torch.sin, x)
    with pytest.raises(asd.InputError, match="inference_mode"):
        with torch.inference_mode():
            asd.sparse_jacobian(torch.sin, torch.rand(4, dtype=torch.float64))
    op = asd.prepare_jacobian(torch.sin, torch.rand(4, dtype=torch.float64))
    with pytest.raises(asd.InputError, match="inference"):
        op(x)


def test_autocast_warns_about_reduced_precision():
    with pytest.warns(RuntimeWarning, match="autocast"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            asd.sparse_jacobian(lambda x: x @ x.T, torch.rand(3, 3, dtype=torch.float64), cache=False)


# -- issue 16, item 1: under local=True a dense constant's values are known: its zeros are used ------

def _adjacency(n, density, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, n, generator=g) < density).double() * torch.rand(n, n, dtype=torch.float64, generator=g)


def test_local_tracing_reads_a_dense_adjacency_like_a_sparse_one():
    """The issue's GCN layer with a dense adjacency: globally A is full (a prepared operator lets its
    values change), locally its zeros prune the pattern exactly, and the operator compresses."""
    n = 80
    A = _adjacency(n, 0.04)
    torch.manual_seed(1)
    lin = torch.nn.Linear(6, 6).double()
    X = torch.rand(n, 6, dtype=torch.float64)
    f = lambda X: torch.relu(A @ lin(X))  # noqa: E731
    ref = torch.autograd.functional.jacobian(f, X).reshape(n * 6, n * 6)
    local = asd.jacobian_sparsity(f, X, local=True)
    assert (local.toarray() == (ref != 0).numpy()).all()
    assert asd.jacobian_sparsity(f, X).nnz > 5 * local.nnz
    op = asd.prepare_jacobian(f, X, local=True)
    assert op.ncolors < n * 6 // 4
    torch.testing.assert_close(op(X).to_dense(), ref)
    # the same through torch.mm, a matrix-vector product and a transposed constant on the right
    for g in (lambda X: torch.mm(A, X), lambda X: A @ X[:, 0], lambda X: X.T @ A.T):
        dense = torch.autograd.functional.jacobian(g, X).reshape(-1, n * 6)
        assert (asd.jacobian_sparsity(g, X, local=True).toarray() == (dense != 0).numpy()).all()


def test_local_tracing_reads_a_constant_factor_of_a_product():
    w = torch.tensor([1.0, 0.0, 2.0, 0.0, 3.0], dtype=torch.float64)
    x = torch.rand(5, dtype=torch.float64)
    for f in (lambda x: x * w, lambda x: w * x.sin(), lambda x: x.reshape(5, 1) * w, lambda x: x * 0.0):
        dense = torch.autograd.functional.jacobian(f, x).reshape(-1, 5)
        assert (asd.jacobian_sparsity(f, x, local=True).toarray() == (dense != 0).numpy()).all()
        assert asd.jacobian_sparsity(f, x).nnz > (dense != 0).sum()  # globally the constant is full
        torch.testing.assert_close(asd.sparse_jacobian(f, x, local=True).to_dense(), dense)


def test_local_hessian_of_a_dense_constant_product():
    n = 40
    A = _adjacency(n, 0.06, seed=3)
    f = lambda x: ((A @ x) ** 2).sum()  # noqa: E731 - Hessian 2 A^T A
    x = torch.rand(n, dtype=torch.float64)
    ref = torch.autograd.functional.hessian(f, x)
    P = asd.hessian_sparsity(f, x, local=True).toarray()
    structural = ((A != 0).double().T @ (A != 0).double() != 0).numpy()
    assert (P == structural).all() and not ((ref != 0).numpy() & ~P).any()
    assert asd.hessian_sparsity(f, x).nnz == n * n
    torch.testing.assert_close(asd.sparse_hessian(f, x, local=True).to_dense(), ref)
