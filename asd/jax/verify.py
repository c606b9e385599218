"""Check a sparsity pattern of a JAX function against dense Jacobians at random points."""

from __future__ import annotations

from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from .. import VerifyReport
from ..detection.verify import compare_pattern
from ..errors import InputError
from .detection import check_input, jacobian_sparsity


def verify(f: Callable, x, pattern=None, *, points: int = 3, scale: float = 1.0, local: bool = False,
           atol: float = 0.0, seed: int = 0) -> VerifyReport:
    """Check ``pattern`` (default: ``jacobian_sparsity(f, x, local=local)``) against dense
    ``jax.jacfwd`` Jacobians (``jax.jacrev`` where ``f`` holds a ``custom_vjp`` function) at ``x``
    and ``points - 1`` random points ``x + scale * N(0, 1)`` (with ``local=True``: at ``x`` only). Returns an :class:`asd.VerifyReport`; ``report.ok`` is
    ``False`` if the pattern misses a nonzero."""
    check_input(x)
    if points < 1:
        raise InputError(f"points must be at least 1, got {points}")
    if pattern is None:
        pattern = jacobian_sparsity(f, x, local=local)
    npts = 1 if local else points
    return compare_pattern(pattern, _jacobians(f, x, npts, scale, seed), atol=atol, points=npts)


def _jacobians(f: Callable, x, count: int, scale: float, seed: int) -> Iterator[np.ndarray]:
    """Dense ``jax.jacfwd`` (``jax.jacrev`` where ``f`` has no forward mode) Jacobians of ``f`` (all outputs flattened into one vector) at ``x``
    and at ``count - 1`` random points ``x + scale * N(0, 1)``."""
    from .operators import _has_forward_mode

    flat = lambda z: jnp.concatenate([jnp.ravel(t) for t in jax.tree_util.tree_leaves(f(z))])  # noqa: E731
    x = jnp.asarray(x)
    # a custom_vjp function inside f has reverse mode only
    jacobian = jax.jacfwd(flat) if _has_forward_mode(flat, x) else jax.jacrev(flat)
    key = jax.random.PRNGKey(seed)
    for k in range(count):
        xp = x
        if k:
            key, sub = jax.random.split(key)
            xp = x + scale * jax.random.normal(sub, x.shape, x.dtype)
        yield np.asarray(jacobian(xp)).reshape(-1, x.size)
