"""Reductions, windowed reductions, cumulative ops and sorting. Each output element is the union
of a group of input elements; with known values ``reduce_max``/``reduce_min`` keep only the
elements that attain the extremum and ``sort`` follows the permutation."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from ...detection import sets as S
from ..interpreter import Val
from ..table import LINEAR, NONLINEAR, register
from .movement import ids, pad_ids


def group_of(in_shape, axes) -> tuple[np.ndarray, int]:
    """For every input element, the id of the output element that reducing ``axes`` puts it in."""
    axes = tuple(a % max(len(in_shape), 1) for a in axes)
    kept = [d if i not in axes else 1 for i, d in enumerate(in_shape)]
    out = ids([d for i, d in enumerate(in_shape) if i not in axes]).reshape(kept)
    return np.broadcast_to(out, in_shape).ravel(), int(out.size)


def _reduce(ctx, keep: np.ndarray | None = None):
    s = ctx.sets(0)
    if s is None:
        return [None]
    groups, m = group_of(ctx.ins[0].shape, ctx.params["axes"])
    cols = np.arange(len(groups))
    if keep is not None:
        groups, cols = groups[keep], cols[keep]
    return [S.gather_union(s, groups, cols, m)]


def reduce_sum(ctx):
    return _reduce(ctx)


def _extremum(pick):
    def fn(ctx):
        x = ctx.value(0)
        if not ctx.local or x is None or ctx.sets(0) is None:
            return _reduce(ctx)
        axes = tuple(ctx.params["axes"])
        best = pick(x, axis=axes, keepdims=True)
        return _reduce(ctx, keep=(np.broadcast_to(best, x.shape) == x).ravel())

    return fn


register("reduce_sum", reduce_sum, LINEAR, "reductions")
register("reduce_max", _extremum(np.max), LINEAR, "reductions")
register("reduce_min", _extremum(np.min), LINEAR, "reductions")
register("reduce_prod", reduce_sum, NONLINEAR, "reductions")


def line_union(s, shape, axis: int, out_shape=None):
    """Every element (of ``out_shape``, default ``shape``) gets the union of its line along ``axis``."""
    groups, m = group_of(shape, (axis,))
    U = S.gather_union(s, groups, np.arange(len(groups)), m)
    if out_shape is None:
        return S.take_rows(U, groups)
    out_groups, _ = group_of(out_shape, (axis,))
    return S.take_rows(U, out_groups)


def cumulative(ctx):
    s = ctx.sets(0)
    if s is None:
        return [None]
    shape, axis = ctx.ins[0].shape, ctx.params["axis"]
    L = shape[axis]
    pre = int(np.prod(shape[:axis], dtype=np.int64))
    post = int(np.prod(shape[axis + 1:], dtype=np.int64))
    T = sp.tril(np.ones((L, L), dtype=bool)) if not ctx.params["reverse"] else sp.triu(np.ones((L, L), dtype=bool))
    D = sp.kron(sp.identity(pre, dtype=bool, format="csr"), sp.kron(T, sp.identity(post, dtype=bool), format="csr"),
                format="csr")
    return [S.matmul(D, s)]


register(("cumsum", "cummax", "cummin"), cumulative, LINEAR, "reductions")
register(("cumprod", "cumlogsumexp"), cumulative, NONLINEAR, "reductions")


def window_pairs(in_shape, out_shape, p) -> np.ndarray:
    """Input element id (``-1``: padding) under every window offset, shape ``(K, out_size)``."""
    nd = len(in_shape)
    base = p.get("base_dilation") or (1,) * nd
    wdil = p.get("window_dilation") or (1,) * nd
    strides = p["window_strides"]
    padded = pad_ids(ids(in_shape), [(lo, hi, b - 1) for (lo, hi), b in zip(p["padding"], base)])
    out = []
    for w in itertools.product(*(range(k) for k in p["window_dimensions"])):
        sl = tuple(slice(o * d, o * d + (n - 1) * st + 1, st) for o, d, n, st in zip(w, wdil, out_shape, strides))
        out.append(padded[sl].ravel())
    return np.stack(out) if out else np.zeros((0, int(np.prod(out_shape))), dtype=np.int64)


def reduce_window(ctx):
    outs = []
    nops = len(ctx.eqn.outvars)
    for k in range(nops):
        s = ctx.sets(k)
        if s is None:
            outs.append(None)
            continue
        cols = window_pairs(ctx.ins[k].shape, ctx.out_shapes[k], ctx.params)
        rows = np.broadcast_to(np.arange(cols.shape[1]), cols.shape)
        outs.append(S.gather_union(s, rows, cols, ctx.out_size(k)))
    for k in range(nops):  # the generic primitive also takes one initial value per operand
        init = ctx.sets(nops + k) if len(ctx.ins) > nops + k else None
        if init is not None:
            m = ctx.out_size(k)
            outs[k] = S.union([outs[k], S.take_rows(init, np.zeros(m, dtype=np.int64))], m, ctx.n)
    if nops > 1:  # a reducer of several operands may mix them (a complex product): each output reads all
        every = S.union(outs, ctx.out_size(0), ctx.n)
        outs = [every] * nops
    return outs


register(("reduce_window_sum", "reduce_window_max", "reduce_window_min"), reduce_window, LINEAR, "reductions")
register("reduce_window", reduce_window, NONLINEAR, "reductions")


def sort(ctx):
    nops = len(ctx.ins)
    d = ctx.params["dimension"]
    shape = ctx.ins[0].shape
    vals = [ctx.value(i) for i in range(nops)]
    keys_known = all(v is not None for v in vals[:ctx.params["num_keys"]])
    if ctx.local and keys_known and any(ctx.sets(i) is not None for i in range(nops)):
        operands = [jnp.asarray(v) if v is not None else jnp.zeros(shape, ctx.ins[i].dtype)
                    for i, v in enumerate(vals)]
        res = ctx.eqn.primitive.bind(*operands, jnp.asarray(ids(shape), jnp.int32), dimension=d,
                                     is_stable=ctx.params["is_stable"],
                                     num_keys=ctx.params["num_keys"])
        perm = np.asarray(res[-1]).astype(np.int64).ravel()
        if ctx.params["is_stable"]:
            return [None if ctx.sets(i) is None else S.take_rows(ctx.sets(i), perm) for i in range(nops)]
        # an unstable sort may order equal keys either way: a position reads any element of its tie
        rows, cols = _tie_groups(perm, [np.asarray(r) for r in res[:ctx.params["num_keys"]]], shape, d)
        return [None if ctx.sets(i) is None else S.gather_union(ctx.sets(i), rows, cols, int(perm.size))
                for i in range(nops)]
    return [None if ctx.sets(i) is None else line_union(ctx.sets(i), shape, d) for i in range(nops)]


def _tie_groups(perm: np.ndarray, sorted_keys: list, shape, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, cols)``: output position ``rows[k]`` may hold input element ``cols[k]``, for a sort
    whose output position ``p`` holds input ``perm[p]`` and whose sorted keys are ``sorted_keys``:
    every element of a run of equal keys (NaNs equal to each other) along ``d``, in its line."""
    m = shape[d]
    lines = lambda a: np.moveaxis(np.asarray(a).reshape(shape), d, -1).reshape(-1, max(m, 1))  # noqa: E731
    out, src = lines(ids(shape)), lines(perm)
    tied = np.ones(out.shape, dtype=bool)
    tied[:, 0] = False
    for k in sorted_keys:
        k = lines(k)
        same = k[:, 1:] == k[:, :-1]
        if np.issubdtype(k.dtype, np.inexact):
            same |= np.isnan(k[:, 1:]) & np.isnan(k[:, :-1])
        tied[:, 1:] &= same
    label = np.cumsum(~tied.ravel()) - 1  # runs of ties, numbered across lines
    order = np.argsort(label, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(label[order]) != 0])
    sizes = np.diff(np.r_[starts, label.size])
    rows, cols = [out.ravel()[sizes[label] == 1]], [src.ravel()[sizes[label] == 1]]
    for s0, g in zip(starts[sizes > 1], sizes[sizes > 1]):
        members = order[s0:s0 + g]
        rows.append(np.repeat(out.ravel()[members], g))
        cols.append(np.tile(src.ravel()[members], g))
    return np.concatenate(rows), np.concatenate(cols)


register("sort", sort, LINEAR, "reductions")


def top_k(ctx):
    s = ctx.sets(0)
    if s is None:
        return [None, None]
    shape = ctx.ins[0].shape
    axis = ctx.params.get("axis", -1)  # the last axis before JAX had the parameter
    return [line_union(s, shape, axis % len(shape), ctx.out_shapes[0]), None]


register("top_k", top_k, LINEAR, "reductions")


def _reducer_dependencies(ctx, nops: int) -> np.ndarray:
    """``R[k, j]``: whether result ``k`` of the generic ``reduce`` may depend on operand (and
    initial value) ``j``. The reducer jaxpr is interpreted once on ``2 * nops`` one-element tags
    (accumulators, then elements) and its accumulator feedback closed transitively."""
    from ..interpreter import Interpreter

    inner = Interpreter(2 * nops, local=False, strict=ctx.interp.strict)
    tags = [Val((), ctx.ins[j % nops].dtype, S._csr(np.array([0, 1], dtype=S.INDEX), np.array([j], dtype=S.INDEX),
                                                      (1, 2 * nops))) for j in range(2 * nops)]
    outs = inner.run_closed(ctx.params["jaxpr"], tags)
    D = np.zeros((nops, 2 * nops), dtype=bool)
    for k, v in enumerate(outs):
        if v.sets is not None:
            D[k, v.sets.indices] = True
    acc, elem = D[:, :nops], D[:, nops:]
    reach = np.eye(nops, dtype=bool)
    for _ in range(nops):  # paths through at most nops accumulators
        reach = reach | (reach.astype(np.int64) @ acc.astype(np.int64) > 0)
    return (reach.astype(np.int64) @ (elem | acc).astype(np.int64) > 0) | reach


def reduce_generic(ctx):
    """``lax.reduce`` with any reducer: result ``k`` is the union, over its reduction group, of the
    operands it may depend on (read from the reducer jaxpr), plus their initial values."""
    nops = len(ctx.eqn.outvars)
    R = _reducer_dependencies(ctx, nops)
    groups, m = group_of(ctx.ins[0].shape, ctx.params["dimensions"])
    cols = np.arange(len(groups))
    outs = []
    for k in range(nops):
        parts = []
        for j in np.nonzero(R[k])[0]:
            s, init = ctx.sets(j), ctx.sets(nops + j)
            if s is not None:
                parts.append(S.gather_union(s, groups, cols, m))
            if init is not None:
                parts.append(S.take_rows(init, np.zeros(m, dtype=np.int64)))
        outs.append(S.union(parts, m, ctx.n) if parts else None)
    return outs


register("reduce", reduce_generic, NONLINEAR, "reductions")


def _plain_windows(p: dict) -> dict:
    nd = len(p["window_dimensions"])
    return dict(p, base_dilation=p.get("base_dilation") or (1,) * nd,
                window_dilation=p.get("window_dilation") or (1,) * nd)


def select_and_gather_add(ctx):
    """``select_and_gather_add(t, x)``: each window's element of ``t`` where ``x`` is extremal (the
    JVP of a max/min pooling); the choice is piecewise constant in ``x``."""
    s = ctx.sets(0)
    if s is None:
        return [None]
    cols = window_pairs(ctx.ins[0].shape, ctx.out_shapes[0], _plain_windows(ctx.params))
    rows = np.broadcast_to(np.arange(cols.shape[1]), cols.shape)
    return [S.gather_union(s, rows, cols, ctx.out_size(0))]


def select_and_scatter_add(ctx):
    """``select_and_scatter_add(g, x)``: every window's ``g`` added onto the element of ``x`` it
    selects (the VJP of a max/min pooling): an element of the result gathers the windows covering it."""
    s = ctx.sets(0)
    if s is None:
        return [None]
    cols = window_pairs(ctx.ins[1].shape, ctx.ins[0].shape, _plain_windows(ctx.params))
    windows = np.broadcast_to(np.arange(cols.shape[1]), cols.shape)
    inside = cols >= 0  # (window offsets that fall on padding select nothing)
    return [S.gather_union(s, cols[inside], windows[inside], ctx.out_size(0))]


register("select_and_gather_add", select_and_gather_add, LINEAR, "reductions")
register("select_and_scatter_add", select_and_scatter_add, LINEAR, "reductions")
