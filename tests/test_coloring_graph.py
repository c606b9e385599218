"""igraph cross-checks (distance-1 properties on the explicit graphs) and the viz helper."""

import numpy as np
import pytest
import scipy.sparse as sp

import asd.coloring as C

igraph = pytest.importorskip("igraph")


def _proper(g, colors):
    colors = np.asarray(colors)
    for a, b in g.get_edgelist():
        if colors[a] >= 0 and colors[a] == colors[b]:
            return False
    return True


@pytest.mark.parametrize("problem", ["column", "row", "star", "acyclic"])
def test_distance1_on_igraph_graph(problem):
    A = sp.random(40, 40, density=0.08, random_state=2, format="csr")
    for order in C.ORDERS:
        res = C.color(A, problem, order)
        g = res.graph()
        assert isinstance(g, igraph.Graph)
        nv = A.shape[1] if problem != "row" else A.shape[0]
        assert g.vcount() == nv
        assert _proper(g, res.colors)
        # greedy never needs more than max degree + 1 colors on the graph it colors (d1 / d2)
        if problem in ("column", "row"):
            assert res.ncolors <= max(g.degree()) + 1


def test_star_is_distance1_and_bidirectional_graph():
    A = sp.random(12, 15, density=0.2, random_state=0, format="csr")
    res = C.color(A, "bidirectional", postprocess=True)
    g = res.graph()
    assert g.vcount() == 27 and g.ecount() == A.nnz
    assert g.is_bipartite()


def test_igraph_missing_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake(name, *a, **k):
        if name == "igraph":
            raise ImportError("no igraph")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    res = C.color(np.eye(3), "column")
    with pytest.raises(ImportError, match=r"pip install asd\[graph\]"):
        res.graph()


def test_plot_coloring_graph():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from asd.viz.coloring import plot_coloring_graph

    A = sp.random(10, 10, density=0.25, random_state=1, format="csr")
    for problem in ("column", "star", "bidirectional"):
        res = C.color(A, problem, postprocess=True)
        ax = plot_coloring_graph(A, res)
        assert ax.get_title().startswith(problem)
        plt.close(ax.figure)
    fig, ax = plt.subplots()
    assert plot_coloring_graph(A, C.color(A, "acyclic"), ax=ax, layout="circle") is ax
    plt.close(fig)
