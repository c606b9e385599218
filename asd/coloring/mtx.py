"""Tolerant Matrix Market reader for sparsity patterns (structure only).

Unlike ``scipy.io.mmread`` it accepts entry lines without values in a ``real`` file (as in
ColPack's ``bcsstk01_mod.mtx``), keeps explicitly stored zeros as structural entries and
expands ``symmetric``/``skew-symmetric``/``hermitian`` files to both triangles.
"""

from __future__ import annotations

import numpy as np

__all__ = ["read_pattern"]


def read_pattern(path):
    """``scipy.sparse.csr_array`` (bool) with the structure stored in a Matrix Market file."""
    import scipy.sparse as sp

    with open(path) as fh:
        header = fh.readline().lower().split()
        if not header or not header[0].startswith("%%matrixmarket"):
            raise ValueError(f"{path}: not a Matrix Market file")
        if header[2] != "coordinate":
            raise ValueError(f"{path}: only coordinate files hold sparsity patterns")
        symmetry = header[4] if len(header) > 4 else "general"
        line = fh.readline()
        while line.startswith("%") or not line.strip():
            line = fh.readline()
        m, n, nnz = (int(t) for t in line.split()[:3])
        rows = np.empty(nnz, dtype=np.int64)
        cols = np.empty(nnz, dtype=np.int64)
        k = 0
        for line in fh:
            t = line.split()
            if not t or t[0].startswith("%"):
                continue
            rows[k] = int(t[0]) - 1
            cols[k] = int(t[1]) - 1
            k += 1
    rows, cols = rows[:k], cols[:k]
    if symmetry != "general":
        off = rows != cols
        rows, cols = np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]])
    A = sp.coo_array((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(m, n)).tocsr()
    A.sum_duplicates()
    return A
