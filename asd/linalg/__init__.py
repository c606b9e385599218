"""Sparsity-preserving sparse linear algebra for PyTorch.

Every operation takes sparse COO or CSR tensors (optionally batched, ``(B, n, m)``) whose values
may require grad, and returns gradients with respect to them in their own layout with exactly
their stored entries (the projection P_S of the dense gradient onto the pattern); gradients with
respect to dense operands are dense.  Backward passes are built from the same differentiable
primitives, so double backward works where the math allows.

Public API
----------
matmul(A, B)                      SpMV, SpMM, dense @ sparse, SpSpMM
sampled_matmul(U, V, pattern)     (U @ V) on a pattern's stored entries (SDDMM)
add(A, B, alpha=1, beta=1)        sparse + sparse on the union pattern
triangular_solve(L, b, upper=False, unit_diagonal=False, transpose=False)
solve(A, b, method="direct" | "lu" | "cholesky" | "cg" | "bicgstab" | "minres" | "gmres" | "lsmr")
cg, bicgstab, minres, gmres, lsmr   Krylov solves returning (x, SolveInfo)
with_values(A, values)            A's pattern with new values, differentiable to any order
"""

from asd.linalg._sparse import with_values
from asd.linalg.krylov import SolveInfo
from asd.linalg.products import matmul, sampled_matmul
from asd.linalg.solve import bicgstab, cg, gmres, lsmr, minres, solve
from asd.linalg.sums import add
from asd.linalg.triangular import triangular_solve

__all__ = ["matmul", "sampled_matmul", "add", "triangular_solve", "solve", "cg", "bicgstab",
           "minres", "gmres", "lsmr", "SolveInfo", "with_values"]
