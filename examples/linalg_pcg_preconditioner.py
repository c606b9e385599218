"""A learned bidiagonal PCG preconditioner for the 2-D Poisson matrix (seed 004, section 4.3).

A = A_8 (x) I + I (x) A_8 (64 x 64).  The preconditioner M = L L^T with L sparse lower bidiagonal
(stored diagonal and sub-diagonal, learned), so M is tridiagonal and symmetric.  Four PCG
iterations are unrolled in torch; the loss weights the relative residual history with
gamma = 0.6 (later iterations count more), as in the seed's equation (28).  Gradients reach L's
stored entries only.

    python examples/linalg_pcg_preconditioner.py
"""

import warnings

import torch

import asd.linalg as al

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")


def poisson_2d(k: int) -> torch.Tensor:
    T = 2 * torch.eye(k) - torch.diag(torch.ones(k - 1), 1) - torch.diag(torch.ones(k - 1), -1)
    eye = torch.eye(k)
    return (torch.kron(T, eye) + torch.kron(eye, T)).double().to_sparse_csr()


def bidiagonal(diag: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """Lower bidiagonal CSR matrix with the given (differentiable) values."""
    n = diag.numel()
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), 1 + 2 * torch.arange(n)])
    col = torch.cat([torch.tensor([0]), torch.stack([torch.arange(n - 1), torch.arange(1, n)], 1).reshape(-1)])
    vals = torch.cat([diag[:1], torch.stack([sub, diag[1:]], 1).reshape(-1)])
    return torch.sparse_csr_tensor(crow, col, vals, (n, n))


def pcg_residuals(A, B, apply_m, iters):
    """Relative residual norms (per iteration, averaged over columns of B) of unrolled PCG."""
    X = torch.zeros_like(B)
    R = B.clone()
    Z = apply_m(R)
    P = Z
    rz = (R * Z).sum(0)
    bn = B.norm(dim=0)
    out = []
    for _ in range(iters):
        AP = al.matmul(A, P)
        alpha = rz / (P * AP).sum(0)
        X = X + alpha * P
        R = R - alpha * AP
        out.append((R.norm(dim=0) / bn).mean())
        Z = apply_m(R)
        rz_new = (R * Z).sum(0)
        P = Z + (rz_new / rz) * P
        rz = rz_new
    return torch.stack(out)


def main(k: int = 8, iters: int = 4, gamma: float = 0.6, steps: int = 300) -> list[float]:
    torch.manual_seed(0)
    A = poisson_2d(k)
    n = k * k
    B = torch.randn(n, 16, dtype=torch.float64)
    d = torch.full((n,), 0.5, dtype=torch.float64, requires_grad=True)
    s = torch.zeros(n - 1, dtype=torch.float64, requires_grad=True)
    weights = gamma ** torch.arange(iters - 1, -1, -1, dtype=torch.float64)
    weights = weights / weights.sum()
    opt = torch.optim.Adam([d, s], lr=0.01)
    plain = pcg_residuals(A, B, lambda R: R, iters)
    losses = []
    for step in range(steps):
        L = bidiagonal(d, s)
        apply_m = lambda R: al.matmul(L, al.matmul(R.t(), L).t())   # noqa: E731  M R = L (L^T R)
        res = pcg_residuals(A, B, apply_m, iters)
        loss = (weights * res).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.5f}  final relative residual {res[-1].item():.5f}")
    print(f"after {iters} iterations: plain CG {plain[-1].item():.5f}, learned PCG {res[-1].item():.5f}")
    return losses


if __name__ == "__main__":
    losses = main()
    assert losses[-1] < losses[0]
