"""Sparsity-preserving sparse linear algebra for PyTorch.

Every operation takes sparse COO or CSR tensors (optionally batched, ``(B, n, m)``) whose values
may require grad, and returns gradients with respect to them in their own layout with exactly
their stored entries (the projection P_S of the dense gradient onto the pattern); gradients with
respect to dense operands are dense.  Backward passes are built from the same differentiable
primitives, so double backward works where the math allows.

Sparse inputs are validated when their structure is first seen: a CSR row storing one column
twice, a COO tensor flagged coalesced whose indices are unsorted or repeated, and out-of-range
indices are errors (uncoalesced COO is coalesced, summing duplicates, as torch does).

Devices: CPU tensors run Numba kernels; other devices run torch operations where the tensors
live (triangular solves on CUDA through cuSPARSE), with Krylov loops reading one convergence
test back every ``check_every`` iterations.  Steps without a device kernel (direct
factorizations, the symbolic phase of sparse @ sparse, triangular sweeps off CPU and CUDA) copy
to the host and back with a :class:`HostFallbackWarning`, once per kind of step.  On ``meta``
every call except sparse @ sparse and add (whose result structure depends on index values)
propagates shapes, dtypes and layouts without reading any value.

Public API
----------
matmul(A, B)                      SpMV, SpMM, dense @ sparse, SpSpMM
sampled_matmul(U, V, pattern)     (U @ V) on a pattern's stored entries (SDDMM)
add(A, B, alpha=1, beta=1)        sparse + sparse on the union pattern
triangular_solve(L, b, upper=False, unit_diagonal=False, transpose=False)
solve(A, b, solver=LU(), return_info=False)    any solver object, a prepared state, or a method
                                  string ("direct" | "cholesky" | "cg" | "bicgstab" | "minres" |
                                  "gmres" | "lsmr")
LU, Cholesky, CG, BiCGStab, MINRES, GMRES, LSMR   immutable solvers: init(A) -> state,
                                  compute(state, b) -> (x, SolveInfo), transpose(state)
CupyLU                            LU with GPU solves through CuPy (CUDA tensors; asd[cuda])
SolveInfo, SolverState, SingularMatrixError
with_values(A, values)            A's pattern with new values, differentiable to any order
clear_cache()                     drop the cached sparse structures
HostFallbackWarning               a step copied values to the host and back
"""

from asd.errors import HostFallbackWarning
from asd.linalg._sparse import clear_cache, with_values
from asd.linalg.base import SingularMatrixError, SolveInfo, Solver, SolverState
from asd.linalg.cupy_direct import CupyLU
from asd.linalg.direct import LU, Cholesky
from asd.linalg.iterative import CG, GMRES, LSMR, MINRES, BiCGStab
from asd.linalg.products import matmul, sampled_matmul
from asd.linalg.solve import solve
from asd.linalg.sums import add
from asd.linalg.triangular import triangular_solve

__all__ = ["matmul", "sampled_matmul", "add", "triangular_solve", "solve", "Solver", "SolverState",
           "SolveInfo", "SingularMatrixError", "LU", "Cholesky", "CG", "BiCGStab", "MINRES",
           "GMRES", "LSMR", "CupyLU", "with_values", "clear_cache", "HostFallbackWarning"]
