"""Immutable coloring results, one class per problem.

Each result holds the pattern it colors (a :class:`~asd.patterns.SparsityPattern`; for the
symmetric problems the structure of ``A + A^T``), the vertex order used, and its typed colors.
:attr:`Coloring.plan` builds the decompression plan once (the plans live in
:mod:`asd.decompression.plans`, one function per result class), and :meth:`Coloring.seeds`
gives the seed rows of the compressed products, batch first:

* :class:`ColumnColoring`: ``B[c] = J @ s_c`` (one JVP per color), ``B`` of shape ``(ncolors, m)``
* :class:`RowColoring`: ``B[c] = s_c^T J`` (one VJP per color), shape ``(ncolors, n)``
* :class:`StarColoring` / :class:`AcyclicColoring`: ``B[c] = H @ s_c``, shape ``(ncolors, n)``
* :class:`BiColoring`: ``Bc`` of shape ``(ncol_colors, m)`` from JVPs and ``Br`` of shape
  ``(nrow_colors, n)`` from VJPs; the flat buffer is ``concat([Bc.ravel(), Br.ravel()])``.

Decompressed values are always in the CSR order of ``pattern``. This module imports neither
torch nor numba.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from asd.errors import ColoringError, DecompressionError
from asd.patterns import SparsityPattern, _frozen

__all__ = ["Coloring", "ColumnColoring", "RowColoring", "StarColoring", "AcyclicColoring", "BiColoring",
           "ColumnSeeds", "RowSeeds"]


def _ro(a) -> np.ndarray:
    return _frozen(a, np.bool_ if np.asarray(a).dtype == np.bool_ else np.int64)


def _seed_rows(colors: np.ndarray, k: int, dtype) -> np.ndarray:
    if colors.size and (int(colors.max()) >= k or int(colors.min()) < -1):
        raise ColoringError(f"colors must lie in [-1, {k - 1}] for {k} colors (-1: not seeded); got "
                            f"{int(colors.min())}..{int(colors.max())}")
    s = np.empty((k, colors.shape[0]), dtype=dtype)
    for c in range(k):  # one streaming pass per row (a scatter into zeros: 3x slower at n = 10^6)
        np.equal(colors, c, out=s[c], casting="unsafe")
    return s


@dataclass(frozen=True)
class ColumnSeeds:
    """Seed rows ``S`` (``(k, n)``) whose products are ``J @ S[c]`` (JVPs, or HVPs ``H @ S[c]``)."""

    matrix: object


@dataclass(frozen=True)
class RowSeeds:
    """Seed rows ``S`` (``(k, m)``) whose products are ``S[c]^T J`` (VJPs)."""

    matrix: object


def _convert(a: np.ndarray, dtype, device):
    """Numpy seeds as they are, or as a torch tensor when a torch dtype or a device is asked for."""
    if device is None and (dtype is None or isinstance(dtype, (type, np.dtype))):
        return a if dtype is None else a.astype(dtype)
    import torch  # only when the caller asks for torch tensors

    return torch.as_tensor(a).to(device=device, dtype=dtype or torch.float64)


@dataclass(frozen=True, eq=False)
class Coloring:
    """Base of the coloring results (see the module docstring).

    Attributes
    ----------
    pattern : SparsityPattern
        The colored pattern (symmetrized for star and acyclic colorings).
    order : str
        The vertex order that produced the colors (``"given"`` for :func:`asd.coloring.build.from_colors`).
    ncolors : int
        Number of compressed products (AD passes), in every result class.
    """

    pattern: SparsityPattern
    order: str

    problem: ClassVar[str] = ""

    @property
    def shape(self) -> tuple[int, int]:
        return self.pattern.shape

    @property
    def indptr(self) -> np.ndarray:
        return self.pattern.indptr

    @property
    def indices(self) -> np.ndarray:
        return self.pattern.indices

    @property
    def nnz(self) -> int:
        """Number of stored entries of the pattern the plan fills."""
        return self.pattern.nnz

    def rows(self) -> np.ndarray:
        """Row index of every stored entry (CSR order)."""
        return self.pattern.rows

    @cached_property
    def plan(self):
        """The decompression plan (:class:`~asd.decompression.plans.DirectPlan` or
        :class:`~asd.decompression.plans.SubstitutionPlan`), built once."""
        from asd.decompression.plans import build_plan

        return build_plan(self)

    def seed_blocks(self, dtype=None, device=None) -> tuple:
        """The seeds as typed blocks (:class:`ColumnSeeds` / :class:`RowSeeds`), in the order of
        the flat compressed buffer."""
        raise NotImplementedError

    def seeds(self, dtype=None, device=None):
        """0/1 seed rows, batch first: ``(ncolors, n)`` for column, star and acyclic colorings,
        ``(ncolors, m)`` for row colorings, ``(row_seeds, col_seeds)`` for bicolorings.

        Numpy (float64 unless ``dtype`` says otherwise); a torch tensor when a torch ``dtype`` or
        a ``device`` is given.
        """
        return self.seed_blocks(dtype, device)[0].matrix

    def compress(self, values) -> np.ndarray:
        """The flat compressed product of the matrix with this pattern and ``values`` (CSR order):
        a numpy reference for tests."""
        import scipy.sparse as sp

        A = self.to_scipy(values)
        parts = []
        for block in self.seed_blocks():
            S = sp.csr_array(block.matrix)  # one nonzero per column: sparse x sparse stays O(nnz)
            B = (A @ S.T).T if isinstance(block, ColumnSeeds) else (A.T @ S.T).T
            parts.append(B.toarray().reshape(-1))
        return np.concatenate(parts) if parts else np.zeros(0)

    def decompress(self, compressed) -> np.ndarray:
        """Values of the stored entries in CSR order from the compressed product (numpy)."""
        return self.plan.decompress(compressed)

    def to_scipy(self, values):
        """``scipy.sparse.csr_array`` with this pattern and ``values`` (CSR order)."""
        import scipy.sparse as sp

        values = np.asarray(values)
        if values.shape != (self.nnz,):
            raise DecompressionError(f"expected {self.nnz} values in CSR order, got shape {values.shape}")
        return sp.csr_array((values, self.indices.copy(), self.indptr.copy()), shape=self.shape)

    def graph(self):
        """The graph this coloring colors, as an ``igraph.Graph`` with a ``color`` vertex
        attribute (needs the optional igraph)."""
        from asd.coloring.graphs import to_igraph

        return to_igraph(self)


@dataclass(frozen=True, eq=False)
class _OneSided(Coloring):
    colors: np.ndarray
    ncolors: int

    def __post_init__(self):
        object.__setattr__(self, "colors", _ro(self.colors))
        object.__setattr__(self, "ncolors", int(self.ncolors))


@dataclass(frozen=True, eq=False)
class ColumnColoring(_OneSided):
    """Partial distance-2 coloring of the columns: one JVP per color."""

    problem: ClassVar[str] = "column"

    def seed_blocks(self, dtype=None, device=None) -> tuple:
        return (ColumnSeeds(_convert(_seed_rows(self.colors, self.ncolors, np.float64), dtype, device)),)


@dataclass(frozen=True, eq=False)
class RowColoring(_OneSided):
    """Partial distance-2 coloring of the rows: one VJP per color."""

    problem: ClassVar[str] = "row"

    def seed_blocks(self, dtype=None, device=None) -> tuple:
        return (RowSeeds(_convert(_seed_rows(self.colors, self.ncolors, np.float64), dtype, device)),)


@dataclass(frozen=True, eq=False)
class _Symmetric(_OneSided):
    def seed_blocks(self, dtype=None, device=None) -> tuple:
        return (ColumnSeeds(_convert(_seed_rows(self.colors, self.ncolors, np.float64), dtype, device)),)


@dataclass(frozen=True, eq=False)
class StarColoring(_Symmetric):
    """Symmetric star coloring: every entry read directly from one Hessian-vector product.

    ``from_column[p]`` says where the stored entry ``p = (i, j)`` is read: ``True`` from the
    product of ``j``'s color at row ``i``, ``False`` from the product of ``i``'s color at row ``j``.
    Vertices with color ``-1`` (``postprocess=True``) are not seeded.
    """

    from_column: np.ndarray = None

    problem: ClassVar[str] = "star"

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "from_column", _ro(np.asarray(self.from_column, dtype=np.bool_)))
        # the plan's kernel reads colors[i], colors[j] and from_column[p] without bounds checks
        if self.colors.shape != (self.pattern.shape[0],):
            raise ColoringError(f"a star coloring needs one color per vertex: {self.colors.shape[0] if self.colors.ndim else 0} "
                                f"colors for {self.pattern.shape[0]} vertices")
        if self.from_column.shape != (self.pattern.nnz,):
            raise ColoringError(f"from_column needs one flag per stored entry: shape {self.from_column.shape}, "
                                f"{self.pattern.nnz} entries")


@dataclass(frozen=True, eq=False)
class AcyclicColoring(_Symmetric):
    """Symmetric acyclic coloring: entries recovered by substitution along two-colored trees."""

    problem: ClassVar[str] = "acyclic"


@dataclass(frozen=True, eq=False)
class BiColoring(Coloring):
    """Bidirectional coloring: column colors seed JVPs, row colors seed VJPs (``-1``: neutral).

    ``from_column[p]`` is ``True`` when the stored entry ``p = (i, j)`` is read from the JVP of
    ``j``'s column color (at row ``i``), ``False`` when from the VJP of ``i``'s row color (at
    column ``j``). ``augmented_colors`` are the colors of the bipartite graph (columns, then rows)
    that produced the bicoloring (used to recolor in ``order="best"``).
    """

    row_colors: np.ndarray
    col_colors: np.ndarray
    nrow_colors: int
    ncol_colors: int
    from_column: np.ndarray
    augmented_colors: np.ndarray

    problem: ClassVar[str] = "bidirectional"

    def __post_init__(self):
        for name in ("row_colors", "col_colors", "augmented_colors"):
            object.__setattr__(self, name, _ro(getattr(self, name)))
        object.__setattr__(self, "from_column", _ro(np.asarray(self.from_column, dtype=np.bool_)))
        object.__setattr__(self, "nrow_colors", int(self.nrow_colors))
        object.__setattr__(self, "ncol_colors", int(self.ncol_colors))

    @property
    def colors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(row_colors, col_colors)``."""
        return self.row_colors, self.col_colors

    @property
    def ncolors(self) -> int:
        return self.nrow_colors + self.ncol_colors

    def seed_blocks(self, dtype=None, device=None) -> tuple:
        return (ColumnSeeds(_convert(_seed_rows(self.col_colors, self.ncol_colors, np.float64), dtype, device)),
                RowSeeds(_convert(_seed_rows(self.row_colors, self.nrow_colors, np.float64), dtype, device)))

    def seeds(self, dtype=None, device=None):
        """``(row_seeds (nrow_colors, m), col_seeds (ncol_colors, n))``, batch first."""
        cs, rs = self.seed_blocks(dtype, device)
        return rs.matrix, cs.matrix
