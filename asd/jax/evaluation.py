"""Jittable compressed products and decompression for the prepared JAX operators."""

from __future__ import annotations

from functools import singledispatch
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._coloring import Forward, Gather, Substitution


def batched(fn: Callable, seeds: jax.Array, batch_size: int | None) -> jax.Array:
    """``vmap(fn)(seeds)``, in chunks of ``batch_size`` seeds run one after another."""
    k = seeds.shape[0]
    if batch_size is None or batch_size >= k:
        return jax.vmap(fn)(seeds)
    nchunks = -(-k // batch_size)
    pad = nchunks * batch_size - k
    chunks = jnp.concatenate([seeds, jnp.zeros((pad,) + seeds.shape[1:], seeds.dtype)]).reshape(
        (nchunks, batch_size) + seeds.shape[1:])
    out = lax.map(jax.vmap(fn), chunks)
    return out.reshape((nchunks * batch_size,) + out.shape[2:])[:k]


def jacobian_products(g: Callable, x: jax.Array, blocks: list, seeds: list, batch_size) -> jax.Array:
    """The flat compressed Jacobian products of ``g`` (flat to flat) at ``x``."""
    parts = []
    jvp = vjp = None
    for block, S in zip(blocks, seeds):
        if isinstance(block, Forward):
            if jvp is None:
                _, jvp = jax.linearize(g, x)
            parts.append(batched(jvp, S, batch_size).reshape(-1))
        else:
            if vjp is None:
                y, pull = jax.vjp(g, x)
                # the seed rows are in x's dtype; a cotangent must have the output's (a float32 result)
                vjp = lambda s, pull=pull, dt=y.dtype: pull(s.astype(dt))[0]  # noqa: E731
            parts.append(batched(vjp, S, batch_size).reshape(-1))
    return jnp.concatenate(parts) if len(parts) != 1 else parts[0]


@singledispatch
def decompressor(plan) -> tuple[Callable, tuple]:
    """``(fn, arrays)``: ``fn(flat, *arrays)`` gives the stored values in CSR order (jittable)."""
    raise TypeError(f"no JAX decompression for {type(plan).__name__}")


@decompressor.register
def _(plan: Gather):
    return (lambda flat, index: flat[index]), (plan.index,)


@decompressor.register
def _(plan: Substitution):
    arrays, width, dwidth = substitution_arrays(plan)
    nnz = plan.nnz
    return (lambda flat, *a: substitute(flat, a, nnz, width, dwidth)), arrays


def substitution_arrays(plan: Substitution) -> tuple[tuple, int, int]:
    """Device-independent arrays of the level-by-level substitution, padded so that every level
    reads fixed-size windows, and the window sizes (steps, dependencies)."""
    plan = plan.leveled
    lp, dp = plan.level_ptr, plan.dep_ptr
    width = int(np.diff(lp).max(initial=0)) or 1
    dwidth = int((dp[lp[1:]] - dp[lp[:-1]]).max(initial=0)) or 1
    nnz = plan.nnz
    pad = lambda a, w, fill: np.concatenate([a, np.full(w, fill, dtype=np.int64)])  # noqa: E731
    arrays = (pad(plan.step_pos, width, nnz), pad(plan.step_pos_t, width, nnz), pad(plan.step_src, width, 0),
              pad(plan.dep_pos, dwidth, nnz), pad(plan.dep_step, dwidth, 0), lp.astype(np.int64),
              dp.astype(np.int64))
    return arrays, width, dwidth


def substitute(flat: jax.Array, arrays: tuple, nnz: int, width: int, dwidth: int) -> jax.Array:
    """Acyclic-coloring substitution, one ``fori_loop`` iteration per level: every step of a
    level subtracts its (earlier-level) dependencies from its compressed entry."""
    pos, pos_t, src, dep_pos, dep_step, level_ptr, dep_ptr = arrays
    nlevels = level_ptr.shape[0] - 1
    slot = jnp.arange(width)
    dslot = jnp.arange(dwidth)

    def level(l, values):
        s0, s1 = level_ptr[l], level_ptr[l + 1]
        d0, d1 = dep_ptr[s0], dep_ptr[s1]
        on = slot < s1 - s0
        p = jnp.where(on, lax.dynamic_slice(pos, (s0,), (width,)), nnz)
        pt = jnp.where(on, lax.dynamic_slice(pos_t, (s0,), (width,)), nnz)
        b = flat[lax.dynamic_slice(src, (s0,), (width,))]
        don = dslot < d1 - d0
        dv = jnp.where(don, values[lax.dynamic_slice(dep_pos, (d0,), (dwidth,))], 0)
        seg = jnp.where(don, lax.dynamic_slice(dep_step, (d0,), (dwidth,)) - s0, 0)
        v = b - jnp.zeros(width, flat.dtype).at[seg].add(dv)
        return values.at[p].set(v).at[pt].set(v)

    values = lax.fori_loop(0, nlevels, level, jnp.zeros(nnz + 1, flat.dtype))
    return values[:nnz]
