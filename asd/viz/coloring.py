"""Draw a small pattern's coloring graph (column-intersection, row-intersection, adjacency or
bipartite graph, following the coloring's problem) with igraph's layouts and matplotlib.

Nothing is saved: the caller owns the figure (``ax.figure.savefig(...)``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["plot_coloring_graph"]

from asd.viz.palette import color_of


def plot_coloring_graph(pattern, coloring, ax=None, *, layout: str = "auto", labels: bool = True,
                        node_size: float = 220.0):
    """Plot the graph that ``coloring`` colors, vertices filled by color (neutral: white).

    ``pattern`` is the sparsity pattern the coloring was computed for (used to check that the
    two match); ``layout``: an igraph layout name (``"kk"``, ``"fr"``, ``"circle"``, ...;
    ``"auto"`` picks ``"bipartite"`` for bidirectional colorings and ``"kk"`` otherwise).
    Returns the matplotlib ``Axes``.  Needs the optional extra: ``pip install asd[graph]``.
    """
    import matplotlib.pyplot as plt

    from asd.patterns import as_pattern

    shape = as_pattern(pattern).shape
    if tuple(shape) != tuple(coloring.shape):
        raise ValueError(f"pattern shape {shape} does not match the coloring's shape {coloring.shape}")
    g = coloring.graph()  # raises ImportError naming `pip install asd[graph]` without igraph
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5))
    if layout == "auto":
        layout = "bipartite" if coloring.problem == "bidirectional" else "kk"
    if layout == "bipartite":
        lay = g.layout_bipartite(types=g.vs["type"])
    else:
        lay = g.layout(layout)
    xy = np.asarray(lay.coords, dtype=float).reshape(-1, 2)
    for e in g.es:
        a, b = e.tuple
        ax.plot(xy[[a, b], 0], xy[[a, b], 1], color="0.6", lw=0.8, zorder=1)
    colors = np.asarray(g.vs["color"])
    face = [color_of(int(c)) for c in colors]
    marker = None
    if coloring.problem == "bidirectional":
        marker = np.where(np.asarray(g.vs["type"]), "s", "o")
        for mk in ("o", "s"):
            sel = marker == mk
            ax.scatter(xy[sel, 0], xy[sel, 1], s=node_size, c=[face[i] for i in np.nonzero(sel)[0]],
                       edgecolors="k", marker=mk, zorder=2)
    else:
        ax.scatter(xy[:, 0], xy[:, 1], s=node_size, c=face, edgecolors="k", zorder=2)
    if labels:
        n = coloring.shape[1]
        for v in range(len(colors)):
            if coloring.problem == "bidirectional":
                text = f"c{v}" if v < n else f"r{v - n}"
            else:
                text = str(v)
            ax.annotate(text, xy[v], ha="center", va="center", fontsize=7, zorder=3)
    ax.set_title(f"{coloring.problem} coloring ({coloring.order}): {coloring.ncolors} colors")
    ax.set_axis_off()
    ax.set_aspect("equal")
    return ax
