"""Movement primitives: every output element is one input element (or a padding value). The
element map is computed with numpy on an array of element ids and applied with one row gather."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...detection import sets as S
from ..table import LINEAR, register


def ids(shape) -> np.ndarray:
    """Row-major element ids of an array of ``shape``."""
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)


def take(s, idx: np.ndarray):
    """Rows ``idx`` of ``s`` (``-1``: an empty row); ``None`` stays ``None``."""
    return None if s is None else S.take_rows(s, np.asarray(idx).ravel())


def same_order(ctx):
    return [ctx.sets(0)]


register(("squeeze", "expand_dims"), same_order, LINEAR, "movement")


def reshape(ctx):
    """``reshape``; with ``dimensions`` (``jnp.reshape(..., order="F")``) the input is transposed by
    them first."""
    dims = ctx.params.get("dimensions")
    if dims is None or tuple(dims) == tuple(range(len(ctx.ins[0].shape))):
        return [ctx.sets(0)]
    return [take(ctx.sets(0), ids(ctx.ins[0].shape).transpose(dims))]


register("reshape", reshape, LINEAR, "movement")


def broadcast_in_dim(ctx):
    shape, dims = ctx.params["shape"], ctx.params["broadcast_dimensions"]
    in_shape = ctx.ins[0].shape
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d] = in_shape[i]
    return [take(ctx.sets(0), np.broadcast_to(ids(in_shape).reshape(view), shape))]


register("broadcast_in_dim", broadcast_in_dim, LINEAR, "movement")


def transpose(ctx):
    return [take(ctx.sets(0), ids(ctx.ins[0].shape).transpose(ctx.params["permutation"]))]


register("transpose", transpose, LINEAR, "movement")


def slice_(ctx):
    p = ctx.params
    strides = p["strides"] or (1,) * len(p["start_indices"])
    sl = tuple(slice(a, b, c) for a, b, c in zip(p["start_indices"], p["limit_indices"], strides))
    return [take(ctx.sets(0), ids(ctx.ins[0].shape)[sl])]


register("slice", slice_, LINEAR, "movement")


def rev(ctx):
    return [take(ctx.sets(0), np.flip(ids(ctx.ins[0].shape), axis=tuple(ctx.params["dimensions"])))]


register("rev", rev, LINEAR, "movement")


def pad_ids(in_ids: np.ndarray, config, fill: int = -1) -> np.ndarray:
    """``lax.pad`` applied to an id array (negative padding crops), padding with ``fill``."""
    out_shape = [lo + hi + d + max(d - 1, 0) * it for d, (lo, hi, it) in zip(in_ids.shape, config)]
    out = np.full(out_shape, fill, dtype=np.int64)
    src, dst = [], []
    for d, (lo, _, it) in zip(in_ids.shape, config):
        pos = lo + np.arange(d) * (it + 1)
        ok = np.nonzero((pos >= 0) & (pos < lo + _ + d + max(d - 1, 0) * it))[0]
        src.append(ok)
        dst.append(pos[ok])
    out[np.ix_(*dst)] = in_ids[np.ix_(*src)]
    return out


def pad(ctx):
    m = ctx.out_size(0)
    idx = pad_ids(ids(ctx.ins[0].shape), ctx.params["padding_config"]).ravel()
    parts = [take(ctx.sets(0), idx)]
    if ctx.sets(1) is not None:
        parts.append(take(ctx.sets(1), np.where(idx < 0, 0, -1)))
    return [S.union(parts, m, ctx.n)]


register("pad", pad, LINEAR, "movement")


def stacked(ctx, which=None):
    """The sets of the operands ``which`` stacked (empty rows for those without sets) and the
    row offset of each."""
    which = range(len(ctx.ins)) if which is None else which
    mats, offsets, off = [], [], 0
    for i in which:
        s = ctx.sets(i)
        mats.append(s if s is not None else ctx.empty(ctx.ins[i].size))
        offsets.append(off)
        off += ctx.ins[i].size
    return S.vstack(mats), offsets


def joining(join: Callable, axis: str) -> Callable:
    """The rule of a primitive that joins its operands with ``join(ids, axis=ctx.params[axis])``
    (``np.concatenate``, ``np.stack``)."""

    def rule(ctx):
        if all(ctx.sets(i) is None for i in range(len(ctx.ins))):
            return [None]
        allsets, offsets = stacked(ctx)
        parts = [ids(v.shape) + o for v, o in zip(ctx.ins, offsets)]
        return [take(allsets, join(parts, axis=ctx.params[axis]))]

    return rule


concatenate = joining(np.concatenate, "dimension")
register("concatenate", concatenate, LINEAR, "movement")


def split(ctx):
    s = ctx.sets(0)
    if s is None:
        return [None] * len(ctx.eqn.outvars)
    bounds = np.cumsum(ctx.params["sizes"])[:-1]
    return [take(s, part) for part in np.split(ids(ctx.ins[0].shape), bounds, axis=ctx.params["axis"])]


register("split", split, LINEAR, "movement")


stack = joining(np.stack, "axis")
register("stack", stack, LINEAR, "movement")


def tile(ctx):
    reps = tuple(ctx.params["reps"])
    in_ids = ids(ctx.ins[0].shape)
    return [take(ctx.sets(0), np.tile(in_ids.reshape((1,) * (len(reps) - in_ids.ndim) + in_ids.shape), reps))]


register("tile", tile, LINEAR, "movement")


def unstack(ctx):
    s = ctx.sets(0)
    axis = ctx.params["axis"]
    in_ids = ids(ctx.ins[0].shape)
    return [take(s, np.take(in_ids, k, axis=axis)) for k in range(in_ids.shape[axis])]


register("unstack", unstack, LINEAR, "movement")
