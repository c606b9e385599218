"""Graph coloring for sparse AD: partial distance-2 (column/row), star, acyclic and
bidirectional (star bicoloring) colorings, each returning its decompression plan.

``import asd.coloring`` imports neither torch nor numba: the ``@njit`` kernels live in private
modules that the wrappers import on first use (compiled once, cached on disk).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

import numpy as np

from asd._fork import fork_safe

from asd.coloring.check import check
from asd.coloring.io import load, save
from asd.coloring.orders import BEST_ORDERS, ORDERS, check_order
from asd.coloring.result import (AcyclicColoring, BiColoring, Coloring, ColumnColoring, ColumnSeeds, RowColoring,
                                 RowSeeds, StarColoring)
from asd.errors import ColoringError
from asd.patterns import SparsityPattern, as_pattern

PROBLEMS = ("column", "row", "star", "acyclic", "bidirectional")

__all__ = ["color", "check", "Coloring", "ColumnColoring", "RowColoring", "StarColoring", "AcyclicColoring",
           "BiColoring", "ColumnSeeds", "RowSeeds", "ORDERS", "PROBLEMS", "save", "load"]

#: a coloring is not attempted when some row (column) already holds this fraction of all columns
#: (rows) - it needs at least that many colors, so compression cannot pay - and the greedy kernel
#: would cost more than :data:`DENSE_COST`: one color per column (row) is used instead. (At 0.5 the
#: SMB Jacobian's row coloring, 4655 colors for 8570 rows in 0.3 s, was skipped.)
DENSE_FRACTION = 0.75
#: the greedy kernels' work (sum of squared degrees) above which a hopeless coloring is skipped
DENSE_COST = 20_000_000

#: extra seeded random orders tried by ``order="best"``
BEST_RANDOM_TRIES = 3
#: recoloring rounds of ``order="best"`` (Culberson's iterated greedy) on small patterns
ITERATED_GREEDY_ROUNDS = 30


def _color_one(pattern, problem, order, seed, postprocess, perm=None) -> Coloring:
    if problem in ("column", "row"):
        from asd.coloring.greedy import color_partial

        return color_partial(pattern, problem, order, seed, perm=perm)
    if problem == "star":
        from asd.coloring.star import color_star

        return color_star(pattern, order, seed, postprocess, perm=perm)
    if problem == "acyclic":
        from asd.coloring.acyclic import color_acyclic

        return color_acyclic(pattern, order, seed, perm=perm)
    from asd.coloring.bidirectional import color_bidirectional

    return color_bidirectional(pattern, order, seed, postprocess, perm=perm)


def lower_bound(pattern: SparsityPattern, problem: str) -> int:
    """A lower bound of the colors of a column (row) coloring: the densest row (column)."""
    deg = _degrees(pattern, "row" if problem == "column" else "column")
    return int(deg.max()) if deg.size else 0


def _degrees(pattern: SparsityPattern, of: str) -> np.ndarray:
    """Entries per row (``of="row"``) or per column of ``pattern``; the column counts are read off
    the transpose where it is built already (the greedy kernels build it), else counted."""
    if of == "row":
        return np.diff(pattern.indptr)
    if pattern.has_transpose:
        return np.diff(pattern.T.indptr)
    return np.bincount(pattern.indices, minlength=pattern.shape[1])


def hopeless(pattern: SparsityPattern, problem: str) -> bool:
    """Whether compression cannot pay and coloring would be costly (see :data:`DENSE_FRACTION`).

    Column and row colorings need at least as many colors as the densest row (column) has
    entries; symmetric (distance-1) colorings have no such bound from degrees (an arrowhead's
    dense row needs one color), so for them the pattern itself must be mostly full.
    """
    nv = pattern.shape[0] if problem == "row" else pattern.shape[1]
    if nv == 0:
        return False
    if problem in ("column", "row"):
        if lower_bound(pattern, problem) < max(2, DENSE_FRACTION * nv):
            return False
    elif pattern.nnz < DENSE_FRACTION * nv * nv:
        return False
    deg = _degrees(pattern, "column" if problem == "row" else "row")
    return float(np.dot(deg.astype(np.float64), deg)) > DENSE_COST


def one_color_each(pattern: SparsityPattern, problem: str) -> Coloring:
    """The uncompressed coloring (every column, row or vertex its own color): dense AD through the
    same pipeline. Its ``order`` is ``"dense"``."""
    nv = pattern.shape[0] if problem == "row" else pattern.shape[1]
    colors = np.arange(nv, dtype=np.int64)
    if problem == "star":
        return StarColoring(pattern, "dense", colors, nv, np.ones(pattern.nnz, dtype=bool))
    cls = {"column": ColumnColoring, "row": RowColoring, "acyclic": AcyclicColoring}[problem]
    return cls(pattern, "dense", colors, nv)


def symmetric_pattern(pattern: SparsityPattern) -> SparsityPattern:
    """The structure of ``A + A^T`` (``pattern`` itself when it is already symmetric)."""
    if pattern.shape[0] != pattern.shape[1]:
        raise ColoringError(f"a symmetric (Hessian) pattern must be square, got shape {pattern.shape}; "
                            "use problem='column', 'row' or 'bidirectional' for Jacobians")
    if pattern.is_symmetric:
        return pattern
    T = pattern.T
    rows = np.concatenate([pattern.rows, T.rows])
    cols = np.concatenate([pattern.indices, T.indices])
    return SparsityPattern.from_coo(rows, cols, pattern.shape, input_shape=pattern.input_shape,
                                    output_shape=pattern.output_shape)


def color(pattern, problem: str = "column", order: str = "natural", *, seed: int = 0,
          postprocess: bool = False) -> Coloring:
    """Color a sparsity pattern for compressed AD.

    Parameters
    ----------
    pattern
        Anything ``scipy.sparse`` can turn into a matrix (sparse array/matrix, dense numpy
        bool/numeric array).  Every stored entry - explicit zeros included - is structural;
        duplicates are merged.
    problem
        ``"column"`` (JVPs), ``"row"`` (VJPs), ``"star"`` (symmetric, direct Hessian
        recovery), ``"acyclic"`` (symmetric, substitution), ``"bidirectional"`` (JVPs + VJPs,
        star bicoloring with neutral colors).  Symmetric problems need a square pattern and
        use the structure of ``A + A^T`` (the pattern is symmetrized silently).
    order
        One of :data:`ORDERS`, or ``"best"``: try the deterministic orders and
        ``BEST_RANDOM_TRIES`` seeded random orders and keep the fewest colors (first wins
        ties; the result's ``order`` names the winner).
    seed
        Seed of the ``"random"`` order.
    postprocess
        For ``star`` and ``bidirectional``: choose the recovery direction of ambiguous
        entries so as to need as few colors as possible and make the rest neutral
        (``-1``, not seeded); ``ncolors`` counts only the seeded colors.  A no-op for the
        other problems.

    Returns
    -------
    Coloring
        The frozen result of the problem's class (:class:`ColumnColoring`, :class:`RowColoring`,
        :class:`StarColoring`, :class:`AcyclicColoring` or :class:`BiColoring`), with its
        decompression plan in ``.plan``.  The same input, order and seed always give the same
        coloring.
    """
    if not isinstance(problem, str) or problem not in PROBLEMS:
        raise ColoringError(
            f"unknown coloring problem {problem!r}; choose one of {', '.join(repr(p) for p in PROBLEMS)}"
        )
    check_order(order)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ColoringError(f"seed must be a non-negative integer, got {seed!r}")
    if postprocess is not True and postprocess is not False:
        raise ColoringError(f"postprocess must be True or False, got {postprocess!r}")
    try:
        P = as_pattern(pattern)
    except (TypeError, ValueError) as exc:
        raise ColoringError(str(exc)) from exc
    recall_derived(P)
    if problem in ("star", "acyclic"):
        P = symmetric_pattern(P)
    seed = int(seed)
    key = (problem, order, seed, postprocess)
    result = _memo_get(P, key)
    if result is None:
        result = _color(P, problem, order, seed, postprocess)
        _memo_put(P, key, result)
    return result


def _color(P: SparsityPattern, problem: str, order: str, seed: int, postprocess: bool) -> Coloring:
    if problem != "bidirectional" and hopeless(P, problem):
        return one_color_each(P, problem)
    if order != "best":
        return _lattice(P, problem, _color_one(P, problem, order, seed, postprocess))
    best = None
    tries = [(o, seed) for o in BEST_ORDERS] + [("random", seed + k) for k in range(BEST_RANDOM_TRIES)]
    results = [_color_one(P, problem, o, s, postprocess) for o, s in tries]
    rounds = min(ITERATED_GREEDY_ROUNDS, int(3_000_000 // ((P.nnz + 1) * len(results))))
    for res in results:
        if rounds:
            res = _iterated_greedy(res, P, problem, seed, postprocess, rounds)
        if best is None or res.ncolors < best.ncolors:
            best = res
    return _lattice(P, problem, best)


def _lattice(P: SparsityPattern, problem: str, result: Coloring) -> Coloring:
    """``result``, or a lattice coloring with fewer colors (column and row problems on grids)."""
    if problem not in ("column", "row"):
        return result
    from asd.coloring.lattice import lattice_colors

    Q, shape = (P, P.input_shape) if problem == "column" else (P.T, P.output_shape)
    found = lattice_colors(Q, shape, lower_bound(P, problem), result.ncolors)
    if found is None:
        return result
    cls = ColumnColoring if problem == "column" else RowColoring
    return cls(P, result.order + "+lattice", found[0], found[1])


def _iterated_greedy(best, pattern, problem, seed, postprocess, rounds):
    """Culberson's iterated greedy: recolor with the vertices grouped by color class (classes
    reversed, largest first, or shuffled); for column/row this never needs more colors.  The
    number of rounds shrinks with the pattern size (none beyond ~3e6 stored entries).  An
    improved result's ``order`` is the winning order's name + ``"+iterated"``."""
    rng = np.random.default_rng(seed)
    start = best.ncolors
    cur = best
    for it in range(rounds):
        col = np.asarray(cur.augmented_colors if isinstance(cur, BiColoring) else cur.colors)
        k = max(int(col.max()) + 1 if col.size else 0, 1)
        mode = it % 3
        if mode == 0:
            cls = np.arange(k)[::-1]
        elif mode == 1:
            cls = np.argsort(-np.bincount(np.maximum(col, 0), minlength=k), kind="stable")
        else:
            cls = rng.permutation(k)
        rank = np.empty(k, dtype=np.int64)
        rank[cls] = np.arange(k)
        perm = np.argsort(rank[np.maximum(col, 0)], kind="stable").astype(np.int64)
        res = _color_one(pattern, problem, best.order, seed, postprocess, perm=perm)
        if problem in ("column", "row") or res.ncolors <= cur.ncolors or it % 3 == 2:
            cur = res
        if cur.ncolors < best.ncolors:
            best = cur
    if best.ncolors < start:
        best = dataclasses.replace(best, order=best.order + "+iterated")
    return best


# -- colorings of recent patterns, by content -------------------------------------------------------
# A coloring is a function of the pattern's content (shape, input and output shapes, entries) and of
# the options: a pattern equal to one colored recently - compared in full, never by identity or by a
# hash alone - gets that result again, rebased onto the pattern asked about (with its decompression
# plan), and the derived structures of the pattern (transpose, symmetry) are shared. Detecting the
# same function again (``sparse_jacobian(f, x, cache=False)`` in a loop, a new operator for the same
# problem) then colors nothing. A kept pattern never aliases memory its caller can write (see
# ``asd.patterns._frozen``). Bounded by :data:`MEMO_ENTRIES` results and :data:`MEMO_NNZ` index
# elements of the kept patterns (``MEMO_ENTRIES = 0`` turns it off); ``asd.clear_cache()`` (or
# :func:`clear_memo`) empties it.

MEMO_ENTRIES = 32
MEMO_NNZ = 1 << 22
_MEMO: "OrderedDict[tuple, tuple[SparsityPattern, Coloring]]" = OrderedDict()
_MEMO_LOCK = fork_safe(threading.Lock())
#: the derived structures a pattern computes once (cached properties), shared between equal patterns
_DERIVED = ("transpose_with_positions", "rows", "is_symmetric", "fingerprint")


def _shape_key(P: SparsityPattern) -> tuple:
    return (P.shape, P.nnz, P.input_shape, P.output_shape)


def _memo_get(P: SparsityPattern, key: tuple) -> Coloring | None:
    """The kept coloring (options ``key``) of a pattern equal to ``P``, rebased onto ``P``, or ``None``."""
    shape = _shape_key(P)
    with _MEMO_LOCK:
        candidates = [(k, v) for k, v in _MEMO.items() if k[0] == key and k[2] == shape]
    for k, (Q, result) in candidates:
        if P is Q or P.equals(Q):
            with _MEMO_LOCK:
                if k in _MEMO:
                    _MEMO.move_to_end(k)
            return _rebased(result, Q, P)
    return None


def _memo_put(P: SparsityPattern, key: tuple, result: Coloring) -> None:
    """Keep ``result`` (options ``key``) for ``P``: entries are told apart by the options, ``P``'s
    identity (while it is kept) and its shapes; the oldest go first beyond the bounds."""
    if _weight(P) > MEMO_NNZ:
        return
    with _MEMO_LOCK:
        _MEMO[(key, id(P), _shape_key(P))] = (P, result)
        total = sum(_weight(Q) for Q, _ in _MEMO.values())
        while _MEMO and (len(_MEMO) > MEMO_ENTRIES or total > MEMO_NNZ):
            _, (Q, _) = _MEMO.popitem(last=False)
            total -= _weight(Q)


def _weight(P: SparsityPattern) -> int:
    """The array elements a kept pattern holds: its entries and both index pointers."""
    return P.nnz + P.shape[0] + P.shape[1] + 2


def _rebased(result: Coloring, Q: SparsityPattern, P: SparsityPattern) -> Coloring:
    """``result`` (a coloring of ``Q``) as a coloring of the equal pattern ``P``: the same colors
    and decompression plan (both functions of the content); a result of a pattern derived from
    ``Q`` (its symmetrization) is returned as it is."""
    if result.pattern is P or result.pattern is not Q:
        return result
    out = dataclasses.replace(result, pattern=P)
    if "plan" in result.__dict__:
        out.__dict__["plan"] = result.plan
    return out


def recall_derived(P: SparsityPattern) -> None:
    """Give ``P`` the derived structures (transpose, symmetry) of an equal pattern colored recently,
    where it has not built them itself."""
    if all(name in P.__dict__ for name in _DERIVED[:3]):
        return
    shape = _shape_key(P)
    with _MEMO_LOCK:
        candidates = [Q for k, (Q, _) in _MEMO.items() if k[2] == shape and Q is not P]
    for Q in candidates:
        if P.equals(Q):
            for name in _DERIVED:
                if name in Q.__dict__ and name not in P.__dict__:
                    P.__dict__[name] = Q.__dict__[name]
            return


def clear_memo() -> None:
    """Forget the colorings kept by pattern content."""
    with _MEMO_LOCK:
        _MEMO.clear()
