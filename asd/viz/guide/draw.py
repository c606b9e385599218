"""Drawing the guide's figures from the numbers of :mod:`asd.viz.guide.data` (matplotlib, Agg)."""

from __future__ import annotations

import numpy as np

from ..palette import PALETTE, color_of

ZERO = "#f4f4f4"
EDGE = "#888888"
NONZERO = PALETTE[0]
TEXT = "#222222"


def plt():
    """matplotlib.pyplot on the Agg backend (imported only when a figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def _fmt(v: float) -> str:
    if v == 0:
        return ""
    return f"{v:.2g}" if abs(v) < 10 else f"{v:.0f}"


def matrix(ax, M, *, colors=None, values: bool = True, title: str | None = None, fontsize: float = 8,
           mask=None, labels=None):
    """Draw ``M`` as a grid of cells: nonzeros (or ``mask``) colored, zeros light gray.

    ``colors``: per-cell face colors (an array of color strings) overriding the default;
    ``labels``: per-cell strings written instead of the values.
    """
    import matplotlib.patches as mp

    M = np.atleast_2d(np.asarray(M, dtype=float))
    m, n = M.shape
    mask = M != 0 if mask is None else np.atleast_2d(np.asarray(mask, dtype=bool))
    for i in range(m):
        for j in range(n):
            face = colors[i][j] if colors is not None else (NONZERO if mask[i, j] else ZERO)
            ax.add_patch(mp.Rectangle((j, i), 1, 1, facecolor=face, edgecolor=EDGE, linewidth=0.6))
            text = labels[i][j] if labels is not None else (_fmt(M[i, j]) if values and mask[i, j] else "")
            if text:
                ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=fontsize,
                        color="white" if face not in (ZERO, "white") else TEXT)
    ax.set_xlim(-0.05, n + 0.05)
    ax.set_ylim(m + 0.05, -0.05)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def column_colors(mask, colors) -> list[list[str]]:
    """Face colors: a nonzero in column j gets color ``colors[j]``'s palette entry."""
    mask = np.asarray(mask, dtype=bool)
    return [[color_of(int(colors[j])) if mask[i, j] else ZERO for j in range(mask.shape[1])]
            for i in range(mask.shape[0])]


def row_colors(mask, colors) -> list[list[str]]:
    """Face colors: a nonzero in row i gets color ``colors[i]``'s palette entry."""
    mask = np.asarray(mask, dtype=bool)
    return [[color_of(int(colors[i])) if mask[i, j] else ZERO for j in range(mask.shape[1])]
            for i in range(mask.shape[0])]


def symbol(ax, text: str, fontsize: float = 16):
    """A panel holding only an operator symbol (=, x, ->); a product dot is drawn larger to match."""
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=fontsize * (2.2 if text == "·" else 1),
            fontweight="bold" if text == "·" else "normal")
    ax.axis("off")


def row_of_panels(widths, height: float = 3.0, scale: float = 0.42):
    """A figure with panels side by side, panel k ``widths[k]`` cells wide."""
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(widths), figsize=(scale * sum(widths) + 0.3 * len(widths), height),
                                gridspec_kw=dict(width_ratios=widths))
    return fig, list(np.atleast_1d(axes))


def index_set_column(ax, sets, *, title: str | None = None, name: str = "", colors=None):
    """Index sets as a column of labeled boxes, one per entry: ``name_i: {j, ...}``."""
    import matplotlib.patches as mp

    for i, s in enumerate(sets):
        face = colors[i] if colors is not None else "white"
        ax.add_patch(mp.FancyBboxPatch((0.05, i + 0.1), 0.9, 0.8, boxstyle="round,pad=0.02", facecolor=face,
                                       edgecolor=EDGE, linewidth=0.8))
        body = "{" + ", ".join(str(j) for j in s) + "}"
        ax.text(0.5, i + 0.5, f"{name}{i}: {body}" if name else body, ha="center", va="center", fontsize=9)
    ax.set_xlim(0, 1)
    ax.set_ylim(len(sets), 0)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return ax
