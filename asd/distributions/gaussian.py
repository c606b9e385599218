"""Multivariate normal distributions with a sparse triangular factor.

Four parameterisations (torchsparsegradutils, seed 003), with ``L`` sparse lower triangular:

========================  ===============================  =====================================
arguments                 meaning                          sample ``x = loc + ...``
========================  ===============================  =====================================
``scale_tril=L``          covariance  ``S = L L^T``        ``L eps``
``precision_tril=L``      precision   ``Q = L L^T``        ``L^{-T} eps``
``scale_tril=L, D``       covariance  ``S = L D L^T``      ``L D^{1/2} eps``
``precision_tril=L, D``   precision   ``Q = L D L^T``      ``L^{-T} D^{-1/2} eps``
========================  ===============================  =====================================

In the LDL^T forms ``L`` is unit lower triangular and stored *without* its diagonal (strictly
lower; stored diagonal entries are ignored) and ``D`` (``diagonal=``) is a dense positive vector.
Sampling and densities use only sparse products and triangular solves, so gradients with respect
to ``L`` keep its pattern and nothing ``n x n`` is ever formed.  Sampling, densities and entropy
run on the factor's device without host round trips; construction reads back its structural
and (with ``validate_args``) value checks, which are skipped on ``meta``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch.distributions import Distribution, constraints

from asd.errors import InputError
from asd.linalg import matmul, triangular_solve
from asd.linalg._sparse import Pattern, check_dtypes, check_sparse, values_of
from asd.linalg.products import spmm_values
from asd.linalg.triangular import check_triangular, trisolve_values

__all__ = ["SparseMultivariateNormal"]


def _strictly_lower(P: Pattern, vals: torch.Tensor) -> torch.Tensor:
    """``vals`` with the stored diagonal entries zeroed: the LDL^T forms' unit factor ignores them
    (their gradient is zero)."""
    if P.on_meta:
        return vals
    return torch.where(P.diag_mask, torch.zeros_like(vals), vals)


class SparseMultivariateNormal(Distribution):
    """Multivariate normal ``N(loc, S)`` with a sparse (LL^T or LDL^T) factor of ``S`` or ``S^{-1}``.

    Parameters
    ----------
    loc : torch.Tensor
        Mean, shape ``batch_shape + (n,)``.
    scale_tril : torch.Tensor, optional
        Sparse COO/CSR ``(n, n)`` lower-triangular factor of the covariance.
    precision_tril : torch.Tensor, optional
        Sparse COO/CSR ``(n, n)`` lower-triangular factor of the precision.
    diagonal : torch.Tensor, optional
        ``D`` of the LDL^T form, shape ``(n,)``, positive.  With it, the factor is unit lower
        triangular and stored without its diagonal.
    validate_args : bool, optional
        Check positivity of ``D`` / of the diagonal of ``L`` (never on ``meta``, whose tensors
        have no values).

    Examples
    --------
    >>> L = torch.eye(3).to_sparse_csr().requires_grad_()
    >>> d = SparseMultivariateNormal(torch.zeros(3), scale_tril=L)
    >>> d.log_prob(d.rsample((5,))).shape
    torch.Size([5])
    """

    arg_constraints = {"loc": constraints.real_vector}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: torch.Tensor, scale_tril: Optional[torch.Tensor] = None,
                 precision_tril: Optional[torch.Tensor] = None,
                 diagonal: Optional[torch.Tensor] = None,
                 validate_args: Optional[bool] = None):
        if (scale_tril is None) == (precision_tril is None):
            raise InputError("pass exactly one of scale_tril= and precision_tril=")
        L = scale_tril if scale_tril is not None else precision_tril
        check_sparse(L, "scale_tril" if scale_tril is not None else "precision_tril")
        if L.dim() != 2:
            raise InputError(f"the sparse factor must be (n, n), got shape {tuple(L.shape)}; put "
                             f"batch dimensions on loc")
        if not isinstance(loc, torch.Tensor) or loc.dim() < 1 or loc.shape[-1] != L.shape[0]:
            raise InputError(f"loc must end with the event size {L.shape[0]}, got "
                             f"{tuple(getattr(loc, 'shape', ()))}")
        if loc.device != L.device:
            raise InputError(f"loc is on {loc.device} but the factor is on {L.device}")
        if loc.dtype != L.dtype:
            raise InputError(f"dtype mismatch: loc is {loc.dtype}, the factor is {L.dtype}")
        P, vals = values_of(L.detach())
        check_triangular(P, upper=False, name="the sparse factor")
        n = L.shape[0]
        self._ldl = diagonal is not None
        if self._ldl:
            if diagonal.shape != (n,):
                raise InputError(f"diagonal must have shape ({n},), got {tuple(diagonal.shape)}")
        elif not P.on_meta and int(P.diag_mask.sum()) != n:
            raise InputError("the factor must store every diagonal entry (LL^T form); for a "
                             "unit factor stored without its diagonal pass diagonal=D")
        self.loc = loc
        self.factor = L
        self.diagonal = diagonal
        self._is_precision = precision_tril is not None
        self.scale_tril = scale_tril
        self.precision_tril = precision_tril
        self._n = n
        if P.on_meta:
            validate_args = False
        super().__init__(loc.shape[:-1], loc.shape[-1:], validate_args=validate_args)
        if self._validate_args:
            if self._ldl and not bool((diagonal > 0).all()):
                raise InputError("diagonal D must be positive")
            if not self._ldl and not bool((vals[P.diag_mask] > 0).all()):
                raise InputError("the diagonal of the factor must be positive")

    # ---- helpers -----------------------------------------------------------------------------
    def _half_logdet_cov(self, P: Pattern, vals: torch.Tensor) -> torch.Tensor:
        """``1/2 log det S`` from the factor's flat values ``vals`` (of pattern ``P``)."""
        if self._ldl:
            h = 0.5 * torch.log(self.diagonal).sum()
        else:
            d = torch.where(P.diag_mask, vals.abs(), torch.ones_like(vals))  # no boolean indexing
            h = torch.log(d).sum()
        return -h if self._is_precision else h

    @property
    def mean(self) -> torch.Tensor:
        """The mean, ``loc``."""
        return self.loc

    def _to_cols(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
        return t.reshape(-1, self._n).t(), t.shape

    # ---- Distribution API ----------------------------------------------------------------------
    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """Reparameterised sample ``loc + (factor map) eps``, differentiable in loc, L and D."""
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        E, _ = self._to_cols(eps)
        L = self.factor
        if not self._is_precision:
            if self._ldl:
                Y = self.diagonal.sqrt().unsqueeze(1) * E
                P, vals = values_of(L)
                Z = Y + spmm_values(P, _strictly_lower(P, vals), Y)
            else:
                Z = matmul(L, E)
        else:
            if self._ldl:
                Y = E / self.diagonal.sqrt().unsqueeze(1)
                Z = triangular_solve(L, Y, unit_diagonal=True, transpose=True)
            else:
                Z = triangular_solve(L, E, transpose=True)
        return self.loc + Z.t().reshape(shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log density, differentiable in ``value``, ``loc``, ``L`` and ``D``."""
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        shape = diff.shape
        Dc, _ = self._to_cols(diff)
        # one read of L's values for both terms: its gradient is built once, in L's layout
        P, vals = values_of(self.factor)
        check_dtypes(vals, Dc)
        if not self._is_precision:
            Z = trisolve_values(P, vals, Dc, lower=True, unit=self._ldl)
            if self._ldl:
                Z = Z / self.diagonal.sqrt().unsqueeze(1)
        else:
            if self._ldl:  # (I + L)^T diff, a stored diagonal of L left out
                Z = spmm_values(P, _strictly_lower(P, vals), Dc, trans=True) + Dc
                Z = Z * self.diagonal.sqrt().unsqueeze(1)
            else:
                Z = spmm_values(P, vals, Dc, trans=True)    # L^T diff
        maha = (Z * Z).sum(0).reshape(shape[:-1])
        return -0.5 * maha - self._half_logdet_cov(P, vals) - 0.5 * self._n * math.log(2 * math.pi)

    def entropy(self) -> torch.Tensor:
        """Differential entropy, ``n/2 (1 + log 2 pi) + 1/2 log det Sigma``, differentiable through the factor."""
        h = 0.5 * self._n * (1.0 + math.log(2 * math.pi)) + self._half_logdet_cov(
            *values_of(self.factor))
        return h.expand(self.batch_shape)
