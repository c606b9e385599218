"""Test helpers: random sparse matrices with dense twins and pattern-exact gradient checks."""

from __future__ import annotations

from typing import Optional

import torch


def random_sparse(n: int, m: int, *, density: float = 0.3, layout=torch.sparse_csr,
                  dtype=torch.float64, batch: Optional[int] = None, seed: int = 0,
                  diag: float = 0.0, tri: Optional[str] = None, requires_grad: bool = True):
    """A random sparse tensor and its dense twin.

    ``diag`` adds ``diag * I`` (square only); ``tri`` is ``"lower"``/``"upper"``/``"strict"``
    (strictly lower).  Batched CSR items share one pattern (equal nnz is required by torch).
    """
    g = torch.Generator().manual_seed(seed)
    shape = (n, m) if batch is None else (batch, n, m)
    mask = torch.rand((n, m), generator=g) < density
    if batch is not None and layout == torch.sparse_coo:
        mask = torch.rand(shape, generator=g) < density
    D = torch.randn(shape, generator=g, dtype=torch.float64) * mask
    if diag:
        D = D + diag * torch.eye(n, dtype=torch.float64)
    D = _triangle(D, tri).to(dtype)
    if layout == torch.sparse_csr:
        S = D.to_sparse_csr() if batch is None else _batched_csr(D, mask, tri, diag)
    else:
        S = D.to_sparse(2 if batch is None else 3)
    S = S.detach()
    if requires_grad:
        S.requires_grad_()
    return S, D


def _triangle(M: torch.Tensor, tri: Optional[str]) -> torch.Tensor:
    """The ``"lower"``, ``"upper"`` or ``"strict"`` (strictly lower) triangle of ``M``, or all of it."""
    if tri == "lower":
        return torch.tril(M)
    if tri == "upper":
        return torch.triu(M)
    if tri == "strict":
        return torch.tril(M, -1)
    return M


def _batched_csr(D, mask, tri, diag):
    # one shared structure so every batch item has the same nnz
    n, m = mask.shape
    struct = mask | (torch.eye(n, m, dtype=torch.bool) if diag else torch.zeros_like(mask))
    idx = _triangle(struct, tri).nonzero()
    crow = torch.zeros(n + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(idx[:, 0], minlength=n), 0)
    B = D.shape[0]
    vals = D[:, idx[:, 0], idx[:, 1]]
    return torch.sparse_csr_tensor(crow.expand(B, -1).contiguous(),
                                   idx[:, 1].expand(B, -1).contiguous(), vals, D.shape)


def stored_values(S: torch.Tensor) -> torch.Tensor:
    return (S.values() if S.layout == torch.sparse_csr else S.coalesce().values()).reshape(-1)


def dense_at_pattern(S: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Entries of dense ``G`` at the stored positions of ``S``, in storage order."""
    if S.layout == torch.sparse_csr:
        C = S.detach().to_sparse_coo().coalesce()
    else:
        C = S.detach().coalesce()
    idx = C.indices()
    return G[tuple(idx)]


def assert_pattern_equal(G: torch.Tensor, S: torch.Tensor) -> None:
    """``G`` has ``S``'s layout and exactly its stored entries."""
    assert G.layout == S.layout, (G.layout, S.layout)
    assert G.shape == S.shape
    if S.layout == torch.sparse_csr:
        assert torch.equal(G.crow_indices(), S.crow_indices())
        assert torch.equal(G.col_indices(), S.col_indices())
    else:
        assert torch.equal(G.coalesce().indices(), S.coalesce().indices())


def check_sparse_grad(S: torch.Tensor, dense_grad: torch.Tensor, **tol) -> None:
    """``S.grad`` has S's pattern and equals the dense gradient on the stored entries."""
    assert S.grad is not None
    assert_pattern_equal(S.grad, S)
    got = stored_values(S.grad).to(torch.float64)
    want = dense_at_pattern(S, dense_grad.to(torch.float64))
    torch.testing.assert_close(got, want, **tol)
