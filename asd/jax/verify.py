"""Check a sparsity pattern of a JAX function against dense Jacobians at random points."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from .. import VerifyReport
from ..errors import InputError
from .detection import check_input, jacobian_sparsity


def verify(f: Callable, x, pattern=None, *, points: int = 3, scale: float = 1.0, local: bool = False,
           atol: float = 0.0, seed: int = 0) -> VerifyReport:
    """Check ``pattern`` (default: ``jacobian_sparsity(f, x, local=local)``) against dense
    ``jax.jacfwd`` Jacobians at ``x`` and ``points - 1`` random points ``x + scale * N(0, 1)``
    (with ``local=True``: at ``x`` only). Returns an :class:`asd.VerifyReport`; ``report.ok`` is
    ``False`` if the pattern misses a nonzero."""
    check_input(x)
    if points < 1:
        raise InputError(f"points must be at least 1, got {points}")
    if pattern is None:
        pattern = jacobian_sparsity(f, x, local=local)
    P = sp.csr_array(pattern).astype(bool)
    key = jax.random.PRNGKey(seed)
    observed = None
    npts = 1 if local else points
    flat = lambda z: jnp.concatenate([jnp.ravel(t) for t in jax.tree_util.tree_leaves(f(z))])  # noqa: E731
    for k in range(npts):
        xp = jnp.asarray(x)
        if k:
            key, sub = jax.random.split(key)
            xp = xp + scale * jax.random.normal(sub, xp.shape, xp.dtype)
        J = np.asarray(jax.jacfwd(flat)(xp)).reshape(-1, xp.size)
        if J.shape != P.shape:
            raise InputError(f"the pattern has shape {P.shape} but the Jacobian has shape {J.shape}")
        nz = (np.abs(J) > atol) | np.isnan(J)
        observed = nz if observed is None else observed | nz
    O = sp.csr_array(observed)
    missed_coo = sp.coo_array(O.astype(np.int8) - O.multiply(P).astype(np.int8))
    keep = missed_coo.data > 0
    missed = tuple(zip(missed_coo.row[keep].tolist(), missed_coo.col[keep].tolist()))
    hit = int(O.multiply(P).nnz)
    pnnz, onnz = int(P.nnz), int(O.nnz)
    return VerifyReport(ok=not missed, missed=missed, extra=pnnz - hit, pattern_nnz=pnnz, observed_nnz=onnz,
                        precision=hit / pnnz if pnnz else 1.0, recall=hit / onnz if onnz else 1.0, points=npts)
