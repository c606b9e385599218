"""Sparsity-preserving sparse linear algebra for PyTorch.

Every operation takes sparse COO or CSR tensors (optionally batched, ``(B, n, m)``) whose values
may require grad, and returns gradients with respect to them in their own layout with exactly
their stored entries (the projection P_S of the dense gradient onto the pattern); gradients with
respect to dense operands are dense.
"""

from asd.linalg._sparse import with_values
from asd.linalg.products import matmul, sampled_matmul

__all__ = ["matmul", "sampled_matmul", "with_values"]
