"""Contractions: ``dot_general`` and ``conv_general_dilated``.

An output element depends on the operand elements that are multiplied into it. A constant
operand with known values contributes its zero structure (``x @ A`` with a sparse constant ``A``
keeps ``A``'s pattern). For Hessians only operand elements that are multiplied together
interact, so ``x @ (A @ x)`` gives ``A``'s pattern exactly.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ...detection import sets as S
from ..interpreter import conservative
from ..table import CUSTOM, register
from .movement import ids


def _constant_nonzeros(ctx, i: int, canon: np.ndarray) -> np.ndarray | None:
    """``canon``-ordered nonzero mask of input ``i`` when it is a constant with known values."""
    if ctx.sets(i) is not None or ctx.value(i) is None:
        return None
    return np.asarray(ctx.value(i)).ravel()[canon] != 0


def _gram_pairs(ctx, sa, sb, a_rows, b_rows, na, nb) -> None:
    """``H |= Sa^T P Sb + (.)^T`` for the pairing ``P`` of operand elements multiplied together."""
    if ctx.hessian is None or sa is None or sb is None:
        return
    P = sp.csr_matrix((np.ones(len(a_rows), dtype=bool), (a_rows, b_rows)), shape=(na, nb))
    P.sum_duplicates()
    M = (sa.T.tocsr() @ S.matmul(P, sb)).tocsr()
    ctx.hessian.add(M + M.T)


def dot_general(ctx):
    (lc, rc), (lb, rb) = ctx.params["dimension_numbers"]
    ls, rs = ctx.ins[0].shape, ctx.ins[1].shape
    lfree = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rs)) if d not in rc and d not in rb]
    B = int(np.prod([ls[d] for d in lb], dtype=np.int64))
    K = int(np.prod([ls[d] for d in lc], dtype=np.int64))
    I = int(np.prod([ls[d] for d in lfree], dtype=np.int64))
    J = int(np.prod([rs[d] for d in rfree], dtype=np.int64))
    lperm = ids(ls).transpose(list(lb) + lfree + list(lc)).ravel()  # (B, I, K)
    rperm = ids(rs).transpose(list(rb) + list(rc) + rfree).ravel()  # (B, K, J)
    sl, sr = ctx.sets(0), ctx.sets(1)
    m = B * I * J
    parts = []
    b, i, j = np.meshgrid(np.arange(B), np.arange(I), np.arange(J), indexing="ij")
    if sl is not None:
        SL = S.take_rows(sl, lperm)
        nz = _constant_nonzeros(ctx, 1, rperm)
        if nz is None:  # every k: the union over the contracted index, broadcast over j
            U = S.gather_union(SL, np.repeat(np.arange(B * I), K), np.arange(B * I * K), B * I)
            parts.append(S.take_rows(U, (b * I + i).ravel()))
        else:
            bb, kk, jj = np.nonzero(nz.reshape(B, K, J))
            ii = np.arange(I)[:, None]
            parts.append(S.gather_union(SL, ((bb * I + ii) * J + jj).ravel(), ((bb * I + ii) * K + kk).ravel(), m))
    if sr is not None:
        SR = S.take_rows(sr, rperm)
        nz = _constant_nonzeros(ctx, 0, lperm)
        if nz is None:
            U = S.gather_union(SR, (np.arange(B * K * J) // (K * J)) * J + np.arange(B * K * J) % J,
                               np.arange(B * K * J), B * J)
            parts.append(S.take_rows(U, (b * J + j).ravel()))
        else:
            bb, ii, kk = np.nonzero(nz.reshape(B, I, K))
            jj = np.arange(J)[:, None]
            parts.append(S.gather_union(SR, ((bb * I + ii) * J + jj).ravel(), ((bb * K + kk) * J + jj).ravel(), m))
    if ctx.hessian is not None and sl is not None and sr is not None:
        # only A[b, i, k] and B[b, k, j] are multiplied: group both by (b, k)
        la = np.arange(B * I * K)
        Ua = S.gather_union(SL, (la // (I * K)) * K + la % K, la, B * K)
        ra = np.arange(B * K * J)
        Ub = S.gather_union(SR, ra // J, ra, B * K)
        ctx.hessian.add_cross(Ua, Ub)
    if not parts:
        return [None]
    return [S.union(parts, m, ctx.n)]


register("dot_general", dot_general, CUSTOM, "linear")


def _spatial_table(n_out, n_k, n_in, stride, rdil, ldil, lo) -> np.ndarray:
    """Input position read by output position ``o`` under kernel tap ``k`` (``-1``: padding)."""
    q = np.arange(n_out)[:, None] * stride + np.arange(n_k)[None, :] * rdil - lo
    ok = (q >= 0) & (q % ldil == 0) & (q // ldil < n_in)
    return np.where(ok, q // ldil, -1)


def conv_pairs(sin, sk, sout, p):
    """Valid ``(output position, kernel tap, input position)`` triples, flat over spatial dims."""
    nd = len(sin)
    strides = p["window_strides"]
    ldil = p.get("lhs_dilation") or (1,) * nd
    rdil = p.get("rhs_dilation") or (1,) * nd
    flat_in = np.zeros([1] * (2 * nd), dtype=np.int64)
    valid = np.ones([1] * (2 * nd), dtype=bool)
    in_strides = np.cumprod((list(sin[1:]) + [1])[::-1])[::-1]
    for d in range(nd):
        t = _spatial_table(sout[d], sk[d], sin[d], strides[d], rdil[d], ldil[d], p["padding"][d][0])
        shape = [1] * (2 * nd)
        shape[d], shape[nd + d] = sout[d], sk[d]
        t = t.reshape(shape)
        valid = valid & (t >= 0)
        flat_in = flat_in + np.maximum(t, 0) * in_strides[d]
    full = tuple(sout) + tuple(sk)
    valid = np.broadcast_to(valid, full).reshape(int(np.prod(sout)), int(np.prod(sk)))
    flat_in = np.broadcast_to(flat_in, full).reshape(valid.shape)
    o, k = np.nonzero(valid)
    return o, k, flat_in[o, k]


def conv_general_dilated(ctx):
    p = ctx.params
    if p.get("batch_group_count", 1) != 1:
        res = conservative(ctx)
        if ctx.hessian is not None:  # a general op: every pair of its inputs' dependencies may interact
            for s in res:
                ctx.hessian.add_square(s)
        return res
    ls, rs = ctx.ins[0].shape, ctx.ins[1].shape
    nd = len(ls) - 2
    dn = p["dimension_numbers"]
    lspec, rspec, ospec = (tuple(range(nd + 2)),) * 3 if dn is None else (dn.lhs_spec, dn.rhs_spec, dn.out_spec)
    oshape = ctx.out_shapes[0]
    N, C = ls[lspec[0]], ls[lspec[1]]
    O, Cg = rs[rspec[0]], rs[rspec[1]]
    sin = [ls[d] for d in lspec[2:]]
    sk = [rs[d] for d in rspec[2:]]
    sout = [oshape[d] for d in ospec[2:]]
    Sin, Kt, Sout = int(np.prod(sin)), int(np.prod(sk)), int(np.prod(sout))
    G = p["feature_group_count"]
    Og = O // G
    lperm = ids(ls).transpose(lspec).ravel()
    rperm = ids(rs).transpose(rspec).ravel()
    operm = ids(oshape).transpose(ospec).ravel()  # canonical position -> actual element
    sl, sr = ctx.sets(0), ctx.sets(1)
    if sl is None and sr is None:
        return [None]
    po, pk, pin = conv_pairs(sin, sk, sout, p)
    order = np.argsort(pk, kind="stable")
    po, pk, pin = po[order], pk[order], pin[order]
    start = np.searchsorted(pk, np.arange(Kt + 1))
    nz = _constant_nonzeros(ctx, 1, rperm)
    if nz is None:
        oo, cc, kk = (a.ravel() for a in np.meshgrid(np.arange(O), np.arange(Cg), np.arange(Kt), indexing="ij"))
    else:
        oo, cc, kk = np.nonzero(nz.reshape(O, Cg, Kt))
    counts = start[kk + 1] - start[kk]
    rep = np.repeat(np.arange(len(oo)), counts)
    pair = np.repeat(start[kk] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(counts.sum())
    o_, c_, k_ = oo[rep], cc[rep], kk[rep]
    sp_out, sp_in = po[pair], pin[pair]
    cin = (o_ // Og) * Cg + c_
    nn = np.arange(N)[:, None]
    rows = ((nn * O + o_) * Sout + sp_out).ravel()
    m = N * O * Sout
    lcols = ((nn * C + cin) * Sin + sp_in).ravel()
    rcols = np.broadcast_to((o_ * Cg + c_) * Kt + k_, (N, len(o_))).ravel()
    SL = None if sl is None else S.take_rows(sl, lperm)
    SR = None if sr is None else S.take_rows(sr, rperm)
    parts = []
    if SL is not None:
        parts.append(S.gather_union(SL, rows, lcols, m))
    if SR is not None:
        parts.append(S.gather_union(SR, rows, rcols, m))
    _gram_pairs(ctx, SL, SR, lcols, rcols, N * C * Sin, O * Cg * Kt)
    canon = S.union(parts, m, ctx.n)
    inv = np.empty(m, dtype=np.int64)
    inv[operm] = np.arange(m)
    return [S.take_rows(canon, inv)]


register("conv_general_dilated", conv_general_dilated, CUSTOM, "linear")
