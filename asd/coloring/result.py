"""Immutable coloring results and their decompression plans.

Compressed-product layout (batch first), as produced by the torch evaluation:

* ``column``: ``B`` of shape ``(ncolors, m)``, ``B[c] = J @ s_c`` (one JVP per color)
* ``row``: ``B`` of shape ``(ncolors, n)``, ``B[c] = s_c^T J`` (one VJP per color)
* ``star`` / ``acyclic``: ``B`` of shape ``(ncolors, n)``, ``B[c] = H @ s_c``
* ``bidirectional``: ``Bc`` of shape ``(ncol, m)`` from JVPs and ``Br`` of shape ``(nrow, n)``
  from VJPs; the flat buffer is ``concat([Bc.ravel(), Br.ravel()])``.

Decompressed values are always returned in the order of the canonical CSR pattern
``(Coloring.indptr, Coloring.indices)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Coloring", "DecompressionPlan"]


@dataclass(frozen=True, eq=False)
class DecompressionPlan:
    """Where every stored entry of the pattern comes from in the compressed product.

    ``kind == "direct"``: ``values = B.reshape(-1)[gather]``.

    ``kind == "substitution"`` (acyclic colorings): the entries are solved in *steps*,
    sorted by *level*; every step of a level depends only on steps of earlier levels::

        for each level l, steps k in level_ptr[l]:level_ptr[l+1]:
            v_k = B.flat[step_src[k]] - sum(values[dep_pos[d]] for d in dep_ptr[k]:dep_ptr[k+1])
            values[step_pos[k]] = values[step_pos_t[k]] = v_k

    ``dep_step[d]`` is the (global) step that dependency ``d`` belongs to (``dep_ptr``
    expanded), convenient for ``index_add``-style vectorised kernels.  ``step_pos_t`` is the
    CSR position of the transposed entry (equal to ``step_pos`` on the diagonal), so the
    symmetric result fills both triangles.  All arrays are ``int64``.
    """

    kind: str
    compressed_shape: Any
    nnz: int
    gather: np.ndarray | None = None
    step_pos: np.ndarray | None = None
    step_pos_t: np.ndarray | None = None
    step_src: np.ndarray | None = None
    dep_ptr: np.ndarray | None = None
    dep_pos: np.ndarray | None = None
    dep_step: np.ndarray | None = None
    level_ptr: np.ndarray | None = None

    @property
    def nlevels(self) -> int:
        """Number of sequential substitution levels (0 for direct plans)."""
        return 0 if self.level_ptr is None else len(self.level_ptr) - 1

    @property
    def compressed_size(self) -> int:
        """Number of elements of the flat, batch-first compressed buffer the plan reads."""
        shp = self.compressed_shape
        if shp and isinstance(shp[0], tuple):
            return int(sum(int(np.prod(s)) for s in shp))
        return int(np.prod(shp))

    def decompress(self, compressed) -> np.ndarray:
        """Numpy (and Numba for substitution) reference decompression."""
        flat = np.ascontiguousarray(np.asarray(compressed)).reshape(-1)
        if flat.size != self.compressed_size:
            from asd.errors import DecompressionError

            raise DecompressionError(
                f"compressed buffer has {flat.size} elements, the plan expects "
                f"{self.compressed_size} (layout {self.compressed_shape}, batch first)"
            )
        if self.kind == "direct":
            return flat[self.gather]
        from asd.coloring._substitution_kernels import substitute_numba

        if not np.issubdtype(flat.dtype, np.floating):
            flat = flat.astype(np.float64)
        return substitute_numba(
            flat, self.step_pos, self.step_pos_t, self.step_src, self.dep_ptr, self.dep_pos, self.nnz
        )


@dataclass(frozen=True, eq=False)
class Coloring:
    """A verified-by-construction coloring together with its decompression plan.

    ``colors``: int64, 0-based, contiguous ``0..ncolors-1``; ``-1`` marks a *neutral* vertex
    (not seeded) - only possible for ``bidirectional`` and for ``postprocess=True``.
    For ``bidirectional`` it is the pair ``(row_colors, col_colors)`` and ``ncolors`` is the
    number of AD passes (row colors + column colors).
    """

    problem: str
    order: str
    shape: tuple
    colors: Any
    ncolors: int
    indptr: np.ndarray
    indices: np.ndarray
    plan: DecompressionPlan
    meta: dict = field(default_factory=dict, repr=False)

    # -- convenience -------------------------------------------------------------------
    @property
    def nnz(self) -> int:
        """Number of stored entries of the pattern the plan fills."""
        return int(self.indices.shape[0])

    @property
    def nrow_colors(self) -> int:
        """Row colors (VJPs) of a bidirectional coloring."""
        if self.problem != "bidirectional":
            raise AttributeError("nrow_colors is only defined for bidirectional colorings")
        return int(self.plan.compressed_shape[1][0])

    @property
    def ncol_colors(self) -> int:
        """Column colors (JVPs) of a bidirectional coloring."""
        if self.problem != "bidirectional":
            raise AttributeError("ncol_colors is only defined for bidirectional colorings")
        return int(self.plan.compressed_shape[0][0])

    def rows(self) -> np.ndarray:
        """Row index of every stored entry (CSR order)."""
        return np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))

    @staticmethod
    def _seed(colors: np.ndarray, k: int) -> np.ndarray:
        s = np.zeros((colors.shape[0], k), dtype=np.float64)
        on = colors >= 0
        s[np.nonzero(on)[0], colors[on]] = 1.0
        return s

    def seeds(self):
        """0/1 seed matrices (float64): ``(n, ncolors)`` for column/star/acyclic,
        ``(m, ncolors)`` for row, ``(row_seeds (m, nr), col_seeds (n, nc))`` for bidirectional."""
        if self.problem == "bidirectional":
            rc, cc = self.colors
            return self._seed(rc, self.nrow_colors), self._seed(cc, self.ncol_colors)
        return self._seed(self.colors, self.ncolors)

    def compress(self, values) -> np.ndarray:
        """The compressed product of a matrix with this pattern and ``values`` (CSR order),
        in the batch-first layout (numpy; for tests and references).  For bidirectional
        the flat ``concat([Bc.ravel(), Br.ravel()])`` buffer is returned."""
        A = self.to_scipy(values)
        if self.problem == "bidirectional":
            rs, cs = self.seeds()
            Bc = np.asarray((A @ cs).T)
            Br = np.asarray((A.T @ rs).T)
            return np.concatenate([Bc.ravel(), Br.ravel()])
        S = self.seeds()
        if self.problem == "row":
            return np.ascontiguousarray(np.asarray((A.T @ S).T))
        return np.ascontiguousarray(np.asarray((A @ S).T))

    def decompress(self, compressed) -> np.ndarray:
        """Values of the stored entries in CSR order from the compressed product."""
        return self.plan.decompress(compressed)

    def to_scipy(self, values):
        """``scipy.sparse.csr_array`` with this pattern and ``values`` (CSR order)."""
        import scipy.sparse as sp

        values = np.asarray(values)
        if values.shape != (self.nnz,):
            from asd.errors import DecompressionError

            raise DecompressionError(f"expected {self.nnz} values in CSR order, got shape {values.shape}")
        return sp.csr_array((values, self.indices.copy(), self.indptr.copy()), shape=self.shape)

    def graph(self):
        """The graph this coloring colors, as an ``igraph.Graph`` with a ``color`` vertex
        attribute: the column-intersection graph (column), row-intersection graph (row),
        adjacency graph (star/acyclic) or bipartite graph (bidirectional; columns first,
        then rows, vertex attribute ``kind``)."""
        from asd.coloring.graphs import to_igraph

        return to_igraph(self)
