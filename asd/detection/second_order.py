"""The shared second-order pattern of a Hessian trace, accumulated piece by piece (torch-free: the
PyTorch tracer, :mod:`asd.detection.hessian`, and the jaxpr interpreter, :mod:`asd.jax.interpreter`,
both fill one).

A trace adds ``G^T G`` (every pair of dependencies of one row of ``G``) at each nonlinear op and
``Ga^T Gb + Gb^T Ga`` at each bilinear one. The squares are kept as their ``G`` and multiplied out
once, on the stacked rows (``sum_k G_k^T G_k`` is ``G^T G`` for ``G`` the ``G_k`` stacked): one
sparse product instead of a product and an ``n x n`` sum per op.
"""

from __future__ import annotations

import scipy.sparse as sp

from . import sets as S

__all__ = ["SecondOrder", "gram"]


def gram(Ga: sp.csr_matrix, Gb: sp.csr_matrix) -> sp.csr_matrix:
    """Boolean ``Ga^T Gb`` for set matrices with the same rows."""
    return (Ga.T.tocsr() @ Gb).tocsr()


class SecondOrder:
    """The symmetric ``n x n`` pattern ``H`` of one trace.

    Every entry added is kept (a sound superset); :meth:`pattern` returns ``H`` as a boolean CSR
    matrix with sorted indices.
    """

    #: multiply out or merge the accumulated pieces once their total size exceeds this many entries
    MERGE_NNZ = 1 << 24

    def __init__(self, n: int):
        self.n = n
        self._pieces: list[sp.csr_matrix] = []
        self._pending = 0
        # the G of every H |= G^T G not yet multiplied out, by identity (kept alive, so an id is
        # not reused; set matrices are never modified)
        self._squares: dict[int, sp.csr_matrix] = {}
        self._squares_nnz = 0

    def add(self, M: sp.spmatrix, symmetric: bool = True) -> None:
        """``H |= M`` (``M + M^T`` where ``symmetric`` is False)."""
        if M.nnz == 0:
            return
        M = M.tocsr()
        if not symmetric:
            M = (M + M.T.tocsr()).tocsr()
        self._pieces.append(M)
        self._pending += M.nnz
        if self._pending > self.MERGE_NNZ and len(self._pieces) > 1:
            self._pieces = [self._sum()]
            self._pending = self._pieces[0].nnz

    def add_square(self, G: sp.csr_matrix | None) -> None:
        """``H |= G^T G``: every pair of dependencies of one row of ``G``."""
        if G is None or not G.nnz or id(G) in self._squares:
            return
        self._squares[id(G)] = G
        self._squares_nnz += G.nnz
        if self._squares_nnz > self.MERGE_NNZ:
            self._flush_squares()

    def add_cross(self, Ga: sp.csr_matrix | None, Gb: sp.csr_matrix | None) -> None:
        """``H |= Ga^T Gb + Gb^T Ga`` (rows of ``Ga`` and ``Gb`` interact pairwise)."""
        if Ga is not None and Gb is not None and Ga.nnz and Gb.nnz:
            self.add(gram(Ga, Gb), symmetric=Ga is Gb)

    def _flush_squares(self) -> None:
        if self._squares:
            G = S.vstack([g if g.format == "csr" and g.has_sorted_indices else S._canonical(g.tocsr(copy=True))
                          for g in self._squares.values()])  # stacking reads CSR arrays (a CSC G would be read as CSR)
            self._squares, self._squares_nnz = {}, 0
            self.add(gram(G, G))

    def _sum(self) -> sp.csr_matrix:
        return S.union(self._pieces, self.n, self.n)

    def pattern(self) -> sp.csr_matrix:
        """The accumulated symmetric pattern (bool CSR, sorted indices)."""
        self._flush_squares()
        return self._sum()
