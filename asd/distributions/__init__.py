"""Probability distributions with sparse parameterisations (sparsity-preserving gradients)."""

from asd.distributions.gaussian import SparseMultivariateNormal

__all__ = ["SparseMultivariateNormal"]
