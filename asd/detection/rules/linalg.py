"""Dense linear algebra: dense blocks over the batch structure.

Factorizations, inverses, determinants and eigen-decompositions of a batch of matrices make every
output of batch ``b`` depend on every element of matrix ``b``. Solves ``X = A^{-1} B`` are finer:
column ``j`` of ``X`` depends on all of ``A`` but only on column ``j`` of ``B`` (rows, for
``left=False``). Batch dims broadcast between operands.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import sets as S
from .._core import Call, TracedTensor, is_differentiable_dtype
from ..table import aten_ops, register_rule

aten = torch.ops.aten


def _batch_union(call: Call, t, core: int, batch: tuple) -> object:
    """Union of ``t``'s sets over its last ``core`` dims, broadcast to ``batch`` (one row each)."""
    s = call.sets(t)
    if s is None:
        return None
    nb = int(np.prod(batch)) if batch else 1
    tb = tuple(t.shape[:max(t.dim() - core, 0)])
    per = t.numel() // max(int(np.prod(tb)) if tb else 1, 1)
    ntb = int(np.prod(tb)) if tb else 1
    u = S.gather_union(s, np.repeat(np.arange(ntb), per), np.arange(t.numel()), ntb)
    try:
        rows = torch.arange(ntb, dtype=torch.int64).reshape(tb).broadcast_to(batch).reshape(-1).numpy()
    except RuntimeError:  # batch structure does not line up: every batch reads everything
        return S.take_rows(S.full_row(u), np.zeros(nb, dtype=np.int64))
    return S.take_rows(u, rows)


def _spread(u, out: torch.Tensor, nb: int):
    """Batch rows -> every element of ``out`` (whose leading dims are the batch)."""
    if u is None:
        return None
    per = out.numel() // max(nb, 1) if nb else 0
    if per * nb != out.numel():
        return S.take_rows(S.full_row(u), np.zeros(out.numel(), dtype=np.int64))
    return S.take_rows(u, np.repeat(np.arange(nb), per))


def _matrix_args(call: Call):
    b = call.bound()
    return [v for v in b.values() if isinstance(v, TracedTensor)]


def batch_dense(call: Call) -> list:
    """Every output of a batch reads every (differentiable) operand element of that batch."""
    mats = _matrix_args(call)
    if not mats:
        return [None] * len(call.outs)
    first = mats[0]
    batch = tuple(first.shape[:max(first.dim() - 2, 0)])
    nb = int(np.prod(batch)) if batch else 1
    parts = []
    for t in mats:
        core = 2 if t.dim() >= len(batch) + 2 else max(t.dim() - len(batch), 0)
        parts.append(_batch_union(call, t, core, batch))
    u = S.union(parts, nb, call.n)
    return [_spread(u, o, nb) if is_differentiable_dtype(o.dtype) else None for o in call.outs]


def _solve(call: Call, A, B, left: bool, x_out: int) -> list:
    """X = A^{-1} B: X[..., :, j] reads A[...] and B[..., :, j] (rows for ``left=False``)."""
    X = call.outs[x_out]
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    xb = tuple(X.shape[:X.dim() - (1 if vector else 2)])
    nb = int(np.prod(xb)) if xb else 1
    uA = _batch_union(call, A, 2, xb)
    parts = [_spread(uA, X, nb)]
    sB = call.sets(B)
    if sB is not None:
        if vector:
            uB = _batch_union(call, B, 1, xb)
            parts.append(_spread(uB, X, nb))
        else:
            # union over the solved dim of B, then broadcast the batch
            n, k = X.shape[-2], X.shape[-1]
            d = -2 if left else -1
            shp = list(B.shape)
            ids = torch.arange(B.numel(), dtype=torch.int64).reshape(shp)
            ids = ids.movedim(d, -1)  # (..., k, n) left / (..., n_rows, k) right
            red = ids.shape[-1]
            groups = torch.arange(ids.numel() // red, dtype=torch.int64).reshape(ids.shape[:-1])
            u = S.gather_union(sB, groups.unsqueeze(-1).expand(ids.shape).reshape(-1).numpy(),
                               ids.reshape(-1).numpy(), groups.numel())
            try:
                g = groups.broadcast_to(xb + tuple(groups.shape[-1:]))
            except RuntimeError:
                g = None
            if g is None:
                parts.append(S.take_rows(S.full_row(u), np.zeros(X.numel(), dtype=np.int64)))
            elif left:  # X[..., i, j] -> group (..., j)
                parts.append(S.take_rows(u, g.unsqueeze(-2).expand(xb + (n, k)).reshape(-1).numpy()))
            else:  # X[..., i, j] -> group (..., i)
                parts.append(S.take_rows(u, g.unsqueeze(-1).expand(xb + (n, k)).reshape(-1).numpy()))
    res = [S.union(parts, X.numel(), call.n)]
    # other outputs (factorizations of A) depend on A only
    out = []
    for i, o in enumerate(call.outs):
        if i == x_out:
            out.append(res[0])
        elif not is_differentiable_dtype(o.dtype):
            out.append(None)
        else:
            ob = tuple(A.shape[:-2])
            u = _batch_union(call, A, 2, ob)
            out.append(_spread(u, o, int(np.prod(ob)) if ob else 1))
    return out


def solve_rule(call: Call) -> list:
    b = call.bound()
    name = call.func.overloadpacket.__name__
    if name == "_linalg_solve_ex":
        return _solve(call, b["A"], b["B"], b.get("left", True), 0)
    if name == "linalg_solve_triangular":
        return _solve(call, b["self"], b["B"], b.get("left", True), 0)
    if name == "triangular_solve":
        return _solve(call, b["A"], b["self"], True, 0)
    if name == "linalg_lu_solve":
        return _solve(call, b["LU"], b["B"], b.get("left", True), 0)
    if name == "cholesky_solve":
        return _solve(call, b["input2"], b["self"], True, 0)
    if name == "linalg_lstsq":
        return _solve(call, b["self"], b["b"], True, 0)
    return batch_dense(call)


def lu_unpack_rule(call: Call) -> list:
    """lu_unpack: P from the pivots (no sets), L = strict lower part of LU (+I), U = upper part."""
    b = call.bound()
    LU = b["LU_data"]
    s = call.sets(LU)
    P, L, U = call.outs
    if s is None:
        return [None, None, None]
    m, n = LU.shape[-2], LU.shape[-1]
    ids = torch.arange(LU.numel(), dtype=torch.int64).reshape(LU.shape)
    k = min(m, n)
    i = torch.arange(m)[:, None]
    j = torch.arange(n)[None, :]
    Lids = torch.where(i > j, ids, -1)[..., :, :k]
    Uids = torch.where(i <= j, ids, -1)[..., :k, :]
    res = [None]
    for o, ids_ in ((L, Lids), (U, Uids)):
        res.append(S.take_rows(s, ids_.reshape(-1).numpy()) if o.numel() == ids_.numel() else None)
    return res


def ormqr_rule(call: Call) -> list:
    """``ormqr(A, tau, C)``: ``Q C`` (or ``C Q``, ``Q^T``...) with ``Q`` the product of the Householder
    reflectors stored below the diagonal of ``A``'s first ``len(tau)`` columns. Every output of a
    batch reads those reflector entries and ``tau``; column ``j`` of ``Q C`` reads column ``j`` of
    ``C`` (row ``i`` of ``C Q`` its row ``i``). ``A``'s diagonal and upper part are not read."""
    b = call.bound()
    A, tau, C = b["self"], b["input2"], b["input3"]
    out = call.outs[0]
    batch = tuple(out.shape[:-2])
    nb = int(np.prod(batch)) if batch else 1
    parts = []
    sA = call.sets(A)
    if sA is not None:
        parts.append(_reflector_sets(sA, A, tau.shape[-1], out, bool(b.get("left", True)),
                                     bool(b.get("transpose", False))))
    if call.sets(tau) is not None:
        parts.append(_spread(_batch_union(call, tau, 1, batch), out, nb))
    sC = call.sets(C)
    if sC is not None:
        left = bool(b.get("left", True))
        d = -2 if left else -1
        u, kept = _slice_union(sC, tuple(C.shape), d)
        ids = torch.arange(u.shape[0], dtype=torch.int64).reshape(kept).expand(tuple(C.shape))
        parts.append(S.take_rows(u, ids.broadcast_to(tuple(out.shape)).reshape(-1).numpy()))
    return [S.union(parts, out.numel(), call.n)]


def _reflector_sets(sA, A, k: int, out: torch.Tensor, left: bool, transpose: bool):
    """Sets of ``ormqr``'s output through the reflectors ``A[..., i, j]``, ``i > j``, ``j < k``.
    ``H_j`` acts on rows (left) or columns (right) ``j..``: in ``Q^T C = H_{k-1}..H_0 C`` and in
    ``C Q = C H_0..H_{k-1}`` row (column) ``t`` is last changed by ``H_t``, so it reads the reflectors
    ``j <= t`` only; in the other two products ``H_0`` comes last and mixes everything."""
    m, na = A.shape[-2], A.shape[-1]
    nb = A.numel() // max(m * na, 1)
    p, q = out.shape[-2], out.shape[-1]
    if out.numel() != nb * p * q:  # batch dims broadcast: every output reads every reflector
        i, j = np.meshgrid(np.arange(m), np.arange(na), indexing="ij")
        cols = np.nonzero(np.tile(((i > j) & (j < k)).reshape(-1), nb))[0]
        return S.take_rows(S.gather_union(sA, np.zeros(len(cols), dtype=np.int64), cols, 1),
                           np.zeros(out.numel(), dtype=np.int64))
    ordered = left == transpose
    axis_len = p if left else q
    rows, cols = [], []
    for t in range(axis_len):
        last = min(t, k - 1) if ordered else k - 1
        ref = np.array([i * na + j for j in range(last + 1) for i in range(j + 1, m)], dtype=np.int64)
        if not len(ref):
            continue
        outs = (t * q + np.arange(q)) if left else (np.arange(p) * q + t)
        rows.append(np.repeat(outs, len(ref)))
        cols.append(np.tile(ref, len(outs)))
    if not rows:
        return None
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    offs = np.arange(nb)[:, None]
    return S.gather_union(sA, (offs * p * q + rows[None, :]).ravel(), (offs * m * na + cols[None, :]).ravel(),
                          out.numel())


def _slice_union(sets, shape: tuple, d: int):
    """Union of ``sets`` (of a tensor of ``shape``) along dim ``d``: (sets per slice, kept grid)."""
    d = d % len(shape)
    kept = [1 if i == d else s for i, s in enumerate(shape)]
    nk = int(np.prod(kept))
    groups = torch.arange(nk, dtype=torch.int64).reshape(kept).expand(shape).reshape(-1).numpy()
    return S.gather_union(sets, groups, np.arange(len(groups)), nk), kept


def no_outputs(call: Call) -> list:
    return [None] * len(call.outs)


# Cholesky, QR, LU, triangular solves and determinants: see structured_linalg
BATCH_DENSE = aten_ops(
    "_linalg_svd", "linalg_pinv", "linalg_inv_ex",
    "linalg_matrix_exp", "matrix_exp", "_linalg_eigh",
    "linalg_eig", "_linalg_eigvals", "linalg_householder_product", "cholesky_inverse",
    "geqrf", "linalg_ldl_factor_ex", "linalg_matrix_power", "inverse", "logdet", "det", "slogdet",
    "linalg_eigvals", "linalg_svdvals", "_lu_with_info",
)
SOLVES = aten_ops("_linalg_solve_ex", "linalg_lu_solve",
                  "cholesky_solve", "linalg_lstsq")

register_rule(BATCH_DENSE, batch_dense, second_order="nonlinear", family="linalg")
register_rule(SOLVES, solve_rule, second_order="nonlinear", family="linalg")
register_rule(aten_ops("ormqr"), ormqr_rule, second_order="nonlinear", family="linalg")
register_rule(aten_ops("lu_unpack"), lu_unpack_rule, second_order="linear", family="linalg")
register_rule(aten_ops("_linalg_check_errors"), no_outputs, second_order="zero", family="linalg")
