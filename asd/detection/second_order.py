"""The shared second-order pattern of a Hessian trace, accumulated piece by piece (torch-free: the
PyTorch tracer, :mod:`asd.detection.hessian`, and the jaxpr interpreter, :mod:`asd.jax.interpreter`,
both fill one).

A trace adds ``G^T G`` (every pair of dependencies of one row of ``G``) at each nonlinear op and
``Ga^T Gb + Gb^T Ga`` at each bilinear one. The squares are kept as their ``G`` and multiplied out
once, on the stacked rows (``sum_k G_k^T G_k`` is ``G^T G`` for ``G`` the ``G_k`` stacked): one
sparse product instead of a product and an ``n x n`` sum per op.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import sets as S

__all__ = ["SecondOrder", "gram"]


def gram(Ga: sp.csr_matrix, Gb: sp.csr_matrix) -> sp.csr_matrix:
    """Boolean ``Ga^T Gb`` for set matrices with the same rows."""
    if Ga is Gb and S._is_canonical(Ga):
        cp, cj = S._kernels().gram(Ga.indptr, Ga.indices, Ga.shape[1])
        return S._csr(cp, cj, (Ga.shape[1], Ga.shape[1]))
    return S._canonical(Ga.T.tocsr() @ Gb)


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
        if not self._squares:
            return
        # a row with one dependency squares to a diagonal entry: such rows (an elementwise op on one
        # input, x ** 2 or exp(x)) are marked on the diagonal, and only the others multiplied out
        diagonal = np.zeros(self.n, dtype=bool)
        longer = []
        for g in self._squares.values():
            g = g if g.format == "csr" and g.has_sorted_indices else S._canonical(g.tocsr(copy=True))
            lo = int(g.indptr[0])
            if lo:  # a matrix built by hand whose entries start past its first: stacked from 0
                g = S._csr(g.indptr - lo, g.indices[lo:int(g.indptr[-1])], g.shape)
            lengths = np.diff(g.indptr)
            single = lengths == 1
            nsingle = int(np.count_nonzero(single))
            if nsingle == 0:
                longer.append(g)
                continue
            if nsingle == len(lengths):
                diagonal[g.indices[:g.nnz]] = True
                continue
            diagonal[g.indices[g.indptr[:-1][single]]] = True
            multi = np.flatnonzero(lengths > 1)
            if len(multi):
                longer.append(S.take_rows(g, multi))
        self._squares, self._squares_nnz = {}, 0
        if longer:
            G = S.vstack(longer)  # stacking reads CSR arrays (a CSC G would be read as CSR)
            # the diagonal entries a longer row squares to already (x[1:] - x[:-1] ** 2 covers
            # every x[:-1] ** 2): not added again
            diagonal[G.indices[:G.nnz]] = False
            self.add(gram(G, G))
        if diagonal.any():
            indptr = np.zeros(self.n + 1, dtype=S.INDEX)
            np.cumsum(diagonal, out=indptr[1:])
            self.add(S._csr(indptr, np.flatnonzero(diagonal), (self.n, self.n)))

    def _sum(self) -> sp.csr_matrix:
        return S.union(self._pieces, self.n, self.n)

    def pattern(self) -> sp.csr_matrix:
        """The accumulated symmetric pattern (bool CSR, sorted indices)."""
        self._flush_squares()
        return self._sum()
