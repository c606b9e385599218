"""Check a sparsity pattern against dense Jacobians at random points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np
import scipy.sparse as sp
import torch
from torch.utils._pytree import tree_flatten

from ..errors import InputError
from ..patterns import SparsityPattern
from .jacobian import check_input, jacobian_sparsity


@dataclass(frozen=True)
class VerifyReport:
    """Result of :func:`verify`.

    ``missed`` lists the (row, column) entries that are nonzero in some dense Jacobian but absent
    from the pattern (the pattern is unsound if there is any); ``extra`` counts pattern entries
    that were zero at every point tried; ``precision`` is the fraction of pattern entries seen
    nonzero (1.0 for an exact pattern), ``recall`` the fraction of observed nonzeros the pattern
    holds (1.0 when sound)."""

    ok: bool
    missed: tuple
    extra: int
    pattern_nnz: int
    observed_nnz: int
    precision: float
    recall: float
    points: int

    def __str__(self) -> str:
        head = "pattern is sound" if self.ok else f"pattern MISSES {len(self.missed)} nonzeros"
        s = (f"{head} at {self.points} points: {self.pattern_nnz} pattern entries, {self.observed_nnz} "
             f"observed nonzeros, {self.extra} never nonzero; precision {self.precision:.3f}, "
             f"recall {self.recall:.3f}")
        if self.missed:
            s += f"; first missed (row, col): {list(self.missed[:10])}"
        return s


def _dense_jacobian(f: Callable, x: torch.Tensor) -> np.ndarray:
    def flat(z):
        y = f(z)
        leaves = [y] if isinstance(y, torch.Tensor) else [t for t in tree_flatten(y)[0] if isinstance(t, torch.Tensor)]
        return torch.cat([t.reshape(-1) for t in leaves])

    J = torch.autograd.functional.jacobian(flat, x)
    return J.reshape(-1, x.numel()).detach().cpu().numpy()


def _points(x: torch.Tensor, count: int, scale: float, seed: int) -> Iterator[torch.Tensor]:
    """``x``, then ``count - 1`` random points ``x + scale * N(0, 1)``."""
    gen = torch.Generator().manual_seed(seed)
    for k in range(count):
        xp = x.detach().clone()
        if k:
            xp = xp + scale * torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device)
        yield xp


def verify(f: Callable, x: torch.Tensor, pattern=None, *, points: int = 3, scale: float = 1.0,
           local: bool = False, atol: float = 0.0, seed: int = 0) -> VerifyReport:
    """Check ``pattern`` (a scipy sparse matrix, a dense array or an :class:`asd.SparsityPattern`;
    default: ``jacobian_sparsity(f, x, local=local)``) against dense Jacobians
    of ``f`` (computed with autograd in ``x``'s dtype) at ``x`` and at ``points - 1`` random points
    ``x + scale * N(0, 1)`` (with ``local=True``: at ``x`` only, where a local pattern holds).

    An entry counts as nonzero when its absolute value exceeds ``atol``. Returns a
    :class:`VerifyReport`; ``report.ok`` is ``False`` if any nonzero was missed."""
    check_input(x)
    if x.is_meta:
        raise InputError("x is on the meta device, which holds no values: verify compares dense Jacobians "
                         "at real points; pass x on the CPU or a GPU")
    if points < 1:
        raise InputError(f"points must be at least 1, got {points}")
    if pattern is None:
        pattern = jacobian_sparsity(f, x, local=local)
    elif isinstance(pattern, SparsityPattern):
        pattern = pattern.to_scipy()
    npts = 1 if local else points
    jacobians = (_dense_jacobian(f, xp) for xp in _points(x, npts, scale, seed))
    return compare_pattern(pattern, jacobians, atol=atol, points=npts)


def compare_pattern(pattern, jacobians: Iterable[np.ndarray], *, atol: float, points: int) -> VerifyReport:
    """Compare a sparsity pattern with the nonzeros of dense Jacobians (framework-free).

    Parameters
    ----------
    pattern
        A scipy sparse matrix or a dense array (nonzero: in the pattern).
    jacobians
        Dense ``(m, n)`` Jacobians, one per point (read one at a time).
    atol
        An entry counts as nonzero when its absolute value exceeds ``atol`` (or it is NaN).
    points
        Number of points, as reported.

    Returns
    -------
    VerifyReport
        ``ok`` is ``False`` if any observed nonzero is missing from the pattern.

    Raises
    ------
    InputError
        If a Jacobian's shape differs from the pattern's.
    """
    P = sp.csr_array(pattern).astype(bool)
    observed = None
    for J in jacobians:
        if J.shape != P.shape:
            raise InputError(f"the pattern has shape {P.shape} but the Jacobian has shape {J.shape}")
        nz = (np.abs(J) > atol) | np.isnan(J)  # NaN: not provably zero
        observed = nz if observed is None else observed | nz
    O = sp.csr_array(observed)
    missed_coo = sp.coo_array(O.astype(np.int8) - O.multiply(P).astype(np.int8))
    keep = missed_coo.data > 0
    missed = tuple(zip(missed_coo.row[keep].tolist(), missed_coo.col[keep].tolist()))
    hit = int(O.multiply(P).nnz)
    pnnz, onnz = int(P.nnz), int(O.nnz)
    return VerifyReport(ok=not missed, missed=missed, extra=pnnz - hit, pattern_nnz=pnnz, observed_nnz=onnz,
                        precision=hit / pnnz if pnnz else 1.0, recall=hit / onnz if onnz else 1.0, points=points)
