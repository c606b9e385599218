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
