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
from .._core import Call, TracedTensor, is_differentiable_dtype
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
    """``linalg_lu`` (P, L, U) and ``linalg_lu_factor_ex`` (LU packed, pivots, info). Traced locally,
    the pivots are known: the factors of the row-permuted matrix read as without pivoting."""
    A = call.bound()["A"]
    m, n = A.shape[-2], A.shape[-1]
    if max(m, n) > EXACT_MAX:
        return batch_dense(call)
    perms = _row_permutations(call, A)
    if perms is not None:
        return _lu_at_point(call, A, perms)
    lower, upper, k = _lu_entries(m, n)
    if call.func.overloadpacket is aten.linalg_lu:
        P, L, U = call.outs
        lp = _pairs((i * k + j, _column_reads(m, n, c)) for (i, j), c in lower)
        up = _pairs((i * n + j, _column_reads(m, n, c)) for (i, j), c in upper)
        return [None, _gather(call, A, L, lp), _gather(call, A, U, up)]
    LU = call.outs[0]
    pairs = _pairs((i * n + j, _column_reads(m, n, c)) for (i, j), c in lower + upper)
    return [_gather(call, A, LU, pairs)] + [None] * (len(call.outs) - 1)


def _row_permutations(call: Call, A) -> np.ndarray | None:
    """Under local tracing, ``perm`` (one row per matrix) with ``A[perm] = L U`` without pivoting;
    ``None`` where the pivots are unknown."""
    if not call.local or not isinstance(A, TracedTensor) or A.primal.is_meta:
        return None
    m = A.shape[-2]
    if call.func.overloadpacket is aten.linalg_lu:
        P = call.outs[0]
        if P.numel() == 0:
            return None
        return P.detach().cpu().reshape(-1, m, m).argmax(-2).numpy()  # A = P L U: (P^T A)[r] = A[perm[r]]
    pivots = call.outs[1].detach().cpu().reshape(-1, call.outs[1].shape[-1]).numpy().astype(np.int64) - 1
    perms = np.tile(np.arange(m), (len(pivots), 1))
    for b, piv in enumerate(pivots):  # LAPACK's row swaps, in order
        for i, p in enumerate(piv):
            perms[b, [i, p]] = perms[b, [p, i]]
    return perms


def _lu_reads(m: int, n: int) -> tuple[list, list, int]:
    """Entries of ``L`` and ``U`` of ``M = L U`` (no pivoting) with the entries ``(p, q)`` of ``M``
    they read: ``L[i, j]`` reads ``M[:j+1, :j+1]`` and ``M[i, :j+1]``, ``U[i, j]`` reads
    ``M[:i+1, :i]`` and ``M[:i+1, j]``."""
    k = min(m, n)
    lower = [((i, j), [(p, q) for p in list(range(j + 1)) + [i] for q in range(j + 1)])
             for i in range(m) for j in range(k) if i > j]
    upper = [((i, j), [(p, q) for p in range(i + 1) for q in list(range(i)) + [j]])
             for i in range(k) for j in range(i, n)]
    return lower, upper, k


def _lu_at_point(call: Call, A, perms: np.ndarray) -> list:
    m, n = A.shape[-2], A.shape[-1]
    lower, upper, k = _lu_reads(m, n)
    s = call.sets(A)
    if s is None:
        return [None] * len(call.outs)

    def sets_of(out, entries, cols_of_out: int):
        rows, cols = [], []
        for b, perm in enumerate(perms):
            for (i, j), reads in entries:
                rows.extend([b * out.shape[-2] * cols_of_out + i * cols_of_out + j] * len(reads))
                cols.extend(b * m * n + perm[p] * n + q for p, q in reads)
        return S.gather_union(s, np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), out.numel())

    if call.func.overloadpacket is aten.linalg_lu:
        P, L, U = call.outs
        return [None, sets_of(L, lower, k), sets_of(U, upper, n)]
    return [sets_of(call.outs[0], lower + upper, n)] + [None] * (len(call.outs) - 1)


# -- triangular solves --------------------------------------------------------------------------------

def _triangle_reads(n: int, i: int, upper: bool, unit: bool, transpose: bool, first: int) -> np.ndarray:
    """Entries of ``A`` (``n x n``, flat) that ``x_i`` of ``op(A) x = b`` reads, where ``b``'s
    structural nonzeros start at row ``first`` (``upper``: end there; ``upper`` is the triangle of
    ``op(A)``). Lower: ``x_i`` reads ``op(A)[p, q]`` for ``first <= q <= p <= i``: the diagonal entry
    of each nonzero ``x_p`` and the coefficients of the nonzero ``x_q``; the mirror image for upper."""
    out = []
    rows = range(i, first + 1) if upper else range(first, i + 1)
    for p in rows:
        cols = range(p + unit, first + 1) if upper else range(first, p + 1 - unit)
        for q in cols:
            out.append(q * n + p if transpose else p * n + q)
    return np.asarray(out, dtype=np.int64)


def _structural_nonzeros(call: Call, B) -> np.ndarray:
    """``B``'s entries that may be nonzero (``B``'s last two dims, any over the batch): those that
    depend on the input, and, traced locally, the constant ones whose value is nonzero
    (``torch.eye``'s off-diagonal is not). Globally every constant entry may be nonzero: a
    pattern must not depend on float values, which a prepared operator lets change between calls."""
    shape = tuple(B.shape[-2:])
    s = Call.sets(call, B)  # the entries that depend on the input, also where a rule is made not to see them
    nz = np.zeros(B.numel(), dtype=bool) if s is None else np.diff(s.indptr) > 0
    p = B.primal if isinstance(B, TracedTensor) else B
    nz |= True if (p.is_meta or not call.local) else (p.detach().cpu() != 0).reshape(-1).numpy()
    return nz.reshape((-1,) + shape).any(0)


def triangular_solve_sets(call: Call, A, B, X: torch.Tensor, upper: bool, left: bool, unit: bool,
                          transpose: bool):
    """Sets of ``X`` solving ``op(A) X = B`` (``left``) or ``X op(A) = B``, ``op(A) = A^T`` for
    ``transpose``; ``upper`` is the triangle of ``A``. A column of ``B`` (row, for right solves)
    that is structurally zero up to some row gives a solution zero there (``L^{-1} = solve(L, I)``
    is lower triangular)."""
    n = A.shape[-1]
    p, q = X.shape[-2], X.shape[-1]
    upper = upper != transpose  # ``upper`` from here on: the triangle of op(A)
    if not left:  # X op(A) = B  <=>  op(A)^T X^T = B^T
        upper, transpose = not upper, not transpose
    nzB = _structural_nonzeros(call, B)
    nzB = nzB if left else nzB.T  # (solved index, other index)
    a_entries, b_entries = [], []
    reads: dict[tuple[int, int], np.ndarray] = {}
    for j in range(q if left else p):
        rows = np.nonzero(nzB[:, j])[0]
        if not len(rows):
            continue  # a zero column of B: a zero column of X
        first = int(rows.max() if upper else rows.min())
        for i in (range(first + 1) if upper else range(first, n)):
            if (i, first) not in reads:
                reads[i, first] = _triangle_reads(n, i, upper, unit, transpose, first)
            flat = i * q + j if left else j * q + i
            reads_b = np.arange(i, n) if upper else np.arange(i + 1)
            a_entries.append((flat, reads[i, first]))
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
