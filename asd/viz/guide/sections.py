"""The guide's figures, in order: each draws what one ``data_*`` function of :mod:`.data` returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..palette import color_of
from . import data as d
from . import draw


def fig_chain_rule(c: d.ChainRule):
    """1. The chain rule with numbers: J_f = J_h J_g."""
    fig, ax = draw.row_of_panels([6, 1, 5, 1, 6], height=3.0, scale=0.55)
    draw.matrix(ax[0], c.Jf, title="J_f(x)")
    draw.symbol(ax[1], "=")
    draw.matrix(ax[2], c.Jh, title="J_h(g(x))")
    draw.symbol(ax[3], "·")
    draw.matrix(ax[4], c.Jg, title="J_g(x)")
    return fig


def fig_conv_structure(c: d.ConvStructure):
    """2. The Jacobian of a tiny convolution: each output touches a kernel-sized window."""
    pyplot = draw.plt()
    fig, ax = pyplot.subplots(figsize=(7.5, 4.2))
    draw.matrix(ax, c.J, values=False, title=f"Jacobian of a {c.kernel}x{c.kernel} convolution on a "
                                             f"{c.image}x{c.image} image ({c.J.shape[0]} x {c.J.shape[1]}, "
                                             f"{int(c.pattern.sum())} nonzeros)")
    return fig


def fig_chain_maps(c: d.ChainRule):
    """3. (a) the chain rule with materialized Jacobians; (b) with matrix-free linear maps."""
    pyplot = draw.plt()
    fig = pyplot.figure(figsize=(9, 4.6))
    top = fig.add_gridspec(2, 3, height_ratios=[3, 1.2], width_ratios=[5, 1, 6])
    draw.matrix(fig.add_subplot(top[0, 0]), c.Jh, title="(a)  J_h(g(x))")
    draw.symbol(fig.add_subplot(top[0, 1]), "·")
    draw.matrix(fig.add_subplot(top[0, 2]), c.Jg, title="J_g(x)")
    ax = fig.add_subplot(top[1, :])
    _map_boxes(ax, ["v", "Dg(x)", "Dh(g(x))", "Df(x)[v]"], title="(b)  Df(x) = Dh(g(x)) ∘ Dg(x): two JVPs, no matrix")
    return fig


def _map_boxes(ax, names, *, title=None, values=None):
    """A left-to-right chain of boxes joined by arrows (the linear maps of a chain)."""
    k = len(names)
    for i, name in enumerate(names):
        is_map = name.startswith("D") and "[" not in name
        ax.text(i * 2 + 0.5, 0.5, name, ha="center", va="center", fontsize=10,
                bbox=dict(boxstyle="round,pad=0.35", facecolor=color_of(1) if is_map else "white",
                          edgecolor=draw.EDGE))
        if values is not None and values[i] is not None:
            ax.text(i * 2 + 0.5, -0.15, values[i], ha="center", va="top", fontsize=8, family="monospace")
        if i < k - 1:
            ax.annotate("", xy=(i * 2 + 1.65, 0.5), xytext=(i * 2 + 1.25, 0.5),
                        arrowprops=dict(arrowstyle="->", color=draw.TEXT))
    ax.set_xlim(-0.6, 2 * k - 0.4)
    ax.set_ylim(-0.8 if values is not None else 0, 1)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)


def _vec(v) -> str:
    return "[" + ", ".join(f"{x:.3g}" for x in v) + "]"


def fig_forward_eval(c: d.LinearMapChain):
    """4. Forward mode evaluates the linear maps one after another on a tangent v."""
    pyplot = draw.plt()
    fig, ax = pyplot.subplots(figsize=(10, 1.9))
    _map_boxes(ax, ["v", "Dg(x)", "Dg(x)[v]", "Dh(g(x))", "Df(x)[v]"],
               values=["\n".join(f"{x:.3g}" for x in c.v), None, "\n".join(f"{x:.3g}" for x in c.Dg_v), None,
                       "\n".join(f"{x:.3g}" for x in c.Df_v)])
    ax.set_ylim(-2.4, 1)
    ax.set_title("forward mode: push the tangent v through the chain (torch.func.jvp)", fontsize=10)
    return fig


def fig_forward_columns(pairs):
    """5. Forward mode materializes the Jacobian one column per JVP with a basis vector."""
    k = len(pairs)
    fig, axes = draw.plt().subplots(1, 2 * k, figsize=(1.25 * k, 2.9), gridspec_kw=dict(wspace=0.15))
    for j, (e, col) in enumerate(pairs):
        tint = color_of(j)
        draw.matrix(axes[2 * j], e[:, None], fontsize=7, colors=[[tint if v else draw.ZERO] for v in e],
                    title=f"e{j}")
        draw.matrix(axes[2 * j + 1], col[:, None], fontsize=7, colors=[[tint if v else draw.ZERO] for v in col],
                    title=f"J e{j}")
    fig.suptitle("one JVP per basis vector e_j gives column j of J_f (torch.func.jvp)", fontsize=10, y=1.04)
    return fig


def fig_reverse_rows(pairs):
    """6. Reverse mode materializes it one row per VJP."""
    pyplot = draw.plt()
    k = len(pairs)
    fig, axes = pyplot.subplots(k, 1, figsize=(4.2, 1.0 * k))
    for a, (e, row) in enumerate(pairs):
        draw.matrix(axes[a], row[None, :], colors=[[color_of(a) if v else draw.ZERO for v in row]])
        axes[a].set_title(f"e{a}ᵀ J_f  =  row {a}", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def fig_sparse_jacobian(c: d.SparseJacobian):
    """7. A sparse Jacobian (asd.sparse_jacobian) and the sparse linear map it stands for."""
    fig, ax = draw.row_of_panels([6, 6], height=3.2, scale=0.6)
    draw.matrix(ax[0], c.J, title="sparse Jacobian J_f(x)")
    draw.matrix(ax[1], c.pattern, values=False, title="its linear map: output i reads only\nthe shaded inputs")
    return fig


def fig_orthogonal_columns(c: d.CompressedJacobian):
    """8. Structurally orthogonal columns share one JVP: J (e0 + e3) holds columns 0 and 3 whole."""
    fig, ax = draw.row_of_panels([6, 1, 1, 1, 1], height=3.2, scale=0.6)
    draw.matrix(ax[0], c.J, colors=draw.column_colors(c.pattern, c.colors), title="J_f, columns by color")
    draw.symbol(ax[1], "·")
    s = c.seeds[0]
    draw.matrix(ax[2], s[:, None], colors=[[color_of(0) if v else draw.ZERO] for v in s], title="seed 0")
    draw.symbol(ax[3], "=")
    col = c.compressed[:, 0]
    draw.matrix(ax[4], col[:, None], colors=[[color_of(0) if v else draw.ZERO] for v in col], title="one JVP")
    return fig


def fig_two_steps(pc):
    """9. The two elementary steps: (a) pattern detection, (b) coloring of the pattern."""
    P, coloring = pc
    fig, ax = draw.row_of_panels([6, 6], height=3.0, scale=0.6)
    draw.matrix(ax[0], P, values=False, colors=[[draw.TEXT if v else draw.ZERO for v in r] for r in P],
                title="(a) detected pattern")
    draw.matrix(ax[1], P, values=False, colors=draw.column_colors(P, coloring.colors),
                title=f"(b) column coloring: {coloring.ncolors} colors")
    return fig


def fig_pattern_forms(c: d.PatternForms):
    """10. One pattern three ways: the matrix, its binary pattern, its index sets."""
    fig, ax = draw.row_of_panels([6, 6, 5], height=3.0, scale=0.6)
    draw.matrix(ax[0], c.J, title="matrix")
    draw.matrix(ax[1], c.pattern.astype(float), labels=[["1" if v else "0" for v in r] for r in c.pattern],
                mask=c.pattern, title="binary pattern")
    draw.index_set_column(ax[2], c.index_sets, name="f", title="index sets")
    return fig


def fig_naive_chain(mats):
    """11. Carrying full Jacobians through the chain: every intermediate holds an m x n matrix."""
    fig, ax = draw.row_of_panels([6, 1.5, 6, 1.5, 6], height=3.4, scale=0.55)
    names = ["x: I (6 x 6)", "g(x): J_g (5 x 6)", "f(x): J_f (5 x 6)"]
    for k, M in enumerate(mats):
        draw.matrix(ax[2 * k], M, title=names[k], fontsize=7)
        if k < 2:
            draw.symbol(ax[2 * k + 1], "→ g" if k == 0 else "→ h", fontsize=12)
    return fig


def fig_index_chain(sets):
    """12. Index sets through the chain: each output carries only the inputs it depends on."""
    fig, ax = draw.row_of_panels([4, 1.5, 4, 1.5, 4], height=3.4, scale=0.6)
    names = [("x", "x"), ("g(x)", "y"), ("f(x)", "f")]
    for k, s in enumerate(sets):
        draw.index_set_column(ax[2 * k], s, name=names[k][1], title=names[k][0])
        if k < 2:
            draw.symbol(ax[2 * k + 1], "→ g" if k == 0 else "→ h", fontsize=12)
    return fig


def fig_column_coloring(c: d.CompressedJacobian):
    """Coloring section: the column intersection graph, its coloring, the compressed matrix
    and the Jacobian decompressed from it."""
    from ..coloring import plot_coloring_graph
    from ...coloring import color

    fig, ax = draw.row_of_panels([6, 6, 3, 6], height=3.4, scale=0.62)
    coloring = color(c.pattern, "column")
    plot_coloring_graph(c.pattern, coloring, ax=ax[0], node_size=320)
    ax[0].set_title("column intersection graph", fontsize=10)
    ax[0].margins(0.15)
    draw.matrix(ax[1], c.pattern, values=False, colors=draw.column_colors(c.pattern, c.colors),
                title="colored pattern")
    draw.matrix(ax[2], c.compressed, colors=[[color_of(k) if v else draw.ZERO for k, v in enumerate(r)]
                                             for r in c.compressed], title="compressed\nJ S")
    draw.matrix(ax[3], c.J, colors=draw.column_colors(c.pattern, c.colors), title="decompressed J")
    return fig


def fig_row_coloring(c: d.CompressedJacobian):
    """Coloring section: row coloring for reverse mode, one VJP per row color."""
    fig, ax = draw.row_of_panels([6, 6], height=3.6, scale=0.62)
    draw.matrix(ax[0], c.J, colors=draw.row_colors(c.pattern, c.colors),
                title=f"rows by color ({len(set(c.colors.tolist()))} VJPs)")
    draw.matrix(ax[1], c.compressed, colors=[[color_of(k) if v else draw.ZERO for v in r]
                                             for k, r in enumerate(c.compressed)], title="compressed Sᵀ J")
    return fig


def _fig_hessian(c: d.CompressedHessian, how: str):
    fig, ax = draw.row_of_panels([8, c.compressed.shape[1] + 1, 8], height=3.8, scale=0.5)
    draw.matrix(ax[0], c.pattern, values=False, colors=draw.column_colors(c.pattern, c.colors),
                title=f"{c.problem} coloring: {c.compressed.shape[1]} colors")
    draw.matrix(ax[1], c.compressed, fontsize=6, colors=[[color_of(k) if v else draw.ZERO
                                                          for k, v in enumerate(r)] for r in c.compressed],
                title="H S")
    draw.matrix(ax[2], c.H, fontsize=6, title=how)
    return fig


def fig_hessian_star(c: d.CompressedHessian):
    """Second order: a Hessian, its star coloring, symmetric direct decompression."""
    return _fig_hessian(c, "H, read off directly")


def fig_hessian_acyclic(c: d.CompressedHessian):
    """Second order: acyclic coloring, fewer colors, decompression by substitution."""
    return _fig_hessian(c, "H, by substitution")


def fig_computational_graph(nodes: list[d.GraphNode]):
    """Pattern detection: index sets flow through the computational graph of f(x) = x0 + x1 x2 + sign(x3)."""
    pos = _graph_layout(nodes)
    fig, ax = draw.plt().subplots(figsize=(7.0, 4.6))
    for node in nodes:
        for parent in node.parents:
            (x0, y0), (x1, y1) = pos[parent], pos[node.name]
            ax.annotate("", xy=(x1, y1 - 0.28), xytext=(x0, y0 + 0.28),
                        arrowprops=dict(arrowstyle="->", color=draw.EDGE, lw=1.0))
    for node in nodes:
        x, y = pos[node.name]
        body = "{" + ", ".join(str(j) for j in node.index_set) + "}" if node.index_set else "∅"
        face = color_of(1) if node.parents else "white"
        ax.text(x, y, f"{node.name}\n{body}", ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.4", facecolor=face, edgecolor=draw.EDGE))
    ax.set_xlim(-0.7, max(p[0] for p in pos.values()) + 0.7)
    ax.set_ylim(-0.6, max(p[1] for p in pos.values()) + 0.6)
    ax.axis("off")
    ax.set_title("index sets through the graph of f(x) = x0 + x1 x2 + sign(x3)", fontsize=10)
    return fig


def _graph_layout(nodes: list[d.GraphNode]) -> dict[str, tuple[float, float]]:
    """Inputs on the bottom row; every other node one level above its highest parent, centred over them."""
    pos: dict[str, tuple[float, float]] = {}
    inputs = [n for n in nodes if not n.parents]
    for k, n in enumerate(inputs):
        pos[n.name] = (1.3 * k, 0.0)
    for n in nodes:
        if n.parents:
            xs, ys = zip(*(pos[p] for p in n.parents))
            pos[n.name] = (sum(xs) / len(xs), max(ys) + 1.0)
    return pos


@dataclass(frozen=True)
class Figure:
    """One figure of the guide: its file stem, caption, the data it draws and how it draws it.

    ``code`` lists further functions whose source the guide prints beside ``data``'s.
    """

    name: str
    caption: str
    data: Callable[[], object]
    draw: Callable[[object], object]
    section: str
    code: tuple[Callable, ...] = ()


FIGURES: tuple[Figure, ...] = (
    Figure("01_chain_rule", "The multivariate chain rule with numbers: J_f = J_h · J_g at the same x.",
           d.data_chain_rule, fig_chain_rule, "Automatic differentiation"),
    Figure("02_conv_structure", "The Jacobian of a tiny convolutional layer is sparse and structured.",
           d.data_conv_structure, fig_conv_structure, "Automatic differentiation"),
    Figure("03_chain_maps", "The chain rule with materialized Jacobians (a) and with matrix-free linear maps (b).",
           d.data_chain_rule, fig_chain_maps, "Automatic differentiation"),
    Figure("04_forward_eval", "Evaluating the linear maps in forward mode.", d.data_forward_eval, fig_forward_eval,
           "Automatic differentiation"),
    Figure("05_forward_columns", "Forward mode materializes a Jacobian column by column.", d.data_forward_columns,
           fig_forward_columns, "Automatic differentiation"),
    Figure("06_reverse_rows", "Reverse mode materializes it row by row.", d.data_reverse_rows, fig_reverse_rows,
           "Automatic differentiation"),
    Figure("07_sparse_jacobian", "A sparse Jacobian and its sparse linear map.", d.data_sparse_jacobian,
           fig_sparse_jacobian, "Sparse automatic differentiation"),
    Figure("08_orthogonal_columns", "Structurally orthogonal columns materialized by one forward product.",
           d.data_column_compression, fig_orthogonal_columns, "Sparse automatic differentiation"),
    Figure("09_two_steps", "The two elementary steps: (a) sparsity pattern detection, (b) coloring.",
           d.data_two_steps, fig_two_steps, "Sparse automatic differentiation"),
    Figure("10_pattern_forms", "Equivalent pattern representations: matrix, binary pattern, index sets.",
           d.data_pattern_forms, fig_pattern_forms, "Pattern detection", (d.index_sets,)),
    Figure("11_naive_chain", "Materializing Jacobians forward through the chain (the memory-hungry way).",
           d.data_naive_chain, fig_naive_chain, "Pattern detection"),
    Figure("12_index_chain", "Index-set propagation through the chain (the sparse way): what asd's detection does.",
           d.data_index_chain, fig_index_chain, "Pattern detection"),
    Figure("13_computational_graph", "Index sets through a computational graph: sums take unions, sign "
           "(zero derivative) contributes nothing.", d.data_computational_graph, fig_computational_graph,
           "Pattern detection", (d.graph_example,)),
    Figure("14_column_coloring", "Column intersection graph, its coloring, the compressed matrix and the "
           "decompressed Jacobian.", d.data_column_compression, fig_column_coloring, "Coloring"),
    Figure("15_row_coloring", "Row coloring for reverse mode: one VJP per row color.", d.data_row_compression,
           fig_row_coloring, "Coloring"),
    Figure("16_hessian_star", "A Hessian, its star coloring and symmetric (direct) decompression.",
           d.data_hessian_star, fig_hessian_star, "Second order", (d.data_hessian,)),
    Figure("17_hessian_acyclic", "Acyclic coloring: fewer colors, decompression by substitution.",
           d.data_hessian_acyclic, fig_hessian_acyclic, "Second order", (d.data_hessian,)),
)
