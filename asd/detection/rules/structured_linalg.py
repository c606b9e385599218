"""Linear algebra with structure in its results: triangular factors and solves, determinants.

Each output entry of a factorization or triangular solve reads a known part of the operands
(Cholesky's ``L[i, j]`` reads ``A[:j+1, :j+1]`` and ``A[i, :j+1]``; back substitution's ``x_i``
reads ``b_i..b_n`` and the rows ``i..n`` of the triangle), the other triangle of a factor is
identically zero, and a real ``slogdet``'s sign has a zero derivative. ``det`` is linear in each
entry and in each row: only entries in distinct rows and columns interact. Matrices larger than
:data:`EXACT_MAX` fall back to the dense-per-matrix rules of :mod:`~asd.detection.rules.linalg`
(the entry-level maps grow as ``n^4``).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import sets as S
from .._core import Call, is_differentiable_dtype
from ..table import aten_ops, register_rule
from .linalg import batch_dense, solve_rule

aten = torch.ops.aten

#: largest matrix dimension given the entry-level rules
EXACT_MAX = 48


def _batch_map(t_batch: tuple, out_batch: tuple) -> np.ndarray:
    """For each matrix of a batch of shape ``out_batch``, the index of the matrix of ``t`` it reads."""
    nt = int(np.prod(t_batch)) if t_batch else 1
    return torch.arange(nt, dtype=torch.int64).reshape(t_batch).broadcast_to(out_batch).reshape(-1).numpy()


def _gather(call: Call, t, out: torch.Tensor, pairs: tuple[np.ndarray, np.ndarray]):
    """Sets of ``out`` where output entry ``pairs[0][k]`` of each matrix reads entry ``pairs[1][k]``
    of the matching (broadcast) matrix of ``t``; ``None`` when ``t`` carries no sets."""
    s = call.sets(t)
    if s is None or out.numel() == 0:
        return None
    o_local, t_local = pairs
    out_batch = tuple(out.shape[:-2])
    tmap = _batch_map(tuple(t.shape[:-2]), out_batch)
    per_out = out.shape[-2] * out.shape[-1]
    per_t = t.shape[-2] * t.shape[-1]
    rows = (np.arange(len(tmap))[:, None] * per_out + o_local[None, :]).ravel()
    cols = (tmap[:, None] * per_t + t_local[None, :]).ravel()
    return S.gather_union(s, rows, cols, out.numel())


def _pairs(entries) -> tuple[np.ndarray, np.ndarray]:
    """``entries`` yields (output flat index, array of operand flat indices) -> coordinate arrays."""
    o, t = [], []
    for oi, ts in entries:
        ts = np.unique(np.asarray(ts, dtype=np.int64))
        o.append(np.full(len(ts), oi, dtype=np.int64))
        t.append(ts)
    if not o:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(o), np.concatenate(t)


def _block(rows, cols, n: int) -> np.ndarray:
    """Flat indices of the entries ``(rows x cols)`` of an ``n``-column matrix."""
    return (np.asarray(rows, dtype=np.int64)[:, None] * n + np.asarray(cols, dtype=np.int64)[None, :]).ravel()


# -- Cholesky -----------------------------------------------------------------------------------------

def cholesky_pairs(n: int, upper: bool) -> tuple[np.ndarray, np.ndarray]:
    """``L[i, j]`` (``i >= j``) reads ``A[p, q]`` and ``A[q, p]`` for ``p`` in ``{0..j, i}``, ``q <= j``
    (``U = L^T`` for ``upper``)."""
    def entries():
        for i in range(n):
            for j in range(i + 1):
                rows = list(range(j + 1)) + [i]
                cols = range(j + 1)
                reads = np.concatenate([_block(rows, cols, n), _block(cols, rows, n)])
                yield (j * n + i if upper else i * n + j), reads
    return _pairs(entries())


def cholesky_rule(call: Call) -> list:
    b = call.bound()
    A = b["self"]
    n = A.shape[-1]
    if n > EXACT_MAX:
        return batch_dense(call)
    L = call.outs[0]
    res = [_gather(call, A, L, cholesky_pairs(n, bool(b.get("upper", False))))]
    return res + [None] * (len(call.outs) - 1)


# -- QR and LU ----------------------------------------------------------------------------------------

def _column_reads(m: int, n: int, cols) -> np.ndarray:
    return _block(range(m), cols, n)


def qr_rule(call: Call) -> list:
    """``Q[:, j]`` reads the columns ``0..j`` of ``A``; ``R[i, j]`` (``i <= j``) the columns
    ``0..i`` and ``j``; ``R`` is zero below its diagonal."""
    A = call.bound()["A"]
    m, n = A.shape[-2], A.shape[-1]
    if max(m, n) > EXACT_MAX:
        return batch_dense(call)
    Q, R = call.outs
    kq = Q.shape[-1] if Q.dim() >= 2 else 0
    q_pairs = _pairs((r * kq + j, _column_reads(m, n, range(min(j, n - 1) + 1)))
                     for r in range(Q.shape[-2] if Q.dim() >= 2 else 0) for j in range(kq))
    kr = R.shape[-2]
    r_pairs = _pairs((i * n + j, _column_reads(m, n, list(range(min(i, n - 1) + 1)) + [j]))
                     for i in range(kr) for j in range(i, n))
    return [_gather(call, A, Q, q_pairs) if Q.numel() else None, _gather(call, A, R, r_pairs)]


def _lu_entries(m: int, n: int):
    """Entries of ``L`` (strictly lower, ``m x k``) and ``U`` (upper, ``k x n``) with the columns of
    ``A`` they read (all rows: the pivots depend on the values)."""
    k = min(m, n)
    lower = [((i, j), range(j + 1)) for i in range(m) for j in range(k) if i > j]
    upper = [((i, j), list(range(i)) + [j]) for i in range(k) for j in range(i, n)]
    return lower, upper, k


def lu_rule(call: Call) -> list:
    """``linalg_lu`` (P, L, U) and ``linalg_lu_factor_ex`` (LU packed, pivots, info)."""
    A = call.bound()["A"]
    m, n = A.shape[-2], A.shape[-1]
    if max(m, n) > EXACT_MAX:
        return batch_dense(call)
    lower, upper, k = _lu_entries(m, n)
    if call.func.overloadpacket is aten.linalg_lu:
        P, L, U = call.outs
        lp = _pairs((i * k + j, _column_reads(m, n, c)) for (i, j), c in lower)
        up = _pairs((i * n + j, _column_reads(m, n, c)) for (i, j), c in upper)
        return [None, _gather(call, A, L, lp), _gather(call, A, U, up)]
    LU = call.outs[0]
    pairs = _pairs((i * n + j, _column_reads(m, n, c)) for (i, j), c in lower + upper)
    return [_gather(call, A, LU, pairs)] + [None] * (len(call.outs) - 1)


# -- triangular solves --------------------------------------------------------------------------------

def _triangle_reads(n: int, i: int, upper: bool, unit: bool, transpose: bool) -> np.ndarray:
    """Entries of ``A`` (``n x n``, flat) that ``x_i`` of ``op(A) x = b`` reads: the rows ``i..n``
    (``upper``: the triangle of ``op(A)``) or ``0..i`` of the triangle of ``op(A)``."""
    rows = range(i, n) if upper else range(i + 1)
    out = []
    for p in rows:
        cols = range(p + unit, n) if upper else range(p + 1 - unit)
        for q in cols:
            out.append(q * n + p if transpose else p * n + q)
    return np.asarray(out, dtype=np.int64)


def triangular_solve_sets(call: Call, A, B, X: torch.Tensor, upper: bool, left: bool, unit: bool,
                          transpose: bool):
    """Sets of ``X`` solving ``op(A) X = B`` (``left``) or ``X op(A) = B``, ``op(A) = A^T`` for
    ``transpose``; ``upper`` is the triangle of ``A``."""
    n = A.shape[-1]
    p, q = X.shape[-2], X.shape[-1]
    upper = upper != transpose  # ``upper`` from here on: the triangle of op(A)
    if not left:  # X op(A) = B  <=>  op(A)^T X^T = B^T
        upper, transpose = not upper, not transpose
    a_entries, b_entries = [], []
    for i in range(n):
        reads_a = _triangle_reads(n, i, upper, unit, transpose)
        reads_b = np.arange(i, n) if upper else np.arange(i + 1)
        # solved index i is the row of X (left) or its column (right)
        others = range(q) if left else range(p)
        for j in others:
            flat = i * q + j if left else j * q + i
            a_entries.append((flat, reads_a))
            b_entries.append((flat, reads_b * q + j if left else j * q + reads_b))
    parts = [_gather(call, A, X, _pairs(a_entries))]
    if B.dim() >= 2:
        parts.append(_gather(call, B, X, _pairs(b_entries)))
    return S.union(parts, X.numel(), call.n)


def solve_triangular_rule(call: Call) -> list:
    b = call.bound()
    name = call.func.overloadpacket.__name__
    if name == "linalg_solve_triangular":
        A, B, upper, left, unit, transpose = b["self"], b["B"], b["upper"], b.get("left", True), \
            b.get("unitriangular", False), False
    else:  # triangular_solve(B, A, upper, transpose, unitriangular) -> (solution, cloned_coefficient)
        A, B, upper, left, unit, transpose = b["A"], b["self"], b.get("upper", True), True, \
            b.get("unitriangular", False), b.get("transpose", False)
    if A.shape[-1] > EXACT_MAX or B.dim() < 2:
        return solve_rule(call)
    X = call.outs[0]
    res = [triangular_solve_sets(call, A, B, X, bool(upper), bool(left), bool(unit), bool(transpose))]
    if len(call.outs) > 1:  # the cloned coefficient: A itself
        res.append(call.sets(A) if call.outs[1].numel() == A.numel() else batch_dense(call)[1])
    return res


# -- determinants -------------------------------------------------------------------------------------

def _distinct_row_col(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of entries of an ``n x n`` matrix in distinct rows and distinct columns."""
    i, j, k, l = np.meshgrid(*[np.arange(n)] * 4, indexing="ij")
    keep = (i != k) & (j != l)
    return (i * n + j)[keep], (k * n + l)[keep]


def det_rule(call: Call) -> list:
    """``_linalg_det``: ``det`` is linear in each row and each column, so only entries in distinct
    rows and columns interact. The factorization outputs (``LU``, ``pivots``) exist for backward and
    are given first-order sets only."""
    A = call.bound()["A"]
    res = batch_dense(call)
    G = call.sets(A)
    if G is None:
        return res
    n = A.shape[-1]
    if n > EXACT_MAX:
        call.record_interaction(res[:1])
        return res
    e, f = _distinct_row_col(n)
    nb = A.numel() // max(n * n, 1)
    offs = (np.arange(nb) * n * n)[:, None]
    W = S.gather_union(G, (offs + e[None, :]).ravel(), (offs + f[None, :]).ravel(), A.numel())
    call.record_cross(G, W)
    return res


def slogdet_rule(call: Call) -> list:
    """``_linalg_slogdet``: the sign of a real determinant is piecewise constant."""
    res = batch_dense(call)
    if not call.bound()["A"].dtype.is_complex:
        res[0] = None
    return res


register_rule(aten_ops("linalg_cholesky_ex", "cholesky"), cholesky_rule, second_order="nonlinear", family="linalg")
register_rule(aten_ops("linalg_qr"), qr_rule, second_order="nonlinear", family="linalg")
register_rule(aten_ops("linalg_lu", "linalg_lu_factor_ex"), lu_rule, second_order="nonlinear", family="linalg")
register_rule(aten_ops("linalg_solve_triangular", "triangular_solve"), solve_triangular_rule,
              second_order="nonlinear", family="linalg")
register_rule(aten_ops("_linalg_det"), det_rule, second_order="linear", family="linalg")
register_rule(aten_ops("_linalg_slogdet"), slogdet_rule, second_order="nonlinear", family="linalg")
