"""Reductions, normalizations along a dimension, cumulative ops and sorting.

A reduction's output element depends on the union of the elements it reduces: the product of a
boolean grouping matrix with the operand's sets. Softmax-like ops broadcast that union back over
the reduced dimension; cumulative ops take prefix unions. Under local tracing, selections (max,
sort, topk, median) follow the indices they return, which is exact at that point.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import sets as S
from .._core import Call, TracedTensor, is_differentiable_dtype
from ..table import aten_ops, overloads_except, register_rule

aten = torch.ops.aten


def _dims(dim, ndim: int) -> list[int]:
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    dim = list(dim)
    if not dim:
        return list(range(ndim))
    return sorted({d % max(ndim, 1) for d in dim})


def group_ids(shape, dims: list[int]) -> tuple[np.ndarray, int]:
    """For each element of a tensor of ``shape``, the index of its slice when reducing ``dims``."""
    kept = [1 if i in dims else s for i, s in enumerate(shape)]
    ngroups = int(np.prod(kept)) if kept else 1
    pos = torch.arange(ngroups, dtype=torch.int64).reshape(kept) if kept else torch.zeros((), dtype=torch.int64)
    return pos.expand(tuple(shape)).reshape(-1).numpy(), ngroups


def reduce_sets(call: Call, x, dims: list[int]) -> tuple[object, np.ndarray, int]:
    """Union of ``x``'s sets over each slice of ``dims``: (sets per group, group of each elem, #groups)."""
    groups, ngroups = group_ids(tuple(x.shape), dims)
    s = call.sets(x)
    if s is None:
        return None, groups, ngroups
    return S.gather_union(s, groups, np.arange(x.numel()), ngroups), groups, ngroups


def reduction(call: Call) -> list:
    """Each output depends on the elements it reduces (dim/keepdim read from the schema)."""
    b = call.bound()
    x = b["self"]
    dims = _dims(b.get("dim"), x.dim())
    if call.local:
        exact = _local_selection(call, x, dims)
        if exact is not None:
            return exact
        exact = _reduction_at_point(call, x, dims)
        if exact is not None:
            return exact
        if call.func.overloadpacket in (aten.amax, aten.amin, aten.max, aten.min) and len(call.outs) == 1 \
                and isinstance(x, TracedTensor) and not x.primal.is_meta and call.sets(x) is not None:
            # the selected elements (all of them on ties) at this point
            groups, ngroups = group_ids(tuple(x.shape), dims)
            out = call.outs[0].reshape(-1).cpu()[torch.as_tensor(groups)]
            # a NaN result: every element of its slice (the formulas give them NaN or the gradient)
            hit = ((x.primal.reshape(-1).cpu() == out) | torch.isnan(out)).numpy()
            return [S.gather_union(call.sets(x), groups[hit], np.nonzero(hit)[0], ngroups)]
    u, _, ngroups = reduce_sets(call, x, dims)
    return [_bcast_groups(u, o, ngroups) if is_differentiable_dtype(o.dtype) else None for o in call.outs]


def _reduction_at_point(call: Call, x, dims: list[int]):
    """Local tracing of ``prod`` (an element's derivative is the product of the others: zero in a
    slice with two zeros, and for all but the zero in a slice with one) and of ``nansum``/``nanmean``
    (NaN elements do not count)."""
    packet = call.func.overloadpacket
    if packet not in (aten.prod, aten.nansum, aten.nanmean) or len(call.outs) != 1:
        return None
    if packet is aten.prod and not call.tracer.drops_vanishing:
        return None
    if not isinstance(x, TracedTensor) or x.primal.is_meta or call.sets(x) is None:
        return None
    v = x.primal.detach().reshape(-1).cpu()
    groups, ngroups = group_ids(tuple(x.shape), dims)
    if packet is aten.prod:
        zero = (v == 0).numpy()
        zeros_in = np.bincount(groups[zero], minlength=ngroups)[groups]
        # a NaN or an infinity beside a zero makes a NaN derivative, not a zero one
        unbounded_in = np.bincount(groups[~torch.isfinite(v).numpy()], minlength=ngroups)[groups]
        keep = (zeros_in == 0) | ((zeros_in == 1) & zero) | (unbounded_in > 0)
    else:
        keep = ~torch.isnan(v).numpy()
    return [_bcast_groups(S.gather_union(call.sets(x), groups[keep], np.nonzero(keep)[0], ngroups),
                          call.outs[0], ngroups)]


def _bcast_groups(u, out: torch.Tensor, ngroups: int):
    if u is None:
        return None
    if out.numel() == ngroups:
        return u
    # outputs of another size (topk's k values per slice): each belongs to one group, in order
    per = out.numel() // max(ngroups, 1)
    return S.take_rows(u, np.repeat(np.arange(ngroups), per)) if per * ngroups == out.numel() else \
        S.take_rows(S.full_row(u), np.zeros(out.numel(), dtype=np.int64))


def along_dim(call: Call) -> list:
    """Each output depends on its whole slice along ``dim`` (softmax, log_softmax, normalize)."""
    b = call.bound()
    x = b.get("self", b.get("input"))
    dims = _dims(b.get("dim"), x.dim())
    u, groups, _ = reduce_sets(call, x, dims)
    res = []
    for o in call.outs:
        if u is None or not is_differentiable_dtype(o.dtype):
            res.append(None)
        elif o.numel() == x.numel():
            res.append(S.take_rows(u, groups))
        else:
            og, _ = group_ids(tuple(o.shape), _dims(b.get("dim"), o.dim()))
            res.append(S.take_rows(u, og))
    return res


def cumulative(call: Call) -> list:
    """Prefix unions along ``dim`` (cumsum, cumprod, logcumsumexp, cummax, cummin)."""
    b = call.bound()
    x = b["self"]
    s = call.sets(x)
    if s is None:
        return [None] * len(call.outs)
    if call.local and call.func.overloadpacket in (aten.cummax, aten.cummin) and x.dim():
        exact = _local_selection(call, x, [b["dim"] % x.dim()])
        if exact is not None:
            return exact
    shape = tuple(x.shape) if x.dim() else (1,)
    d = b["dim"] % len(shape)
    length = shape[d]
    ids = torch.arange(x.numel(), dtype=torch.int64).reshape(shape).movedim(d, -1).reshape(-1, length)
    k, l = np.tril_indices(length)
    ids = ids.numpy()
    rows = ids[:, k].reshape(-1)
    cols = ids[:, l].reshape(-1)
    u = S.gather_union(s, rows, cols, x.numel())
    return [u if is_differentiable_dtype(o.dtype) else None for o in call.outs]


def norm_rule(call: Call) -> list:
    """``linalg_vector_norm`` / ``norm``: ord 0 counts nonzeros (zero derivative); ord 1 and +-inf
    are piecewise linear on real tensors (and, traced locally, +-inf depends on the elements
    attaining the extremum only); other orders, and every order on complex tensors, are smooth."""
    b = call.bound()
    x = b["self"]
    p = b["ord"] if "ord" in b else b.get("p")
    p = 2 if p is None else p
    if p == 0:
        return [None] * len(call.outs)
    if x.dtype.is_complex or p not in (1, math.inf, -math.inf):
        res = reduction(call)
        call.record_interaction(res)
        return res
    if call.local and p != 1 and isinstance(x, TracedTensor) and not x.primal.is_meta and call.sets(x) is not None:
        groups, ngroups = group_ids(tuple(x.shape), _dims(b.get("dim"), x.dim()))
        out = call.outs[0].reshape(-1).cpu()[torch.as_tensor(groups)]
        hit = ((x.primal.reshape(-1).cpu().abs() == out) | torch.isnan(out)).numpy()
        return [S.gather_union(call.sets(x), groups[hit], np.nonzero(hit)[0], ngroups)]
    return reduction(call)


def sort_like(call: Call) -> list:
    """Values of sort/topk/kthvalue/median depend on their slice; locally, on the selected element."""
    b = call.bound()
    x = b["self"]
    d = b.get("dim")
    if d is None:
        d = -1
    if call.local:
        exact = _local_selection(call, x, _dims(d, x.dim()))
        if exact is not None:
            return exact
    u, groups, ngroups = reduce_sets(call, x, _dims(d, x.dim()))
    res = []
    for o in call.outs:
        if u is None or not is_differentiable_dtype(o.dtype):
            res.append(None)
            continue
        og, _ = group_ids(tuple(o.shape), _dims(d, o.dim()) if o.dim() == x.dim() else [])
        res.append(S.take_rows(u, og) if o.dim() == x.dim() else _bcast_groups(u, o, ngroups))
    return res


def _local_selection(call: Call, x, dims: list[int]):
    """Exact local sets for ops returning (values, indices) along one dim: gather by the indices."""
    if len(call.outs) != 2 or call.outs[1].dtype != torch.int64 or len(dims) != 1:
        return None
    if not isinstance(x, TracedTensor) or x.primal.is_meta:
        return None
    s = call.sets(x)
    if s is None:
        return [None, None]
    values, indices = call.outs
    d = dims[0]
    idx = indices
    if idx.dim() < x.dim():
        idx = idx.unsqueeze(d)
    ids = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape)
    picked = torch.gather(ids, d, idx.cpu()).reshape(-1).numpy()
    return [S.take_rows(s, picked), None]


ELEMENTWISE_OVERLOADS = ("max.other", "min.other", "max.out", "min.out", "max.unary_out", "min.unary_out")
LINEAR_REDUCTIONS = aten_ops("sum", "mean", "nansum", "nanmean")
SELECTIONS = aten_ops("amax", "amin", "aminmax", "max", "min", "median", "nanmedian", "mode", "kthvalue")
SMOOTH_REDUCTIONS = aten_ops(
    "logsumexp", "var", "std", "var_mean", "std_mean",
    "special_logsumexp", "linalg_norm", "frobenius_norm", "nuclear_norm",
)
ALONG_DIM = aten_ops("_softmax", "_log_softmax", "softmax", "log_softmax", "special_softmax", "special_log_softmax",
                     optional=["_safe_softmax"])  # torch >= 2.5
SORTING = aten_ops("sort", "topk", "msort")

register_rule(LINEAR_REDUCTIONS, reduction, second_order="linear", family="reductions")
register_rule(overloads_except(SELECTIONS, *ELEMENTWISE_OVERLOADS), reduction, second_order="linear",
              family="reductions")
register_rule(SMOOTH_REDUCTIONS, reduction, second_order="nonlinear", family="reductions")
register_rule(aten.prod, reduction, second_order="nonlinear", interaction="multilinear", family="reductions")
register_rule(ALONG_DIM, along_dim, second_order="nonlinear", family="reductions")
register_rule(aten_ops("cumsum", "cumsum_"), cumulative, second_order="linear", family="reductions")
register_rule(aten_ops("cumprod", "cumprod_", "logcumsumexp"), cumulative, second_order="nonlinear",
              family="reductions")
# running maxima select elements: piecewise linear
register_rule(aten_ops("cummax", "cummin", "_cummax_helper", "_cummin_helper"), cumulative, second_order="linear",
              family="reductions")
# the table's class is that of ord 1 / inf on real tensors; the rule records the others' interactions
register_rule(aten_ops("linalg_vector_norm", "norm"), norm_rule, second_order="linear", family="reductions")
register_rule(SORTING, sort_like, second_order="linear", family="reductions")
