"""Indexing primitives: ``gather``, the ``scatter`` family, ``dynamic_slice`` and
``dynamic_update_slice``.

With known indices (constants, or any index under ``local=True``) the element map is found by
running the primitive itself on an array of element ids, so every dimension-number form is
handled the way JAX handles it; scatter targets come from the transpose of ``scatter_add`` (a
gather) applied to ids. With unknown indices every output element may depend on any element the
op could read (sound)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ...detection import sets as S
from ...errors import UnsupportedOpWarning
from ..table import LINEAR, NONLINEAR, register
from .movement import ids, stacked, take

#: ids are moved through float32 in two digits of this base (exact below 2**24 each)
_BASE = 4096


def _any_of(ctx, i: int, rows: int):
    """Every one of ``rows`` output elements depends on any element of input ``i``."""
    s = ctx.sets(i)
    return None if s is None else S.take_rows(S.full_row(s), np.zeros(rows, dtype=np.int64))


def gather(ctx):
    s = ctx.sets(0)
    m = ctx.out_size(0)
    if s is None:
        return [None]
    idx = ctx.value(1)
    if idx is None:
        return [_any_of(ctx, 0, m)]
    params = dict(ctx.params)
    if "fill_value" in params:
        params["fill_value"] = 0
    src = np.asarray(ctx.eqn.primitive.bind(jnp.asarray(ids(ctx.ins[0].shape) + 1, dtype=jnp.int32),
                                            jnp.asarray(idx), **params)).astype(np.int64) - 1
    return [take(s, np.where(src >= 0, src, -1))]


register("gather", gather, LINEAR, "indexing")


def scatter_targets(ctx) -> np.ndarray:
    """The flat output index every update element lands on (``-1``: dropped)."""
    operand, indices, updates = ctx.ins[0], ctx.value(1), ctx.ins[2]
    p = ctx.params

    def scatter_add(u):
        return jax.lax.scatter_add(jnp.zeros(operand.shape, jnp.float32), jnp.asarray(indices), u,
                                   p["dimension_numbers"], indices_are_sorted=p["indices_are_sorted"],
                                   unique_indices=p["unique_indices"], mode=p["mode"])

    back = jax.linear_transpose(scatter_add, jax.ShapeDtypeStruct(updates.shape, jnp.float32))
    out_ids = ids(operand.shape) + 1
    lo = np.asarray(back(jnp.asarray(out_ids % _BASE, jnp.float32))[0]).astype(np.int64)
    hi = np.asarray(back(jnp.asarray(out_ids // _BASE, jnp.float32))[0]).astype(np.int64)
    return (hi * _BASE + lo - 1).ravel()


def _plain_update(params) -> bool:
    """Whether a ``scatter``'s update function is the plain replace (``None`` or ``(x, y) -> y``),
    not a function of the operand's element (``x.at[i].apply(fn)``)."""
    uj = params.get("update_jaxpr")
    if uj is None:
        return True
    jaxpr = getattr(uj, "jaxpr", uj)
    return (not jaxpr.eqns and len(jaxpr.invars) == 2 and len(jaxpr.outvars) == 1
            and jaxpr.outvars[0] is jaxpr.invars[1])


def _scatter(replaces: bool):
    def fn(ctx):
        so, su = ctx.sets(0), ctx.sets(2)
        m = ctx.out_size(0)
        if so is None and su is None:
            return [None]
        if replaces and not _plain_update(ctx.params):
            return _scatter_apply(ctx)
        if ctx.value(1) is None:
            return [S.union([so, _any_of(ctx, 2, m)], m, ctx.n)]
        t = scatter_targets(ctx)
        hit = t >= 0
        parts = []
        if so is not None:
            if replaces:
                overwritten = np.zeros(m, dtype=bool)
                overwritten[t[hit]] = True
                so = S.take_rows(so, np.where(overwritten, -1, np.arange(m)))
            parts.append(so)
        if su is not None:
            parts.append(S.gather_union(su, t[hit], np.nonzero(hit)[0], m))
        return [S.union(parts, m, ctx.n)]

    return fn


def _scatter_apply(ctx):
    """A ``scatter`` whose update function reads the operand's element (``x.at[i].apply(fn)``): the
    function is not interpreted, so every output element may depend on every input element, at
    first and second order (sound but dense), with a warning."""
    from ..interpreter import conservative

    warnings.warn("a scatter with an update function of the operand (x.at[...].apply(fn)) is traced "
                  "conservatively: every output element is assumed to depend on every input element",
                  UnsupportedOpWarning, stacklevel=4)
    out = conservative(ctx)
    if ctx.hessian is not None and out[0] is not None:
        ctx.hessian.add_square(S.full_row(out[0]))
    return out


register("scatter", _scatter(True), LINEAR, "indexing")
register(("scatter-add", "scatter_add", "scatter-sub", "scatter_sub", "scatter-min", "scatter_min", "scatter-max",
          "scatter_max"), _scatter(False), LINEAR, "indexing")
register(("scatter-mul", "scatter_mul"), _scatter(False), NONLINEAR, "indexing")


def _starts(ctx, first: int, shape, sizes):
    vals = [ctx.value(i) for i in range(first, len(ctx.ins))]
    if any(v is None for v in vals):
        return None
    return [int(np.clip(int(v), 0, d - k)) for v, d, k in zip(vals, shape, sizes)]


def dynamic_slice(ctx):
    s = ctx.sets(0)
    if s is None:
        return [None]
    shape = ctx.ins[0].shape
    sizes = ctx.params["slice_sizes"]
    starts = _starts(ctx, 1, shape, sizes)
    if starts is None:
        return [_any_of(ctx, 0, ctx.out_size(0))]
    return [take(s, ids(shape)[tuple(slice(a, a + k) for a, k in zip(starts, sizes))])]


register("dynamic_slice", dynamic_slice, LINEAR, "indexing")


def dynamic_update_slice(ctx):
    so, su = ctx.sets(0), ctx.sets(1)
    m = ctx.out_size(0)
    if so is None and su is None:
        return [None]
    shape, ushape = ctx.ins[0].shape, ctx.ins[1].shape
    starts = _starts(ctx, 2, shape, ushape)
    if starts is None:
        return [S.union([so, _any_of(ctx, 1, m)], m, ctx.n)]
    allsets, offsets = stacked(ctx, (0, 1))
    out = ids(shape).copy()
    out[tuple(slice(a, a + k) for a, k in zip(starts, ushape))] = ids(ushape) + offsets[1]
    return [take(allsets, out)]


register("dynamic_update_slice", dynamic_update_slice, LINEAR, "indexing")
