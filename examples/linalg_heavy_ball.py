"""Learned heavy-ball parameters (seed 004, section 4.2).

Polyak's heavy-ball iteration for A x = b (b = 0) on the 1-D Poisson matrix (n = 16):
    x_{k+1} = x_k - alpha (A x_k - b) + beta (x_k - x_{k-1}),
run for 12 = 3n/4 rounds; alpha and beta minimise the final energy  sum_k x^T A x  over random
starting vectors.  Every product with A goes through asd.linalg.matmul.

    python examples/linalg_heavy_ball.py
"""

import warnings

import torch

import asd.linalg as al

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")


def poisson_1d(n: int) -> torch.Tensor:
    return (2 * torch.eye(n) - torch.diag(torch.ones(n - 1), 1)
            - torch.diag(torch.ones(n - 1), -1)).double().to_sparse_csr()


def heavy_ball(A, X, alpha, beta, rounds):
    prev, x = X, X
    for _ in range(rounds):
        x, prev = x - alpha * al.matmul(A, x) + beta * (x - prev), x
    return x


def main(n: int = 16, k: int = 64, steps: int = 300) -> list[float]:
    torch.manual_seed(0)
    A = poisson_1d(n)
    X = torch.randn(n, k, dtype=torch.float64)
    X = X / X.norm(dim=0)
    params = torch.tensor([0.1, 0.0], dtype=torch.float64, requires_grad=True)   # alpha, beta
    opt = torch.optim.Adam([params], lr=0.01)
    losses = []
    for step in range(steps):
        Xk = heavy_ball(A, X, params[0], params[1], rounds=3 * n // 4)
        loss = (Xk * al.matmul(A, Xk)).sum() / k
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3e}  alpha {params[0].item():.4f}  "
                  f"beta {params[1].item():.4f}")
    return losses


if __name__ == "__main__":
    losses = main()
    assert losses[-1] < losses[0]
