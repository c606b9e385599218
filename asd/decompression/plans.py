"""Decompression plans: where every stored entry comes from in the compressed product.

One plan function per coloring result class (:func:`build_plan` dispatches on the class):

* :class:`DirectPlan` (column, row, star and bicolorings): ``values = B.reshape(-1)[gather]``.
* :class:`SubstitutionPlan` (acyclic colorings): entries solved in *steps*, in a sequential
  order (every step's dependencies are written by earlier steps), which the CPU kernel follows
  one step at a time. :attr:`SubstitutionPlan.leveled` sorts them by *level* (every step of a
  level depends only on steps of earlier levels) for the vectorised kernels of other devices::

      for each level l, steps k in level_ptr[l]:level_ptr[l+1]:
          v_k = B.flat[step_src[k]] - sum(values[dep_pos[d]] for d in dep_ptr[k]:dep_ptr[k+1])
          values[step_pos[k]] = values[step_pos_t[k]] = v_k

  ``dep_step[d]`` is the (global) step dependency ``d`` belongs to; ``step_pos_t`` is the CSR
  position of the mirrored entry (equal to ``step_pos`` on the diagonal).

Plans are frozen and their arrays read-only. This module imports neither torch nor numba
(the Numba kernels load on first use).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property, singledispatch

import numpy as np

from asd.coloring.result import AcyclicColoring, BiColoring, ColumnColoring, RowColoring, StarColoring
from asd.errors import ColoringError, DecompressionError
from asd.patterns import _frozen as _ro

__all__ = ["DirectPlan", "SubstitutionPlan", "build_plan"]

_I = np.int64


def _sealed(*arrays: np.ndarray) -> tuple | None:
    """Arrays this module has just computed (no one else holds them), made read-only in place, or
    ``None`` where one is not a contiguous int64 array (then the plan copies them as usual)."""
    if not all(isinstance(a, np.ndarray) and a.dtype == np.int64 and a.flags.c_contiguous for a in arrays):
        return None
    for a in arrays:
        a.setflags(write=False)
    return arrays


class _Plan:
    compressed_shape: tuple
    nnz: int

    @property
    def compressed_size(self) -> int:
        """Number of elements of the flat, batch-first compressed buffer the plan reads."""
        shp = self.compressed_shape
        if shp and isinstance(shp[0], tuple):
            return int(sum(int(np.prod(s)) for s in shp))
        return int(np.prod(shp))

    def _flat(self, compressed) -> np.ndarray:
        flat = np.ascontiguousarray(np.asarray(compressed)).reshape(-1)
        if flat.size != self.compressed_size:
            raise DecompressionError(
                f"compressed buffer has {flat.size} elements, the plan expects "
                f"{self.compressed_size} (layout {self.compressed_shape}, batch first)")
        return flat


@dataclass(frozen=True, eq=False)
class DirectPlan(_Plan):
    """``values = compressed.reshape(-1)[gather]``."""

    compressed_shape: tuple
    nnz: int
    gather: np.ndarray

    def __post_init__(self):
        object.__setattr__(self, "gather", _ro(self.gather))

    nlevels = 0

    def decompress(self, compressed) -> np.ndarray:
        """Numpy reference decompression."""
        return self._flat(compressed)[self.gather]


@dataclass(frozen=True, eq=False)
class SubstitutionPlan(_Plan):
    """Substitution steps of an acyclic coloring (see the module docstring): sorted by level where
    ``level_ptr`` and ``dep_step`` are given, else in a sequential order only (:attr:`leveled`
    sorts them; the CPU kernel needs no levels, and sorting a long elimination tree costs a tenth
    of a one-off 10^6-unknown Hessian)."""

    compressed_shape: tuple
    nnz: int
    step_pos: np.ndarray
    step_pos_t: np.ndarray
    step_src: np.ndarray
    dep_ptr: np.ndarray
    dep_pos: np.ndarray
    dep_step: np.ndarray | None = None
    level_ptr: np.ndarray | None = None

    def __post_init__(self):
        if (self.dep_step is None) != (self.level_ptr is None):
            raise DecompressionError("a substitution plan has both dep_step and level_ptr (sorted by level) or "
                                     "neither (sequential)")
        for name in ("step_pos", "step_pos_t", "step_src", "dep_ptr", "dep_pos", "dep_step", "level_ptr"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _ro(getattr(self, name)))
        self._validate()

    def _validate(self) -> None:
        """Raise :class:`DecompressionError` unless the plan is one the kernels can read unchecked
        (a plan built by hand; the library's own are made by :meth:`_of_sealed`)."""
        ns = self.step_pos.shape[0]
        arrays = [self.step_pos, self.step_pos_t, self.step_src, self.dep_ptr, self.dep_pos]
        if self.is_leveled:
            arrays += [self.dep_step, self.level_ptr]
        if any(a.ndim != 1 for a in arrays):
            raise DecompressionError("a substitution plan's arrays must be 1-D")
        if not (self.step_pos_t.shape[0] == self.step_src.shape[0] == ns and self.dep_ptr.shape[0] == ns + 1):
            raise DecompressionError("a substitution plan needs step_pos, step_pos_t and step_src of one length and "
                                     "dep_ptr one longer")
        if self.is_leveled and (self.dep_step.shape[0] != self.dep_pos.shape[0] or self.level_ptr.shape[0] < 1):
            raise DecompressionError("a leveled substitution plan needs dep_step as long as dep_pos and a level_ptr")
        from asd.decompression._substitution_kernels import plan_error

        empty = np.zeros(1, dtype=_I)
        why = plan_error(int(self.nnz), int(self.compressed_size), self.step_pos, self.step_pos_t, self.step_src,
                         self.dep_ptr, self.dep_pos, self.dep_step if self.is_leveled else empty,
                         self.level_ptr if self.is_leveled else empty, self.is_leveled)
        if why:
            raise DecompressionError(f"malformed substitution plan: {why}")

    @classmethod
    def _of_sealed(cls, *values) -> SubstitutionPlan:
        """A plan of arrays :func:`_sealed` just made read-only (memory a Numba kernel allocated,
        which :func:`asd.patterns._frozen` would copy): kept as they are (a tenth of a
        10^6-unknown one-off Hessian)."""
        plan = object.__new__(cls)
        for field, value in zip(fields(cls), values, strict=True):
            object.__setattr__(plan, field.name, value)
        return plan

    @property
    def is_leveled(self) -> bool:
        """Whether the steps are sorted by level (``level_ptr`` and ``dep_step`` are given)."""
        return self.level_ptr is not None

    @property
    def leveled(self) -> SubstitutionPlan:
        """The plan with its steps sorted by level (this plan where they are): built once."""
        if self.is_leveled:
            return self  # not cached on itself: that would be a reference cycle
        return self._sorted_by_level

    @cached_property
    def _sorted_by_level(self) -> SubstitutionPlan:
        from asd.decompression._substitution_kernels import sort_steps_by_level

        steps = sort_steps_by_level(self.nnz, self.step_pos, self.step_pos_t, self.step_src, self.dep_ptr,
                                    self.dep_pos)
        sealed = _sealed(*steps)
        if sealed is None:
            return SubstitutionPlan(self.compressed_shape, self.nnz, *steps)
        return SubstitutionPlan._of_sealed(self.compressed_shape, self.nnz, *sealed)

    @property
    def nlevels(self) -> int:
        """Number of sequential substitution levels (sorts a sequential plan by level)."""
        return len(self.leveled.level_ptr) - 1

    @cached_property
    def writes_every_entry(self) -> bool:
        """Whether the steps write every stored entry (a plan of an acyclic coloring does; one
        built by hand may leave entries at zero)."""
        from asd.decompression._substitution_kernels import writes_every_entry

        return bool(writes_every_entry(self.nnz, self.step_pos, self.step_pos_t))

    def decompress(self, compressed) -> np.ndarray:
        """Numpy/Numba reference decompression."""
        flat = self._flat(compressed)
        if not np.issubdtype(flat.dtype, np.floating):
            flat = flat.astype(np.float64)
        from asd.decompression._substitution_kernels import substitute_numba

        return substitute_numba(flat, self)


@singledispatch
def build_plan(coloring):
    """The decompression plan of a coloring result."""
    raise TypeError(f"no decompression plan for {type(coloring).__name__}")


@build_plan.register
def _(coloring: ColumnColoring) -> DirectPlan:
    m, _ = coloring.shape
    gather = coloring.colors[coloring.indices] * m + coloring.rows()
    return DirectPlan((coloring.ncolors, m), coloring.nnz, gather)


@build_plan.register
def _(coloring: RowColoring) -> DirectPlan:
    _, n = coloring.shape
    # colors[rows] * n + indices, with each row's offset repeated over its entries
    gather = np.repeat(coloring.colors * n, np.diff(coloring.indptr))
    gather += coloring.indices
    gather.setflags(write=False)  # the plan's own: kept uncopied
    return DirectPlan((coloring.ncolors, n), coloring.nnz, gather)


@build_plan.register
def _(coloring: StarColoring) -> DirectPlan:
    n = coloring.shape[0]
    if coloring.nnz == 0:
        return DirectPlan((coloring.ncolors, n), 0, np.zeros(0, dtype=_I))
    from asd.decompression._direct_kernels import star_gather

    gather = np.empty(coloring.nnz, dtype=_I)
    star_gather(coloring.rows(), coloring.indices, coloring.colors, coloring.from_column, n, gather)
    gather.setflags(write=False)  # the plan's own: kept uncopied
    return DirectPlan((coloring.ncolors, n), coloring.nnz, gather)


@build_plan.register
def _(coloring: BiColoring) -> DirectPlan:
    m, n = coloring.shape
    i, j = coloring.rows(), coloring.indices
    ncc = coloring.ncol_colors
    gather = np.where(coloring.from_column, coloring.col_colors[j] * m + i,
                      ncc * m + coloring.row_colors[i] * n + j)
    return DirectPlan(((ncc, m), (coloring.nrow_colors, n)), coloring.nnz, gather)


@build_plan.register
def _(coloring: AcyclicColoring) -> SubstitutionPlan:
    return substitution_plan(coloring.pattern, coloring.colors, coloring.ncolors)


def substitution_plan(pattern, colors, ncolors) -> SubstitutionPlan:
    """Substitution plan of an acyclic coloring of the symmetric ``pattern``.

    Every two-colored forest is peeled leaf by leaf: the entry ``(i, j)`` for a leaf ``i`` with
    remaining neighbour ``j`` is ``B[c(j)][i]`` minus ``i``'s already solved entries of the same
    forest. The steps stay in that (sequential) order; :attr:`SubstitutionPlan.leveled` sorts
    them by level (1 + the deepest step they depend on) for a vectorised kernel that solves one
    level at a time. Raises :class:`ColoringError` if the colors are not an acyclic coloring.
    """
    ptr, idx = pattern.indptr, pattern.indices
    n = pattern.shape[0]
    nnz = pattern.nnz
    rows = pattern.rows
    colors = np.asarray(colors, dtype=_I)
    if (colors < 0).any():
        raise ColoringError("substitution needs a coloring without neutral vertices")
    if len(colors) != n:
        raise ColoringError(f"substitution needs one color per vertex: {len(colors)} colors for {n} vertices")
    if n and int(colors.max()) >= int(ncolors):  # the kernels index pairs of colors without bounds checks
        raise ColoringError(f"substitution needs colors below ncolors={int(ncolors)}, got color {int(colors.max())}")
    if not pattern.is_symmetric:  # the kernels read every entry's mirror position
        raise ColoringError("substitution needs a symmetric pattern (a Hessian's); this one is not symmetric")
    if n == 0:
        z = np.zeros(0, dtype=_I)
        return SubstitutionPlan((int(ncolors), n), nnz, z, z, z, np.zeros(1, _I), z, z, np.zeros(1, _I))
    from asd.decompression._substitution_kernels import build_substitution, group_by_pair

    _, tpos = pattern.transpose_with_positions  # symmetric: the mirror position of every entry
    k = max(int(ncolors), 1)
    # the kernels' scratch: int32 where every vertex and position fits (half the memory to fault in)
    scratch = np.int32 if max(n, nnz) < np.iinfo(np.int32).max else _I
    perm, gstart, clash = group_by_pair(rows, idx, colors, k, np.empty(nnz, dtype=scratch))
    if clash:
        raise ColoringError("substitution needs a distance-1 coloring (two adjacent vertices share a color)")
    *steps, ok = build_substitution(ptr, idx, tpos, rows, colors, perm, gstart, n, np.zeros((n, 5), dtype=scratch),
                                    np.empty(n, dtype=scratch))
    if not ok:
        raise ColoringError("the coloring has a two-colored cycle: it is not acyclic, substitution impossible")
    sealed = _sealed(*steps)
    if sealed is None:
        return SubstitutionPlan((int(ncolors), n), nnz, *steps)
    return SubstitutionPlan._of_sealed((int(ncolors), n), nnz, *sealed, None, None)
