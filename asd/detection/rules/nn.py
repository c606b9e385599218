"""torch.nn.functional building blocks: normalizations, losses, embeddings, attention helpers.

Most of these are "dense over a slice" ops: an output element depends on every element of one
slice of the input (a layer-norm row, a group, a batch-norm channel, a softmax row) and on
per-channel parameters. :func:`slice_union` and :func:`to_out` are the shared helpers: the first
unions the sets of a tensor over the slices that fix the coordinates outside ``dims``, the second
maps each output element to its slice by those coordinates.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import sets as S
from .._core import Call, TracedTensor, is_differentiable_dtype
from ..table import aten_ops, register_rule
from .elementwise import broadcast_union, operand_sets

aten = torch.ops.aten


# -- helpers ------------------------------------------------------------------------------------------

def slice_union(call: Call, x, dims) -> tuple[object, list[int]]:
    """Union of ``x``'s sets over ``dims`` for each setting of the other coordinates.

    Returns the set matrix (one row per slice, row-major over the kept grid) and the kept grid's
    shape (``x``'s shape with ``dims`` set to 1); ``None`` sets when ``x`` carries none."""
    shape = list(x.shape)
    dims = sorted({d % max(len(shape), 1) for d in dims}) if shape else []
    kept = [1 if i in dims else s for i, s in enumerate(shape)]
    s = call.sets(x)
    if s is None:
        return None, kept
    nk = int(np.prod(kept)) if kept else 1
    groups = torch.arange(nk, dtype=torch.int64).reshape(kept).expand(shape).reshape(-1).numpy() if shape \
        else np.zeros(1, dtype=np.int64)
    return S.gather_union(s, groups, np.arange(x.numel()), nk), kept


def to_out(u, kept: list[int], out_shape) -> object:
    """Rows of ``u`` (one per slice of the kept grid) for every element of an output of
    ``out_shape`` whose leading coordinates index the kept grid (size-1 dims broadcast)."""
    if u is None:
        return None
    out_shape = list(out_shape)
    nk = int(np.prod(kept)) if kept else 1
    pos = torch.arange(nk, dtype=torch.int64).reshape(kept) if kept else torch.zeros((), dtype=torch.int64)
    if len(out_shape) < len(kept):  # the reduced dims were dropped: keep the leading ones
        pos = pos.reshape(out_shape + [1] * (len(kept) - len(out_shape))) if int(np.prod(out_shape or [1])) == nk \
            else pos.reshape(-1)[:1]
        pos = pos.reshape(out_shape) if int(np.prod(out_shape or [1])) == nk else pos.expand(out_shape or [])
    elif len(out_shape) > len(kept):
        pos = pos.reshape(kept + [1] * (len(out_shape) - len(kept)))
    rows = pos.expand(out_shape).reshape(-1).numpy() if out_shape else pos.reshape(-1).numpy()
    return S.take_rows(u, rows)


def channel_rows(out_shape, channel_dim: int) -> np.ndarray:
    """For each element of ``out_shape``, its coordinate along ``channel_dim``."""
    shape = list(out_shape)
    c = shape[channel_dim]
    view = [1] * len(shape)
    view[channel_dim] = c
    return torch.arange(c, dtype=torch.int64).reshape(view).expand(shape).reshape(-1).numpy()


def _per_channel(call: Call, t, out_shape, channel_dim: int = 1):
    """Sets of a per-channel parameter (shape ``(C,)``) broadcast over an output."""
    if t is None:
        return None
    s = call.sets(t)
    if s is None:
        return None
    return S.take_rows(s, channel_rows(out_shape, channel_dim))


def _full(call: Call, parts, rows: int):
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    row = S.union([S.full_row(p) for p in parts], 1, call.n)
    return S.take_rows(row, np.zeros(rows, dtype=np.int64))


def _maybe(o, s):
    return s if is_differentiable_dtype(o.dtype) else None


# -- normalizations -------------------------------------------------------------------------------------

def layer_norm_rule(call: Call) -> list:
    """native_layer_norm / _fused_rms_norm: each output depends on its normalized slice and on the
    weight and bias at its position in that slice; the statistics depend on the slice."""
    b = call.bound()
    x = b["input"]
    k = len(b["normalized_shape"])
    dims = list(range(x.dim() - k, x.dim()))
    u, kept = slice_union(call, x, dims)
    out = call.outs[0]
    main = S.union([to_out(u, kept, out.shape), operand_sets(call, b.get("weight"), out),
                    operand_sets(call, b.get("bias"), out)], out.numel(), call.n)
    res = [main]
    for o in call.outs[1:]:
        res.append(_maybe(o, to_out(u, kept, o.shape) if o.numel() == int(np.prod(kept)) else _full(call, [u], o.numel())))
    return res


def group_norm_rule(call: Call) -> list:
    b = call.bound()
    x, G = b["input"], int(b["group"])
    N, C = x.shape[0], x.shape[1]
    out = call.outs[0]
    s = call.sets(x)
    parts = []
    u = None
    if s is not None:
        per = x.numel() // max(N * G, 1)
        u = S.gather_union(s, np.repeat(np.arange(N * G), per), np.arange(x.numel()), N * G)
        rows = (np.arange(N)[:, None] * G + (channel_rows(out.shape[1:], 0).reshape(1, -1) // (C // G)))
        parts.append(S.take_rows(u, rows.reshape(-1)))
    parts += [_per_channel(call, b.get("weight"), out.shape), _per_channel(call, b.get("bias"), out.shape)]
    res = [S.union(parts, out.numel(), call.n)]
    for o in call.outs[1:]:
        res.append(_maybe(o, u if (u is not None and o.numel() == N * G) else _full(call, [u], o.numel())))
    return res


def batch_norm_rule(call: Call) -> list:
    """native_batch_norm, _native_batch_norm_legit(.no_stats), _batch_norm_with_update/_no_update.

    Training: an output depends on its whole channel (over batch and space); evaluation: on the same
    element and the channel's running statistics. Weight and bias are per channel."""
    b = call.bound()
    x = b["input"]
    name = call.func.overloadpacket.__name__
    training = True if name == "_batch_norm_with_update" else False if name == "_batch_norm_no_update" \
        else bool(b.get("training"))
    out = call.outs[0]
    C = x.shape[1] if x.dim() > 1 else 1
    chan = [_per_channel(call, b.get("weight"), out.shape), _per_channel(call, b.get("bias"), out.shape)]
    s = call.sets(x)
    stats = None
    if training:
        if s is not None:
            stats = S.gather_union(s, channel_rows(x.shape, 1), np.arange(x.numel()), C)
        main = [S.take_rows(stats, channel_rows(out.shape, 1)) if stats is not None else None]
    else:
        main = [s] + [_per_channel(call, b.get(k), out.shape) for k in ("running_mean", "running_var")]
        rs = [call.sets(b.get(k)) for k in ("running_mean", "running_var") if isinstance(b.get(k), TracedTensor)]
        stats = S.union(rs, C, call.n) if rs else None
    res = [S.union(main + chan, out.numel(), call.n)]
    for o in call.outs[1:]:
        if not is_differentiable_dtype(o.dtype) or o.numel() == 0 or stats is None:
            res.append(None)
        elif o.numel() == C:
            res.append(stats)
        else:
            res.append(_full(call, [stats], o.numel()))
    return res


# _fused_rms_norm: torch >= 2.8
register_rule(aten_ops("native_layer_norm", optional=["_fused_rms_norm"]), layer_norm_rule, second_order="nonlinear",
              family="nn")
register_rule(aten_ops("native_group_norm"), group_norm_rule, second_order="nonlinear", family="nn")
register_rule(aten_ops("native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update",
                       "_batch_norm_no_update", "_native_batch_norm_legit_no_training"),
              batch_norm_rule, second_order="nonlinear", family="nn")


# -- losses ---------------------------------------------------------------------------------------------

def pointwise_loss(call: Call) -> list:
    """Elementwise losses: ``reduction='none'`` keeps the broadcast structure, else one scalar."""
    b = call.bound()
    res = broadcast_union(call) if b.get("reduction", 1) == 0 else None
    if res is not None:
        return res
    parts = [call.sets(t) for t in b.values() if isinstance(t, TracedTensor)]
    return [_full(call, parts, 1) if is_differentiable_dtype(call.outs[0].dtype) else None]


def nll_loss_rule(call: Call) -> list:
    """nll_loss(2d)_forward: each loss term reads ``self[n, target[n], ...]`` (and ``weight[target]``)."""
    b = call.bound()
    x, target, weight = b["self"], b["target"], b.get("weight")
    reduction, ignore = b["reduction"], b["ignore_index"]
    out, total = call.outs
    s = call.sets(x)
    ws = call.sets(weight) if weight is not None else None
    t = target.primal if isinstance(target, TracedTensor) else target
    C = x.shape[0] if x.dim() == 1 else x.shape[1]
    ids = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape)
    if x.dim() == 1:
        ids = ids.unsqueeze(0)
    if t.is_meta:  # unknown classes: a term reads its whole class dimension
        picked = None
    else:
        tt = t.cpu().reshape(ids.shape[:1] + ids.shape[2:]).to(torch.int64)
        valid = tt != ignore
        picked = torch.gather(ids, 1, tt.clamp(0, C - 1).unsqueeze(1)).squeeze(1)
        picked = torch.where(valid, picked, -1)
        wpick = torch.where(valid, tt.clamp(0, C - 1), -1)
    terms = int(np.prod(ids.shape[:1] + ids.shape[2:]))
    parts = []
    if s is not None:
        if picked is None:
            grp = ids.movedim(1, -1).reshape(terms, C).numpy()
            parts.append(S.gather_union(s, np.repeat(np.arange(terms), C), grp.reshape(-1), terms))
        else:
            parts.append(S.take_rows(s, picked.reshape(-1).numpy()))
    if ws is not None:
        if picked is None:
            parts.append(S.take_rows(S.full_row(ws), np.zeros(terms, dtype=np.int64)))
        else:
            parts.append(S.take_rows(ws, wpick.reshape(-1).numpy()))
    per_term = S.union(parts, terms, call.n)
    total_sets = None if ws is None else _full(call, [ws], total.numel())
    if reduction == 0:
        return [per_term if out.numel() == terms else _full(call, [per_term], out.numel()), total_sets]
    extra = [ws] if (ws is not None and reduction == 1) else []
    return [_full(call, [per_term] + extra, out.numel()), total_sets]


def row_loss(call: Call) -> list:
    """multi_margin_loss, multilabel_margin_loss: each term reads its whole row of scores."""
    b = call.bound()
    x = b["self"]
    out = call.outs[0]
    u, kept = slice_union(call, x, [x.dim() - 1] if x.dim() else [])
    wt = b.get("weight")
    ws = call.sets(wt) if isinstance(wt, TracedTensor) else None
    if b.get("reduction", 1) == 0 and u is not None and out.numel() == u.shape[0]:
        main = u if ws is None else S.union([u, S.take_rows(S.full_row(ws), np.zeros(u.shape[0], dtype=np.int64))],
                                            u.shape[0], call.n)
    else:
        main = _full(call, [u, ws], out.numel())
    return [main] + [None] * (len(call.outs) - 1)


POINTWISE_LOSSES = aten_ops("mse_loss", "l1_loss", "huber_loss", "smooth_l1_loss", "soft_margin_loss",
                            "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
                            "poisson_nll_loss")
register_rule(POINTWISE_LOSSES, pointwise_loss, second_order="nonlinear", family="nn")
register_rule(aten_ops("nll_loss_forward", "nll_loss2d_forward"), nll_loss_rule, second_order="nonlinear",
              family="nn")
register_rule(aten_ops("multi_margin_loss", "multilabel_margin_loss_forward"), row_loss,
              second_order="nonlinear", family="nn")


# -- embeddings -----------------------------------------------------------------------------------------

def embedding_bag_rule(call: Call) -> list:
    """_embedding_bag(_forward_only): bag ``b``'s column ``j`` reads ``weight[i, j]`` for the indices
    ``i`` of the bag (minus padding) and their per-sample weights."""
    b = call.bound()
    weight, indices, offsets = b["weight"], b["indices"], b["offsets"]
    psw = b.get("per_sample_weights")
    out = call.outs[0]
    nb, D = out.shape[0], out.shape[1] if out.dim() > 1 else 1

    def known(t):
        p = t.primal if isinstance(t, TracedTensor) else t
        return None if p.is_meta else p.cpu().reshape(-1).numpy().astype(np.int64)

    idx, off = known(indices), known(offsets)
    sw, sp_ = call.sets(weight), call.sets(psw) if isinstance(psw, TracedTensor) else None
    if idx is None or off is None:
        res = _full(call, [sw, sp_], out.numel())
        return [res] + [None] * (len(call.outs) - 1)
    L = len(idx)
    ends = np.append(off[1:], L) if not b.get("include_last_offset") else off[1:]
    starts = off[:len(ends)]
    bag = np.full(L, -1, dtype=np.int64)
    for k, (s0, e0) in enumerate(zip(starts, ends)):
        bag[s0:e0] = k
    keep = (bag >= 0) & (idx != b.get("padding_idx", -1))
    kb, ki, kpos = bag[keep], idx[keep], np.nonzero(keep)[0]
    parts = []
    if sw is not None:
        rows = (kb[:, None] * D + np.arange(D)[None, :]).reshape(-1)
        cols = (ki[:, None] * D + np.arange(D)[None, :]).reshape(-1)
        parts.append(S.gather_union(sw, rows, cols, nb * D))
    if sp_ is not None:
        rows = (kb[:, None] * D + np.arange(D)[None, :]).reshape(-1)
        cols = np.repeat(kpos, D)
        parts.append(S.gather_union(sp_, rows, cols, nb * D))
    return [S.union(parts, out.numel(), call.n)] + [None] * (len(call.outs) - 1)


register_rule(aten_ops("_embedding_bag_forward_only", "_embedding_bag"), embedding_bag_rule,
              second_order="bilinear", family="nn")


# -- small structured ops -------------------------------------------------------------------------------

def glu_rule(call: Call) -> list:
    b = call.bound()
    x = b["self"]
    s = call.sets(x)
    if s is None:
        return [None]
    ids = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape)
    a, g = ids.chunk(2, dim=b["dim"])
    return [S.union([S.take_rows(s, a.reshape(-1).numpy()), S.take_rows(s, g.reshape(-1).numpy())],
                    a.numel(), call.n)]


def softmax_backward_rule(call: Call) -> list:
    """_softmax_backward_data / _log_softmax_backward_data: both operands along ``dim``."""
    b = call.bound()
    out = call.outs[0]
    parts = []
    for name in ("grad_output", "output"):
        t = b[name]
        u, kept = slice_union(call, t, [b["dim"]])
        parts.append(to_out(u, kept, out.shape))
    return [S.union(parts, out.numel(), call.n)]


def addr_rule(call: Call) -> list:
    b = call.bound()
    out = call.outs[0]
    m, p = out.shape
    parts = [operand_sets(call, b["self"], out)]
    s1, s2 = call.sets(b["vec1"]), call.sets(b["vec2"])
    if s1 is not None:
        parts.append(S.take_rows(s1, np.repeat(np.arange(m), p)))
    if s2 is not None:
        parts.append(S.take_rows(s2, np.tile(np.arange(p), m)))
    return [S.union(parts, out.numel(), call.n)]


def trace_rule(call: Call) -> list:
    x = call.bound()["self"]
    s = call.sets(x)
    if s is None:
        return [None]
    n = min(x.shape)
    diag = np.arange(n) * x.shape[1] + np.arange(n)
    return [S.gather_union(s, np.zeros(n, dtype=np.int64), diag, 1)]


def renorm_rule(call: Call) -> list:
    b = call.bound()
    x = b["self"]
    d = b["dim"] % x.dim()
    u, kept = slice_union(call, x, [i for i in range(x.dim()) if i != d])
    return [to_out(u, kept, call.outs[0].shape)]


def full_rule(call: Call) -> list:
    """Every output element depends on every element of every operand (dist, ...)."""
    b = call.bound()
    parts = [call.sets(t) for t in b.values() if isinstance(t, TracedTensor)]
    return [_full(call, parts, o.numel()) if is_differentiable_dtype(o.dtype) else None for o in call.outs]


def cdist_rule(call: Call) -> list:
    """out[..., i, j] reads x1[..., i, :] and x2[..., j, :] (batch dims broadcast); ``p = 0`` counts
    the differing coordinates (a zero derivative)."""
    b = call.bound()
    x1, x2 = b["x1"], b["x2"]
    out = call.outs[0]
    if b.get("p", 2.0) == 0:
        return [None]
    if b.get("p", 2.0) == float("inf") and call.local:
        exact = _cdist_max_at_point(call, x1, x2, out)
        if exact is not None:
            return [exact]
    P, R = out.shape[-2], out.shape[-1]
    batch = tuple(out.shape[:-2])
    nb = int(np.prod(batch)) if batch else 1
    parts = []
    for t, which in ((x1, 0), (x2, 1)):
        u, kept = slice_union(call, t, [t.dim() - 1])
        if u is None:
            continue
        rows_t = torch.arange(u.shape[0], dtype=torch.int64).reshape(kept[:-1])  # (..., P or R)
        rows_t = rows_t.expand(batch + tuple(kept[-2:-1]))
        if which == 0:
            r = rows_t.reshape(nb, P, 1).expand(nb, P, R)
        else:
            r = rows_t.reshape(nb, 1, R).expand(nb, P, R)
        parts.append(S.take_rows(u, r.reshape(-1).numpy()))
    return [S.union(parts, out.numel(), call.n)]


def _cdist_max_at_point(call: Call, x1, x2, out):
    """``p = inf`` at a point: ``out[..., i, j]`` reads the coordinates where ``|x1[i] - x2[j]|`` is
    largest (all of them on ties)."""
    vals = [t.primal if isinstance(t, TracedTensor) else t for t in (x1, x2)]
    if any(v.is_meta for v in vals):
        return None
    shape = tuple(out.shape) + (x1.shape[-1],)
    a, c = vals[0].cpu().unsqueeze(-2), vals[1].cpu().unsqueeze(-3)
    hit = ((a - c).abs() == out.cpu().unsqueeze(-1)).broadcast_to(shape).reshape(-1).numpy()
    rows = np.repeat(np.arange(out.numel()), x1.shape[-1])[hit]
    parts = []
    for t, ids in ((x1, lambda i: i.unsqueeze(-2)), (x2, lambda i: i.unsqueeze(-3))):
        st = call.sets(t)
        if st is not None:
            cols = ids(torch.arange(t.numel(), dtype=torch.int64).reshape(t.shape)).broadcast_to(shape)
            parts.append(S.gather_union(st, rows, cols.reshape(-1).numpy()[hit], out.numel()))
    return S.union(parts, out.numel(), call.n)


def cross_rule(call: Call) -> list:
    """linalg_cross: component ``k`` reads components ``k+1`` and ``k+2`` (mod 3) of both operands."""
    b = call.bound()
    out = call.outs[0]
    d = b["dim"] % out.dim()
    parts = []
    for name in ("self", "other"):
        t = b[name]
        s = call.sets(t)
        if s is None:
            continue
        ids = torch.broadcast_to(torch.arange(t.numel(), dtype=torch.int64).reshape(t.shape), out.shape)
        for shift in (1, 2):
            parts.append(S.take_rows(s, torch.roll(ids, -shift, d).reshape(-1).numpy()))
    return [S.union(parts, out.numel(), call.n)]


def trilinear_rule(call: Call) -> list:
    """_trilinear (F.bilinear): operands unsqueezed at their expand dims, multiplied, summed."""
    b = call.bound()
    ops = [b["i1"], b["i2"], b["i3"]]
    expands = [list(b["expand1"]), list(b["expand2"]), list(b["expand3"])]
    sumdim = set(b["sumdim"])
    full_dim = ops[0].dim() + len(expands[0])
    full = [1] * full_dim
    idss = []
    for t, ex in zip(ops, expands):
        ids = torch.arange(t.numel(), dtype=torch.int64).reshape(t.shape)
        for e in sorted(ex):
            ids = ids.unsqueeze(e)
        idss.append(ids)
        full = [max(a, c) for a, c in zip(full, ids.shape)]
    keep = [i for i in range(full_dim) if i not in sumdim]
    out_pos = torch.arange(int(np.prod([full[i] for i in keep])), dtype=torch.int64).reshape(
        [full[i] if i in keep else 1 for i in range(full_dim)]).expand(full).reshape(-1).numpy()
    out = call.outs[0]
    parts = []
    for t, ids in zip(ops, idss):
        s = call.sets(t)
        if s is None:
            continue
        parts.append(S.gather_union(s, out_pos, ids.expand(full).reshape(-1).numpy(), out.numel()))
    return [S.union(parts, out.numel(), call.n)]


#: largest one-hot probe (elements) run to find the pixels a constant grid reads
PROBE_MAX = 1 << 22


def grid_sampler_rule(call: Call) -> list:
    """grid_sampler_2d/3d: ``out[n, c, p]`` reads ``input[n, c, :]`` where the grid points and
    ``grid[n, p, :]`` (not in nearest mode, which is piecewise constant in the grid). Globally a
    grid point may be anywhere (a grid made inside ``f`` may be random: ``torch.rand``); traced
    locally, with a constant grid, exactly the pixels whose interpolation weight at ``grid[n, p]`` is
    nonzero, found by sampling one-hot images."""
    b = call.bound()
    x, grid = b["input"], b["grid"]
    out = call.outs[0]
    N, C = out.shape[0], out.shape[1]
    Pn = out.numel() // max(N * C, 1)
    parts = [_sampled_pixels(call, x, grid, out) if call.sets(x) is not None else None]
    ug, keptg = slice_union(call, grid, [grid.dim() - 1])
    if ug is not None and b.get("interpolation_mode") != 1:
        rows = (np.arange(N)[:, None, None] * Pn + np.zeros((1, C, 1), dtype=np.int64) + np.arange(Pn)[None, None, :])
        parts.append(S.take_rows(ug, rows.reshape(-1)))
    return [S.union(parts, out.numel(), call.n)]


def _sampled_pixels(call: Call, x, grid, out):
    N, C = out.shape[0], out.shape[1]
    Pn = out.numel() // max(N * C, 1)
    E = x.numel() // max(N * C, 1)
    g = grid.primal if isinstance(grid, TracedTensor) else grid
    if not call.local or g.is_meta or not call.constant(grid) or N * E * max(E, Pn) > PROBE_MAX:
        u, _ = slice_union(call, x, list(range(2, x.dim())))  # the grid's points are unknown
        return S.take_rows(u, np.repeat(np.arange(N * C), Pn))
    probe = torch.eye(E, dtype=torch.float64).reshape((1, E) + tuple(x.shape[2:])).expand((N, E) + tuple(x.shape[2:]))
    b = call.bound()
    w = call.func(probe.contiguous(), g.detach().cpu().to(torch.float64), b["interpolation_mode"], b["padding_mode"],
                  b["align_corners"])
    n, e, o = np.nonzero(w.reshape(N, E, Pn).numpy())
    rows = ((n[:, None] * C + np.arange(C)[None, :]) * Pn + o[:, None]).ravel()
    cols = ((n[:, None] * C + np.arange(C)[None, :]) * E + e[:, None]).ravel()
    return S.gather_union(call.sets(x), rows, cols, out.numel())


register_rule(aten_ops("glu"), glu_rule, second_order="nonlinear", family="nn")
register_rule(aten_ops("_softmax_backward_data", "_log_softmax_backward_data"), softmax_backward_rule,
              second_order="nonlinear", family="nn")
register_rule(aten_ops("addr"), addr_rule, second_order="bilinear", family="nn")
register_rule(aten_ops("trace"), trace_rule, second_order="linear", family="nn")
register_rule(aten_ops("renorm", "renorm_"), renorm_rule, second_order="nonlinear", family="nn")
register_rule(aten_ops("dist"), full_rule, second_order="nonlinear", family="nn")
register_rule(aten_ops("_cdist_forward", "_euclidean_dist"), cdist_rule, second_order="nonlinear", family="nn")
register_rule(aten_ops("linalg_cross"), cross_rule, second_order="bilinear", family="nn")
register_rule(aten_ops("_trilinear"), trilinear_rule, second_order="nonlinear", family="nn")
register_rule(aten_ops("grid_sampler_2d", "grid_sampler_3d", "grid_sampler"), grid_sampler_rule,
              second_order="nonlinear", family="nn")


def max_unpool_rule(call: Call) -> list:
    """max_unpool2d/3d: ``out[plane, indices[plane, k]]`` receives ``self[plane, k]``. Duplicate
    indices keep every candidate (autograd's gather backward reads all of them)."""
    b = call.bound()
    x, ind = b["self"], b["indices"]
    out = call.outs[0]
    s = call.sets(x)
    if s is None:
        return [None]
    d = len(b["output_size"])
    Sout = int(np.prod(out.shape[-d:]))
    planes = out.numel() // Sout
    Sin = x.numel() // planes
    p = ind.primal if isinstance(ind, TracedTensor) else ind
    if p.is_meta:
        u = S.gather_union(s, np.repeat(np.arange(planes), Sin), np.arange(x.numel()), planes)
        return [S.take_rows(u, np.repeat(np.arange(planes), Sout))]
    idx = p.cpu().reshape(planes, Sin).numpy().astype(np.int64)
    rows = (np.arange(planes)[:, None] * Sout + idx).reshape(-1)
    return [S.gather_union(s, rows, np.arange(x.numel()), out.numel())]


register_rule(aten_ops("max_unpool2d", "max_unpool3d"), max_unpool_rule, second_order="linear", family="nn")
