"""Higher-order primitives: calls (``jit``, ``closed_call``, ``custom_jvp_call``,
``custom_vjp_call``, ``remat``) recurse into their jaxpr; ``cond`` takes the union of its branches
(only the taken branch when the index is known); ``scan`` is unrolled when short and otherwise,
like ``while``, iterated to a fixed point of the carry's sets. The inner equations record their
own second-order terms."""

from __future__ import annotations

import numpy as np

from ...detection import sets as S
from ..interpreter import Val
from ..table import CUSTOM, register

#: scans up to this length are interpreted iteration by iteration (exact per-iteration sets)
SCAN_UNROLL = 64

_JAXPR_KEYS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _inner(params):
    for key in _JAXPR_KEYS:
        if key in params:
            return params[key]
    raise KeyError(f"no jaxpr among the parameters {sorted(params)}")


def _finish(ctx, outs: list[Val]) -> list:
    ctx.out_values = [v.value for v in outs] if all(v.known for v in outs) else None
    return [v.sets for v in outs]


def call(ctx):
    return _finish(ctx, ctx.call(_inner(ctx.params), ctx.ins))


register(("pjit", "jit", "closed_call", "core_call", "call", "custom_jvp_call", "custom_jvp_call_jaxpr",
          "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "remat2", "checkpoint", "composite"), call, CUSTOM,
         "control")


def cond(ctx):
    branches = ctx.params["branches"]
    ops = ctx.ins[1:]
    index = ctx.value(0)
    if index is not None:
        k = int(np.clip(int(index), 0, len(branches) - 1))
        return _finish(ctx, ctx.call(branches[k], ops))
    results = [ctx.call(br, ops) for br in branches]
    sets = [v.sets for v in results[0]]
    for res in results[1:]:
        sets = [S.union([s, v.sets], v.size, ctx.n) if (s is not None or v.sets is not None) else None
                for s, v in zip(sets, res)]
    return sets


register("cond", cond, CUSTOM, "control")


def _forget(v: Val, sets) -> Val:
    return Val(v.shape, v.dtype, sets, None)


def _grown(old: list, new: list) -> bool:
    return any((0 if a is None else a.nnz) != (0 if b is None else b.nnz) for a, b in zip(old, new))


def _fixed_point(ctx, body, fixed: list[Val], carry: list[Val], extra: list[Val]) -> tuple[list, list[Val]]:
    """Iterate ``body(fixed, carry, extra)`` (carry outputs first) until the carry's sets stop growing."""
    sets = [v.sets for v in carry]
    while True:
        outs = ctx.call(body, fixed + [_forget(v, s) for v, s in zip(carry, sets)] + extra)
        new = [S.union([s, o.sets], v.size, ctx.n) if (s is not None or o.sets is not None) else None
               for s, o, v in zip(sets, outs, carry)]
        if not _grown(sets, new):
            return new, outs
        sets = new


def while_loop(ctx):
    p = ctx.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    body_consts, carry = ctx.ins[nc:nc + nb], ctx.ins[nc + nb:]
    sets, _ = _fixed_point(ctx, p["body_jaxpr"], list(body_consts), list(carry), [])
    return sets


register("while", while_loop, CUSTOM, "control")


def _slice_rows(v: Val, t: int) -> np.ndarray:
    per = v.size // v.shape[0]
    return np.arange(t * per, (t + 1) * per)


def scan_counts(params) -> tuple[int, int]:
    """The numbers of constants and carries among a ``scan``'s operands (then its scanned
    inputs): parameters ``num_consts``/``num_carry`` up to jax 0.10, a flat tree ``ft_in`` of
    (constants, carries, scanned inputs) from jax 0.11."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    if "ft_in" in params:
        consts, carry, _ = params["ft_in"].unpack()
        return len(consts), len(carry)
    raise NotImplementedError(f"asd.jax: a scan with the parameters {sorted(params)} (a jax version it does not know)")


def scan(ctx):
    p = ctx.params
    (nconst, ncarry), length = scan_counts(p), p["length"]
    consts = list(ctx.ins[:nconst])
    carry = list(ctx.ins[nconst:nconst + ncarry])
    xs = list(ctx.ins[nconst + ncarry:])
    body = p["jaxpr"]
    ny = len(ctx.eqn.outvars) - ncarry
    if length <= SCAN_UNROLL:
        ys: list[list] = [[None] * length for _ in range(ny)]
        steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
        for t in steps:
            x_t = [Val(v.shape[1:], v.dtype, None if v.sets is None else S.take_rows(v.sets, _slice_rows(v, t)),
                       None if v.value is None else np.asarray(v.value)[t]) for v in xs]
            outs = ctx.call(body, consts + carry + x_t)
            carry = outs[:ncarry]
            for k, y in enumerate(outs[ncarry:]):
                ys[k][t] = y
        stacked = []
        for k in range(ny):
            parts = [y.sets if y.sets is not None else ctx.empty(y.size) for y in ys[k]]
            stacked.append(S.vstack(parts) if any(y.sets is not None for y in ys[k]) else None)
        return [v.sets for v in carry] + stacked
    x_any = []
    for v in xs:
        per = v.size // max(v.shape[0], 1)
        s = None if v.sets is None else S.gather_union(v.sets, np.arange(v.size) % per, np.arange(v.size), per)
        x_any.append(Val(v.shape[1:], v.dtype, s, None))
    sets, outs = _fixed_point(ctx, body, consts, carry, x_any)
    ys = [None if y.sets is None else S.take_rows(y.sets, np.tile(np.arange(y.size), length))
          for y in outs[ncarry:]]
    return sets + ys


register("scan", scan, CUSTOM, "control")
