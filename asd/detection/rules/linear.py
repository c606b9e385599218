"""Matrix products, convolutions and pooling.

Products: ``C[b, i, j]`` depends on ``A[b, i, l]`` and ``B[b, l, j]`` for the ``l`` where the other
operand is structurally nonzero. Dense operands (traced or constant) are structurally full, so the
dependence on ``A`` is a row union broadcast over ``j`` (and on ``B`` a column union over ``i``),
computed in time linear in the sets' size; constants in a torch sparse layout keep their structure.
Under local tracing a dense 2-D constant (one that depends on no input: a closure tensor, a
module's weight, a tensor built inside ``f``) is read at its values: its zeros are structural, as a
sparse layout's are (a GCN's dense adjacency ``A @ H``). Globally it stays full, since a prepared
operator lets a constant's values change between calls.

Convolutions and pooling: index arithmetic per spatial dimension gives the (output position,
kernel offset, input position) triples inside the input; channels follow the groups.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from .. import sets as S
from .._core import Call, TracedTensor
from ..table import aten_ops, register_rule
from .elementwise import operand_sets

aten = torch.ops.aten

_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def structure(t) -> sp.csr_matrix | None:
    """The boolean pattern of a 2-D constant in a torch sparse layout; ``None`` means full."""
    if isinstance(t, TracedTensor) or not isinstance(t, torch.Tensor) or t.layout not in _SPARSE_LAYOUTS:
        return None
    if t.dim() != 2:
        return None
    if t.layout == torch.sparse_coo:
        idx = t.coalesce().indices().cpu().numpy() if not t.is_coalesced() else t.indices().cpu().numpy()
        m = sp.csr_matrix((np.ones(idx.shape[1], dtype=bool), (idx[0], idx[1])), shape=tuple(t.shape))
    elif t.layout == torch.sparse_csr:
        # copied: sum_duplicates sorts in place, and these arrays are the tensor's own memory
        m = sp.csr_matrix((np.ones(t.col_indices().numel(), dtype=bool), t.col_indices().cpu().numpy(),
                           t.crow_indices().cpu().numpy()), shape=tuple(t.shape), copy=True)
    else:
        m = sp.csr_matrix(t.to_sparse_coo().to_dense().cpu().numpy() != 0)
    m.sum_duplicates()
    return m.astype(bool)


#: under local tracing, a dense constant's zeros are used when at most this fraction of its entries
#: is nonzero; a denser one is taken as full (a superset of the local pattern: still sound), since
#: its masked product costs about its density times the operand's size more than the row unions
LOCAL_MASK_DENSITY = 0.5


def local_structure(call: Call, t) -> sp.csr_matrix | None:
    """The pattern of ``t`` for a product: :func:`structure`, or, traced locally, the nonzeros of a
    dense 2-D constant's values (``None``: full)."""
    mask = structure(t)
    if mask is not None or not call.local or not isinstance(t, torch.Tensor) or not call.constant(t):
        return mask
    values = t.primal if isinstance(t, TracedTensor) else t
    if values.dim() != 2 or values.is_meta or values.layout != torch.strided:
        return None
    nz = (values.detach() != 0).cpu().numpy()
    if nz.sum() > LOCAL_MASK_DENSITY * nz.size:
        return None
    return sp.csr_matrix(nz)


def batched_product(call: Call, A, B, out_rows: int, shape3: tuple[int, int, int, int]):
    """Sets of ``A @ B`` with ``A`` of shape (b, m, k) and ``B`` of shape (b, k, p), flattened."""
    b, m, k, p = shape3
    parts = []
    sA, sB = call.sets(A), call.sets(B)
    if sA is not None:
        mask = structure(B) if b != 1 else local_structure(call, B)
        if mask is None:
            groups = np.repeat(np.arange(b * m), k)
            rowu = S.gather_union(sA, groups, np.arange(b * m * k), b * m)
            parts.append(S.take_rows(rowu, np.repeat(np.arange(b * m), p)))
        else:
            D = sp.kron(sp.identity(m, dtype=bool, format="csr"), mask.T.tocsr(), format="csr")
            parts.append(S.matmul(D, sA))
    if sB is not None:
        mask = structure(A) if b != 1 else local_structure(call, A)
        if mask is None:
            groups = (np.arange(b)[:, None, None] * p + np.arange(p)[None, None, :]) + np.zeros((1, k, 1), dtype=np.int64)
            colu = S.gather_union(sB, groups.reshape(-1), np.arange(b * k * p), b * p)
            rows = (np.arange(b)[:, None, None] * p + np.arange(p)[None, None, :]) + np.zeros((1, m, 1), dtype=np.int64)
            parts.append(S.take_rows(colu, rows.reshape(-1)))
        else:
            D = sp.kron(mask, sp.identity(p, dtype=bool, format="csr"), format="csr")
            parts.append(S.matmul(D, sB))
    return S.union(parts, out_rows, call.n)


def _plus_bias(call: Call, prod_sets, bias, out: torch.Tensor):
    return S.union([prod_sets, operand_sets(call, bias, out)], out.numel(), call.n)


def mm_rule(call: Call) -> list:
    b = call.bound()
    out = call.outs[0]
    f = call.func.overloadpacket
    if f in (aten.mm, aten.addmm, aten._addmm_activation, aten._sparse_addmm, aten._sparse_mm):
        A, B = (b.get("self", b.get("sparse")), b.get("mat2", b.get("dense"))) if f in (aten.mm, aten._sparse_mm) \
            else (b["mat1"], b["mat2"])
        (m, k), p = A.shape, B.shape[1]
        res = batched_product(call, A, B, out.numel(), (1, m, k, p))
    elif f in (aten.bmm, aten.baddbmm):
        A, B = (b["self"], b["mat2"]) if f is aten.bmm else (b["batch1"], b["batch2"])
        bs, m, k = A.shape
        res = batched_product(call, A, B, out.numel(), (bs, m, k, B.shape[2]))
    elif f in (aten.mv, aten.addmv):
        A, v = (b["self"], b["vec"]) if f is aten.mv else (b["mat"], b["vec"])
        m, k = A.shape
        res = batched_product(call, A, v, out.numel(), (1, m, k, 1))
    elif f in (aten.dot, aten.vdot, aten.inner):
        A, B = b["self"], b.get("tensor", b.get("other"))
        res = batched_product(call, A, B, 1, (1, 1, A.numel(), 1))
    else:  # addbmm: the batch is summed
        A, B = b["batch1"], b["batch2"]
        bs, m, k = A.shape
        p = B.shape[2]
        per = batched_product(call, A, B, bs * m * p, (bs, m, k, p))
        res = S.gather_union(per, np.tile(np.arange(m * p), bs), np.arange(bs * m * p), m * p)
    if f in (aten.addmm, aten.baddbmm, aten.addmv, aten.addbmm, aten._addmm_activation, aten._sparse_addmm):
        res = _plus_bias(call, res, b["self"], out)
    return [res]


# -- convolution and pooling ------------------------------------------------------------------------

def _axis_pairs(n_from: int, n_to: int, kernel: int, stride: int, padding: int, dilation: int):
    """(from, k, to) with to = from*stride - padding + k*dilation inside [0, n_to)."""
    f = np.arange(n_from)[:, None]
    kk = np.arange(kernel)[None, :]
    to = f * stride - padding + kk * dilation
    ok = (to >= 0) & (to < n_to)
    fr, kr = np.nonzero(ok)
    return fr, kr, to[fr, kr]


def _adaptive_pairs(n_out: int, n_in: int):
    starts = (np.arange(n_out) * n_in) // n_out
    ends = -((-(np.arange(n_out) + 1) * n_in) // n_out)
    outs, ins = [], []
    for o in range(n_out):
        r = np.arange(starts[o], ends[o])
        outs.append(np.full(len(r), o))
        ins.append(r)
    o = np.concatenate(outs)
    i = np.concatenate(ins)
    return o, np.zeros_like(o), i


def _combine(axis_pairs, shape_a, shape_k, shape_b):
    """Cartesian product of per-axis (a, k, b) triples, as flat indices in the three grids."""
    a = np.zeros(1, dtype=np.int64)
    k = np.zeros(1, dtype=np.int64)
    bb = np.zeros(1, dtype=np.int64)
    for (pa, pk, pb), na, nk, nb in zip(axis_pairs, shape_a, shape_k, shape_b):
        a = (a[:, None] * na + pa[None, :]).reshape(-1)
        k = (k[:, None] * nk + pk[None, :]).reshape(-1)
        bb = (bb[:, None] * nb + pb[None, :]).reshape(-1)
    return a, k, bb


def _as_list(v, d: int):
    if isinstance(v, int):
        return [v] * d
    v = list(v)
    return v * d if len(v) == 1 else v


def conv_rule(call: Call) -> list:
    b = call.bound()
    x, w, bias = b["input"], b["weight"], b.get("bias")
    out = call.outs[0]
    transposed = bool(b["transposed"])
    G = int(b["groups"])
    d = x.dim() - 2
    stride, padding, dilation = (_as_list(b[k], d) for k in ("stride", "padding", "dilation"))
    N, C = x.shape[0], x.shape[1]
    O = out.shape[1]
    s_in, s_out, ks = list(x.shape[2:]), list(out.shape[2:]), list(w.shape[2:])
    if not transposed:
        pairs = [_axis_pairs(s_out[i], s_in[i], ks[i], stride[i], padding[i], dilation[i]) for i in range(d)]
        y, kf, xi = _combine(pairs, s_out, ks, s_in)
    else:
        pairs = [_axis_pairs(s_in[i], s_out[i], ks[i], stride[i], padding[i], dilation[i]) for i in range(d)]
        xi, kf, y = _combine(pairs, s_in, ks, s_out)
    Sout, Sin, K = int(np.prod(s_out)), int(np.prod(s_in)), int(np.prod(ks))
    Cg, Og = C // G, O // G
    parts = []
    o_idx = np.arange(O)
    out_n = np.arange(N)[:, None, None]
    out_o = o_idx[None, :, None]
    out_y = np.arange(Sout)[None, None, :]
    sx = call.sets(x)
    if sx is not None:
        c_local = np.arange(Cg)
        rows = ((np.arange(N)[:, None, None, None] * G + np.arange(G)[None, :, None, None]) * Sout
                + y[None, None, None, :])
        cols = ((np.arange(N)[:, None, None, None] * C + np.arange(G)[None, :, None, None] * Cg
                 + c_local[None, None, :, None]) * Sin + xi[None, None, None, :])
        rows = np.broadcast_to(rows, cols.shape)
        U = S.gather_union(sx, rows.reshape(-1), cols.reshape(-1), N * G * Sout)
        pick = (out_n * G + out_o // Og) * Sout + out_y
        parts.append(S.take_rows(U, pick.reshape(-1)))
    sw = call.sets(w)
    if sw is not None:
        if not transposed:
            # w[o, c_local, k] feeds out[n, o, y] for the valid (y, k) pairs
            rows = (o_idx[:, None, None] * Sout + y[None, None, :])
            cols = ((o_idx[:, None, None] * Cg + np.arange(Cg)[None, :, None]) * K + kf[None, None, :])
        else:
            # w[c, o_local, k] with c in the group of o
            c_of = (o_idx // Og)[:, None] * Cg + np.arange(Cg)[None, :]
            rows = (o_idx[:, None, None] * Sout + y[None, None, :])
            cols = ((c_of[:, :, None] * Og + (o_idx % Og)[:, None, None]) * K + kf[None, None, :])
        rows = np.broadcast_to(rows, cols.shape)
        Uw = S.gather_union(sw, rows.reshape(-1), cols.reshape(-1), O * Sout)
        parts.append(S.take_rows(Uw, (out_o * Sout + out_y + 0 * out_n).reshape(-1)))
    sb = call.sets(bias) if bias is not None else None
    if sb is not None:
        parts.append(S.take_rows(sb, np.broadcast_to(out_o + 0 * out_n + 0 * out_y, (N, O, Sout)).reshape(-1)))
    return [S.union(parts, out.numel(), call.n)]


def _pool_geometry(call: Call, x, out, d: int):
    b = call.bound()
    ks = _as_list(b["kernel_size"], d)
    st = b.get("stride")
    st = ks if not st else _as_list(st, d)
    pad = _as_list(b.get("padding", 0) or 0, d)
    dil = _as_list(b.get("dilation", 1) or 1, d)
    s_in, s_out = list(x.shape[-d:]), list(out.shape[-d:])
    pairs = [_axis_pairs(s_out[i], s_in[i], ks[i], st[i], pad[i], dil[i]) for i in range(d)]
    y, _, xi = _combine(pairs, s_out, ks, s_in)
    return y, xi, int(np.prod(s_in)), int(np.prod(s_out))


def _window_union(call: Call, x, out, y, xi, Sin: int, Sout: int):
    s = call.sets(x)
    if s is None:
        return None
    planes = x.numel() // Sin
    rows = (np.arange(planes)[:, None] * Sout + y[None, :]).reshape(-1)
    cols = (np.arange(planes)[:, None] * Sin + xi[None, :]).reshape(-1)
    return S.gather_union(s, rows, cols, planes * Sout)


def _pool_rule(d: int, adaptive: bool = False):
    def rule(call: Call) -> list:
        b = call.bound()
        x = b["self"]
        out = call.outs[0]
        if adaptive:
            s_in, s_out = list(x.shape[-d:]), list(out.shape[-d:])
            pairs = [_adaptive_pairs(s_out[i], s_in[i]) for i in range(d)]
            y, _, xi = _combine(pairs, s_out, [1] * d, s_in)
            Sin, Sout = int(np.prod(s_in)), int(np.prod(s_out))
        else:
            y, xi, Sin, Sout = _pool_geometry(call, x, out, d)
        has_indices = len(call.outs) == 2
        s = call.sets(x)
        if has_indices and call.local and s is not None and not x.primal.is_meta:
            planes = x.numel() // Sin
            idx = call.outs[1].reshape(planes, Sout).cpu().numpy()
            picked = (np.arange(planes)[:, None] * Sin + idx).reshape(-1)
            return [S.take_rows(s, picked), None]
        u = _window_union(call, x, out, y, xi, Sin, Sout)
        return [u] + [None] * (len(call.outs) - 1)
    return rule


# products: only the multiplied operand elements interact (see asd.detection.hessian)
for names_, pair in ((("mm", "bmm"), ("self", "mat2")), (("addmm",), ("mat1", "mat2")),
                     (("baddbmm", "addbmm"), ("batch1", "batch2")), (("mv",), ("self", "vec")),
                     (("addmv",), ("mat", "vec")), (("dot",), ("self", "tensor")), (("vdot",), ("self", "other"))):
    register_rule(aten_ops(*names_), mm_rule, second_order="bilinear", pairs=(pair,), interaction="contraction",
                  family="linear")
register_rule(aten._addmm_activation, mm_rule, second_order="nonlinear", family="linear")  # gelu epilogue
register_rule([aten._sparse_addmm, aten._sparse_mm.default], mm_rule, second_order="bilinear", family="linear")
register_rule(aten_ops("convolution", "_convolution"), conv_rule, second_order="bilinear",
              pairs=(("input", "weight"),), family="linear")
for dim_, names in ((1, ("max_pool1d_with_indices", "avg_pool1d", "max_pool1d")),
                    (2, ("max_pool2d_with_indices", "avg_pool2d", "max_pool2d")),
                    (3, ("max_pool3d_with_indices", "avg_pool3d", "max_pool3d"))):
    register_rule(aten_ops(*names), _pool_rule(dim_), second_order="linear", family="linear")
for dim_, names in ((1, ("adaptive_avg_pool1d", "adaptive_max_pool1d")),
                    (2, ("_adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_avg_pool2d")),
                    (3, ("_adaptive_avg_pool3d", "adaptive_max_pool3d", "adaptive_avg_pool3d"))):
    register_rule(aten_ops(*names), _pool_rule(dim_, adaptive=True), second_order="linear",
                  family="linear")


def col2im_rule(call: Call) -> list:
    """col2im (F.fold): the adjoint of im2col; each output position sums the columns that cover it."""
    b = call.bound()
    x = b["self"]
    s = call.sets(x)
    out = call.outs[0]
    if s is None:
        return [None]
    N = out.shape[0] if out.dim() == 4 else 1
    shape = tuple(out.shape) if out.dim() == 4 else (1,) + tuple(out.shape)
    pos = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    cols = torch.ops.aten.im2col(pos, b["kernel_size"], b["dilation"], b["padding"], b["stride"])
    # im2col zero-pads: mark padding with -1 by shifting ids by one
    cols1 = torch.ops.aten.im2col(pos + 1, b["kernel_size"], b["dilation"], b["padding"], b["stride"])
    tgt = (cols1.reshape(-1).to(torch.int64) - 1).numpy()
    del cols, N
    src = np.arange(x.numel())
    keep = tgt >= 0
    return [S.gather_union(s, tgt[keep], src[keep], out.numel())]


register_rule(aten_ops("col2im"), col2im_rule, second_order="linear", family="linear")


def _max_pool_backward_rule(d: int):
    """max_pool{2,3}d_with_indices_backward: grad_output scattered (added) to the saved argmax
    positions; linear in grad_output, independent of ``self``'s values. With indices computed from
    the input (unknown under global tracing), every window position may receive each value."""

    def rule(call: Call) -> list:
        b = call.bound()
        go, x, indices = b["grad_output"], b["self"], b["indices"]
        s = call.sets(go)
        if s is None:
            return [None]
        Sin = int(np.prod(x.shape[-d:]))
        Sout = int(np.prod(go.shape[-d:]))
        planes = x.numel() // max(Sin, 1)
        idx = indices.primal if isinstance(indices, TracedTensor) else indices
        cols_all = np.arange(go.numel())
        if not idx.is_meta:
            tgt = (np.arange(planes)[:, None] * Sin + idx.reshape(planes, Sout).cpu().numpy()).reshape(-1)
            return [S.gather_union(s, tgt, cols_all, x.numel())]
        y, xi, Sin, Sout = _pool_geometry(call, x, go, d)
        rows = (np.arange(planes)[:, None] * Sin + xi[None, :]).reshape(-1)
        cols = (np.arange(planes)[:, None] * Sout + y[None, :]).reshape(-1)
        return [S.gather_union(s, rows, cols, x.numel())]

    return rule


register_rule(aten_ops("max_pool2d_with_indices_backward"), _max_pool_backward_rule(2), second_order="linear",
              family="linear")
register_rule(aten_ops("max_pool3d_with_indices_backward"), _max_pool_backward_rule(3), second_order="linear",
              family="linear")
