"""Higher-order primitives: calls (``jit``, ``closed_call``, ``custom_jvp_call``,
``custom_vjp_call``, ``remat``) recurse into their jaxpr; ``cond`` takes the union of its branches
(only the taken branch when the index is known); ``scan`` is unrolled when short and otherwise,
like ``while``, iterated to a fixed point of the carry's sets. The inner equations record their
own second-order terms."""

from __future__ import annotations

import warnings

import numpy as np

from ...detection import sets as S
from ...errors import UnsupportedOpWarning
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


register(("pjit", "jit", "closed_call", "core_call", "call", "remat", "remat2", "checkpoint", "composite"), call,
         CUSTOM, "control")


# -- functions with their own derivative rule ---------------------------------------------------
# JAX differentiates a custom_jvp / custom_vjp function by its rule, not by its body: a straight-
# through estimator (round forward, identity derivative) has a derivative its body lacks (found by
# an adversarial review: the pattern came out empty). The sets are the body's joined with the rule's:
# the JVP JAX builds from the rule, interpreted with tangents that carry their primals' sets; for a
# custom_vjp (no forward mode), the VJP, interpreted over the outputs' elements and transposed.

def _bound(ctx):
    """The call as a function of its operands (what ``jax.core.eval_jaxpr`` would bind)."""
    eqn = ctx.eqn
    bind = eqn.primitive.get_bind_params(eqn.params)
    # newer jax: the sub-functions travel among the parameters; older: (subfuns, params)
    subfuns, params = ((), bind) if isinstance(bind, dict) else bind

    def g(*args):
        out = eqn.primitive.bind(*subfuns, *args, **params)
        return list(out) if eqn.primitive.multiple_results else [out]
    return g


def _with(args, diff, d):
    args = list(args)
    for i, a in zip(diff, d):
        args[i] = a
    return args


def _rule_jvp_sets(ctx, diff: list[int]) -> list:
    import jax

    g = _bound(ctx)

    def jvp(primals, tangents):
        return jax.jvp(lambda *d: g(*_with(primals, diff, d)), [primals[i] for i in diff], list(tangents))[1]

    avals = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in ctx.ins]
    closed = jax.make_jaxpr(jvp)(avals, [avals[i] for i in diff])
    tangents = [Val(ctx.ins[i].shape, ctx.ins[i].dtype, ctx.sets(i)) for i in diff]
    return [v.sets for v in ctx.call(closed, [*ctx.ins, *tangents])]


def _rule_vjp_sets(ctx, diff: list[int]) -> list:
    import jax

    from ..interpreter import Interpreter, differentiable

    g = _bound(ctx)
    outs = [v.aval for v in ctx.eqn.outvars]
    wrt = [k for k, a in enumerate(outs) if differentiable(a.dtype)]

    def pull(primals, cts):
        _, back = jax.vjp(lambda *d: [g(*_with(primals, diff, d))[k] for k in wrt], *[primals[i] for i in diff])
        return back(list(cts))

    avals = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in ctx.ins]
    closed = jax.make_jaxpr(pull)(avals, [jax.ShapeDtypeStruct(outs[k].shape, outs[k].dtype) for k in wrt])
    sizes = [ctx.out_size(k) for k in wrt]
    m = sum(sizes)
    inner = Interpreter(m, local=ctx.local)  # index space: the elements of the outputs
    inner.in_rule = 1
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cts = [Val(outs[k].shape, outs[k].dtype, S.take_rows(S.identity(m), np.arange(starts[j], starts[j + 1])))
           for j, k in enumerate(wrt)]
    primals = [Val(v.shape, v.dtype, None, v.value) for v in ctx.ins]
    back = inner.run_closed(closed, [*primals, *cts])
    sets = [None] * len(outs)
    for j, k in enumerate(wrt):
        parts = []
        for i, ct in zip(diff, back):
            if ct.sets is None or ctx.sets(i) is None:
                continue
            # output element r of k reads input element e of i where e's cotangent reads r
            T = ct.sets[:, starts[j]:starts[j + 1]].T.tocsr()
            parts.append(S.matmul(T, ctx.sets(i)))
        sets[k] = S.union(parts, sizes[j], ctx.n) if parts else None
    return sets


def custom_derivative(ctx):
    """``custom_jvp_call`` / ``custom_vjp_call``: the body's sets joined with the rule's."""
    from ..interpreter import conservative

    interp = ctx.interp
    interp.custom_vjp = interp.custom_vjp or "vjp" in ctx.eqn.primitive.name
    body = ctx.call(_inner(ctx.params), ctx.ins)
    diff = [i for i in range(len(ctx.ins)) if ctx.sets(i) is not None]
    if not diff or (interp.in_rule and (ctx.hessian is None or interp.in_rule > 1)):
        # inside a rule's JVP, custom functions compute its primal and coefficients (no tangent passes
        # through them: JAX applied their rules already), which only the body's sets describe. A
        # Hessian differentiates those coefficients once more, through the custom function's own rule
        # (a straight-through rounding): one level down its rule's sets join the body's as everywhere
        # (deeper, none: a rule calling its own function, as logaddexp's does, would recurse)
        return _finish(ctx, body)
    outer_rule = interp.in_rule
    try:
        interp.in_rule = outer_rule + 1  # the depth of rules being interpreted
        rule = (_rule_vjp_sets if "vjp" in ctx.eqn.primitive.name else _rule_jvp_sets)(ctx, diff)
    except Exception as exc:  # noqa: BLE001 - a rule JAX cannot trace here: every output reads every input
        warnings.warn(f"the derivative rule of a {ctx.eqn.primitive.name} cannot be traced ({type(exc).__name__}: "
                      f"{str(exc)[:120]}); every output is assumed to depend on every input (sound but dense)",
                      UnsupportedOpWarning, stacklevel=4)
        rule = conservative(ctx)
        if ctx.hessian is not None:  # nor can its second derivatives be read: every pair may interact
            ctx.hessian.add_square(S.union([S.full_row(ctx.sets(i)) for i in diff if ctx.sets(i) is not None],
                                           1, ctx.n))
    finally:
        interp.in_rule = outer_rule
    if "vjp" in ctx.eqn.primitive.name and ctx.hessian is not None:
        # the pullback reads the residuals of its forward pass, in ways its first-order sets do not
        # show (g * roll(r, 1) with r = x): every pair of the call's inputs may interact
        warnings.warn(f"the Hessian through a {ctx.eqn.primitive.name} (a custom_vjp or custom_gradient "
                      "function) is traced conservatively: every pair of its inputs' dependencies is assumed "
                      "to interact", UnsupportedOpWarning, stacklevel=4)
        ctx.hessian.add_square(S.union([S.full_row(ctx.sets(i)) for i in diff], 1, ctx.n))
    ctx.out_values = [v.value for v in body] if all(v.known for v in body) else None
    return [S.union([v.sets, r], v.size, ctx.n) if (v.sets is not None or r is not None) else None
            for v, r in zip(body, rule)]


register(("custom_jvp_call", "custom_jvp_call_jaxpr", "custom_vjp_call", "custom_vjp_call_jaxpr"),
         custom_derivative, CUSTOM, "control")


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
