"""The default coloring of a Jacobian or a Hessian, shared by the PyTorch and JAX operators."""

from __future__ import annotations

from asd.coloring.result import Coloring
from asd.patterns import SparsityPattern

__all__ = ["choose_jacobian", "choose_hessian", "has_path_of_four", "one_call_prefers_star"]

#: entries of a Hessian pattern from which a one-call operator may prefer star (see
#: :func:`one_call_prefers_star`)
ONE_CALL_STAR_NNZ = 2_000_000
#: most elements one evaluation of ``f`` computes per pattern entry for a one-call star
ONE_CALL_STAR_ELEMENTS = 5


def one_call_prefers_star(nnz: int, elements: int | None) -> bool:
    """Whether a Hessian evaluated once is faster with the star coloring than with an acyclic one
    that needs fewer colors: where the pattern has at least :data:`ONE_CALL_STAR_NNZ` entries and
    one evaluation of ``f`` computes at most :data:`ONE_CALL_STAR_ELEMENTS` elements per entry
    (``elements``: what the trace counted, :class:`asd.detection.torch_tracer.TraceInfo`).

    There the acyclic coloring's own work (its substitution plan, the first call's rounding bound
    and the substitution, whose arrays outgrow the caches) costs more than the Hessian-vector
    products its fewer colors save, and is never paid back. Measured on this project's CPU
    (one-off times, star over acyclic, n = 10^6): chained Rosenbrock 0.79, a pentadiagonal chain
    0.73, a 2-D total variation with 9 star colors against 4 acyclic ones 0.67 (0.57 at 3.4 10^6
    entries); a chain of 46 ops (15 elements per entry) 1.05, so acyclic stays. Near 10^6 entries
    the two are within 7% of each other, and below, acyclic is as fast or faster (up to 1.25)."""
    return elements is not None and nnz >= ONE_CALL_STAR_NNZ and elements <= ONE_CALL_STAR_ELEMENTS * nnz


def choose_jacobian(pattern: SparsityPattern, problem: str | None, order: str, *, prefer: str) -> Coloring:
    """The coloring of ``problem`` or, when it is ``None``, the cheaper of column and row colorings
    (``prefer`` wins ties: ``"row"`` eagerly, where one VJP batch shares one forward pass,
    ``"column"`` for compiled or jitted JVPs). When neither can compress (see
    :func:`asd.coloring.hopeless`) dense AD runs on the smaller side without coloring."""
    from asd.coloring import color, hopeless, lower_bound, recall_derived

    if problem is not None:
        return color(pattern, problem, order=order)
    m, n = pattern.shape
    recall_derived(pattern)  # an equal pattern colored recently knows its transpose and symmetry
    if hopeless(pattern, "column") and hopeless(pattern, "row"):
        return color(pattern, "column" if n <= m else "row", order=order)
    if pattern.input_shape == pattern.output_shape and pattern.is_symmetric:
        # the row problem of a symmetric pattern is its column problem: the same graph, the same
        # order, the same colors
        return color(pattern, prefer, order=order)
    # the side with the smaller lower bound (``prefer`` on a tie) first: where its colors do not
    # exceed the other side's lower bound, the other cannot win and is not colored (a convolution's
    # 27 column colors against at least 72 row colors); the choice is the one of both colorings
    bounds = {p: lower_bound(pattern, p) for p in ("column", "row")}
    other = {"column": "row", "row": "column"}
    first = min(("column", "row"), key=lambda p: (bounds[p], p != prefer))
    a = color(pattern, first, order=order)
    if a.ncolors < bounds[other[first]] or (a.ncolors == bounds[other[first]] and first == prefer):
        return a
    b = color(pattern, other[first], order=order)
    col, row = (a, b) if first == "column" else (b, a)
    if col.ncolors != row.ncolors:
        return col if col.ncolors < row.ncolors else row
    return col if prefer == "column" else row


def choose_hessian(pattern: SparsityPattern, problem: str | None, order: str, *, exact_arithmetic: bool,
                   max_levels: int | None, one_call_elements: int | None = None) -> Coloring:
    """The coloring of ``problem`` or, when it is ``None``, star unless acyclic needs fewer colors,
    the arithmetic is float64 (``exact_arithmetic``: substitution accumulates rounding errors on
    small entries in lower precision) and its substitution has at most ``max_levels`` sequential
    levels (``None``: any). An operator evaluated once passes the elements its trace counted
    (``one_call_elements``): star, without an acyclic coloring, where
    :func:`one_call_prefers_star`."""
    from asd.coloring import color

    if problem is not None:
        return color(pattern, problem, order=order)
    if not exact_arithmetic or one_call_prefers_star(pattern.nnz, one_call_elements):
        return color(pattern, "star", order=order)
    acyclic = color(pattern, "acyclic", order=order)
    shallow = max_levels is None or acyclic.plan.nlevels <= max_levels
    if shallow and acyclic.ncolors <= 2 and has_path_of_four(pattern):
        # two colors alternate along every path: a star coloring needs a third on a path of four
        # vertices, so acyclic wins without coloring a second time (chains, trees)
        return acyclic
    star = color(pattern, "star", order=order)
    return acyclic if acyclic.ncolors < star.ncolors and shallow else star


def has_path_of_four(pattern: SparsityPattern) -> bool:
    """Whether the adjacency graph of the symmetric ``pattern`` (the diagonal aside) has an edge
    both of whose ends have another neighbour: on a forest (the graph of every two-color acyclic
    coloring), exactly whether it has a path on four vertices (a triangle has such an edge, and
    no path on four vertices)."""
    from asd.coloring._graph_kernels import edge_between_branch_points

    return bool(edge_between_branch_points(pattern.indptr, pattern.indices))
