"""Spy plots of sparsity patterns, each nonzero colored by the color that recovers it."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..patterns import as_pattern
from .palette import color_of


def entry_colors(coloring) -> np.ndarray:
    """For every stored entry (CSR order of ``coloring``), the color of the product it comes from.

    Column, star and acyclic colorings: the column's color; row colorings: the row's color;
    bidirectional: the column's color if the column is colored, else (offset) the row's.
    """
    indptr, indices = np.asarray(coloring.indptr), np.asarray(coloring.indices)
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    if coloring.problem == "row":
        return np.asarray(coloring.colors)[rows]
    if coloring.problem == "bidirectional":
        rc, cc = (np.asarray(c) for c in coloring.colors)
        col = cc[indices]
        return np.where(col >= 0, col, cc.max(initial=-1) + 1 + rc[rows])
    return np.asarray(coloring.colors)[indices]


def spy_coloring(pattern, coloring=None, ax=None, *, markersize: float | None = None, title: str | None = None):
    """Draw ``pattern``; with a ``coloring``, each nonzero in the color of its compressed product.

    Parameters
    ----------
    pattern
        A scipy sparse matrix or array (its structure is drawn).
    coloring
        An :class:`asd.Coloring` of that pattern, or ``None`` for a plain spy plot.
    ax
        A matplotlib axis (a new figure is made when ``None``).

    Returns
    -------
    matplotlib.axes.Axes
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 6))
    P = as_pattern(pattern).to_scipy()
    m, n = P.shape
    if coloring is not None:
        indptr, indices = np.asarray(coloring.indptr), np.asarray(coloring.indices)
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        colors = [color_of(int(c)) for c in entry_colors(coloring)]
    else:
        rows, indices = P.nonzero()
        colors = "k"
    ms = markersize if markersize is not None else max(0.5, 300.0 / max(m, n))
    ax.scatter(indices, rows, s=ms ** 2, c=colors, marker="s", linewidths=0)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(m - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xlabel("input index")
    ax.set_ylabel("output index")
    if title is None and coloring is not None:
        title = f"{P.nnz} nonzeros, {coloring.ncolors} {coloring.problem} colors"
    if title:
        ax.set_title(title)
    return ax
