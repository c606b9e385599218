"""Learned entry-wise Jacobi weights (seed 004, section 4.1).

One weighted Jacobi sweep for A x = 0 on the 1-D Poisson matrix (n = 16):
    j(x) = x - Omega D^{-1} A x,   Omega = diag(w) a sparse diagonal matrix with learned values,
minimising  sum_k j(x_k)^T A j(x_k)  over random test vectors x_k.  The gradient reaches w through
the stored entries of the sparse Omega only.

    python examples/linalg_jacobi_weights.py
"""

import warnings

import torch

import asd.linalg as al

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")


def poisson_1d(n: int) -> torch.Tensor:
    return (2 * torch.eye(n) - torch.diag(torch.ones(n - 1), 1)
            - torch.diag(torch.ones(n - 1), -1)).double().to_sparse_csr()


def main(n: int = 16, k: int = 64, steps: int = 300) -> list[float]:
    torch.manual_seed(0)
    A = poisson_1d(n)
    dinv = torch.full((n,), 0.5, dtype=torch.float64)           # D^{-1}
    idx = torch.arange(n)
    w = torch.full((n,), 0.5, dtype=torch.float64, requires_grad=True)
    X = torch.randn(n, k, dtype=torch.float64)
    X = X / X.norm(dim=0)
    opt = torch.optim.Adam([w], lr=0.02)
    losses = []
    for step in range(steps):
        Omega = torch.sparse_csr_tensor(torch.arange(n + 1), idx, w, (n, n))
        J = X - al.matmul(Omega, dinv[:, None] * al.matmul(A, X))
        loss = (J * al.matmul(A, J)).sum() / k
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.6f}")
    print("learned weights:", " ".join(f"{v:.2f}" for v in w.detach()))
    return losses


if __name__ == "__main__":
    losses = main()
    assert losses[-1] < losses[0]
