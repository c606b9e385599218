"""What every figure of the guide draws, computed by asd (and torch autograd) on real functions.

Each ``data_*`` function returns the numbers one figure shows; the figure functions in
:mod:`asd.viz.guide.draw` only draw them, and ``tests/test_guide.py`` checks them against asd.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ... import api
from ...coloring import color
from ...detection import jacobian_pattern
from ...problems import rosenbrock
from . import example as ex


def index_sets(pattern) -> list[list[int]]:
    """Row i's index set: the inputs output i depends on (from the pattern's CSR arrays)."""
    ip, ix = np.asarray(pattern.indptr), np.asarray(pattern.indices)
    return [sorted(int(j) for j in ix[ip[i]:ip[i + 1]]) for i in range(pattern.shape[0])]


def _dense_jacobian(fn, x: torch.Tensor) -> np.ndarray:
    return torch.func.jacrev(fn)(x).detach().numpy()


@dataclass(frozen=True)
class ChainRule:
    """Jacobians of g at x, of h at g(x) and of f = h o g at x."""

    Jg: np.ndarray
    Jh: np.ndarray
    Jf: np.ndarray


def data_chain_rule() -> ChainRule:
    """Figures 1 and 3a: the three Jacobians of the running example (Jf = Jh @ Jg)."""
    x = ex.point()
    return ChainRule(_dense_jacobian(ex.g, x), _dense_jacobian(ex.h, ex.g(x)), _dense_jacobian(ex.f, x))


@dataclass(frozen=True)
class ConvStructure:
    """The Jacobian of a tiny convolution and the shapes behind it."""

    J: np.ndarray
    pattern: np.ndarray
    image: int
    kernel: int


def data_conv_structure(image: int = 4, kernel: int = 2) -> ConvStructure:
    """Figure 2: a 1-channel ``kernel x kernel`` convolution of an ``image x image`` input."""
    w = torch.arange(1.0, kernel * kernel + 1, dtype=torch.float64).reshape(1, 1, kernel, kernel)

    def conv(x):
        return torch.nn.functional.conv2d(x.reshape(1, 1, image, image), w).reshape(-1)

    x = torch.linspace(-1, 1, image * image, dtype=torch.float64)
    P = jacobian_pattern(conv, x).toarray()
    return ConvStructure(_dense_jacobian(conv, x), P, image, kernel)


@dataclass(frozen=True)
class LinearMapChain:
    """A tangent v pushed through the chain of linear maps: v, Dg(x) v, Dh(g(x)) Dg(x) v."""

    v: np.ndarray
    Dg_v: np.ndarray
    Df_v: np.ndarray


def data_forward_eval() -> LinearMapChain:
    """Figures 3b and 4: evaluate the linear maps with JVPs, never forming a matrix."""
    x = ex.point()
    v = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.0, 1.0], dtype=torch.float64)
    y, dy = torch.func.jvp(ex.g, (x,), (v,))
    _, dz = torch.func.jvp(ex.h, (y,), (dy,))
    return LinearMapChain(v.numpy(), dy.numpy(), dz.numpy())


def data_forward_columns() -> list[tuple[np.ndarray, np.ndarray]]:
    """Figure 5: one JVP per basis vector e_j gives column j of the Jacobian."""
    x = ex.point()
    out = []
    for j in range(x.numel()):
        e = torch.zeros_like(x)
        e[j] = 1.0
        out.append((e.numpy(), torch.func.jvp(ex.f, (x,), (e,))[1].numpy()))
    return out


def data_reverse_rows() -> list[tuple[np.ndarray, np.ndarray]]:
    """Figure 6: one VJP per basis vector e_i gives row i of the Jacobian."""
    x = ex.point()
    y, vjp = torch.func.vjp(ex.f, x)
    out = []
    for i in range(y.numel()):
        e = torch.zeros_like(y)
        e[i] = 1.0
        out.append((e.numpy(), vjp(e)[0].numpy()))
    return out


@dataclass(frozen=True)
class SparseJacobian:
    """The Jacobian of f as asd returns it, with its detected pattern."""

    J: np.ndarray
    pattern: np.ndarray


def data_sparse_jacobian() -> SparseJacobian:
    """Figure 7: asd's sparse Jacobian of f and its pattern."""
    x = ex.point()
    J = api.sparse_jacobian(ex.f, x).to_dense().numpy()
    return SparseJacobian(J, jacobian_pattern(ex.f, x).toarray())


@dataclass(frozen=True)
class CompressedJacobian:
    """A Jacobian, its coloring and the compressed products asd evaluates."""

    J: np.ndarray
    pattern: np.ndarray
    colors: np.ndarray
    seeds: np.ndarray
    compressed: np.ndarray


def data_column_compression() -> CompressedJacobian:
    """Figures 8 and 9 and the coloring section: forward mode, one JVP per column color.

    ``compressed[:, c]`` is J @ seeds[c]: the sum of the columns of color c.
    """
    x = ex.point()
    op = api.prepare_jacobian(ex.f, x, mode="forward")
    m = op.pattern.shape[0]
    B = op.compressed(x).reshape(op.ncolors, m).T.numpy()
    return CompressedJacobian(op(x).to_dense().numpy(), op.pattern.toarray(), np.asarray(op.coloring.colors),
                              np.asarray(op.coloring.seeds()), B)


def data_row_compression() -> CompressedJacobian:
    """The row-coloring figure: reverse mode, one VJP per row color.

    ``compressed[c, :]`` is seeds[c] @ J: the sum of the rows of color c.
    """
    x = ex.point()
    op = api.prepare_jacobian(ex.f, x, mode="reverse")
    n = op.pattern.shape[1]
    B = op.compressed(x).reshape(op.ncolors, n).numpy()
    return CompressedJacobian(op(x).to_dense().numpy(), op.pattern.toarray(), np.asarray(op.coloring.colors),
                              np.asarray(op.coloring.seeds()), B)


@dataclass(frozen=True)
class PatternForms:
    """One sparsity pattern three ways."""

    J: np.ndarray
    pattern: np.ndarray
    index_sets: list[list[int]]


def data_pattern_forms() -> PatternForms:
    """Figure 10: the matrix, its binary pattern and its index sets (the pattern's rows)."""
    x = ex.point()
    P = jacobian_pattern(ex.f, x)
    return PatternForms(_dense_jacobian(ex.f, x), P.toarray(), index_sets(P))


def data_naive_chain() -> list[np.ndarray]:
    """Figure 11: forward mode carrying full Jacobians through the chain: I, Jg, Jh Jg."""
    x = ex.point()
    Jx = torch.eye(x.numel(), dtype=torch.float64)
    y, Jy = torch.func.vmap(lambda v: torch.func.jvp(ex.g, (x,), (v,)), out_dims=(None, 1))(Jx)
    _, Jz = torch.func.vmap(lambda v: torch.func.jvp(ex.h, (y,), (v,)), in_dims=1, out_dims=(None, 1))(Jy)
    return [Jx.numpy(), Jy.numpy(), Jz.numpy()]


def data_index_chain() -> list[list[list[int]]]:
    """Figure 12: the index sets of x, of g(x) and of f(x) as asd's detection finds them."""
    x = ex.point()
    sets_x = [[j] for j in range(x.numel())]
    sets_y = index_sets(jacobian_pattern(ex.g, x))
    sets_z = index_sets(jacobian_pattern(ex.f, x))
    return [sets_x, sets_y, sets_z]


def graph_example(x: torch.Tensor) -> torch.Tensor:
    """The pattern-detection example: f(x) = x0 + x1 x2 + sign(x3), a scalar of R^4."""
    return x[0] + x[1] * x[2] + torch.sign(x[3])


GRAPH_NODES: tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor], tuple[str, ...]], ...] = (
    ("x0", lambda x: x[0], ()),
    ("x1", lambda x: x[1], ()),
    ("x2", lambda x: x[2], ()),
    ("x3", lambda x: x[3], ()),
    ("x1 x2", lambda x: x[1] * x[2], ("x1", "x2")),
    ("sign(x3)", lambda x: torch.sign(x[3]), ("x3",)),
    ("x0 + x1 x2", lambda x: x[0] + x[1] * x[2], ("x0", "x1 x2")),
    ("f(x)", graph_example, ("x0 + x1 x2", "sign(x3)")),
)


@dataclass(frozen=True)
class GraphNode:
    """One node of a computational graph with the index set asd detects for it."""

    name: str
    parents: tuple[str, ...]
    index_set: list[int]


def data_computational_graph() -> list[GraphNode]:
    """The pattern-detection section: the index set of every node of :func:`graph_example`'s graph.

    Each node's index set is the (single) row of the pattern asd detects for the function that
    computes that node from x; sign has a zero derivative, so its set is empty.
    """
    x = torch.tensor([1.0, 2.0, 3.0, -4.0], dtype=torch.float64)
    return [GraphNode(name, parents, index_sets(jacobian_pattern(lambda x, fn=fn: fn(x).reshape(1), x))[0])
            for name, fn, parents in GRAPH_NODES]


def data_two_steps():
    """Figure 9: (a) the detected pattern, (b) asd's column coloring of it."""
    P = jacobian_pattern(ex.f, ex.point())
    return P.toarray(), color(P, "column")


@dataclass(frozen=True)
class CompressedHessian:
    """A Hessian, its symmetric coloring, the compressed HVPs and the recovered matrix."""

    H: np.ndarray
    pattern: np.ndarray
    colors: np.ndarray
    seeds: np.ndarray
    compressed: np.ndarray
    problem: str


def hessian_point(n: int = 8) -> torch.Tensor:
    """The point at which the second-order figures take the Rosenbrock Hessian."""
    return torch.linspace(-1.0, 1.5, n, dtype=torch.float64)


def data_hessian(coloring: str = "star", n: int = 8) -> CompressedHessian:
    """The second-order figures: the chained Rosenbrock Hessian (:func:`asd.problems.rosenbrock`).

    Parameters
    ----------
    coloring : str
        ``"star"`` (symmetric, read off directly) or ``"acyclic"`` (fewer colors, substitution).
    n : int
        Number of unknowns.

    Returns
    -------
    CompressedHessian
        ``compressed[:, c]`` is the HVP H @ seeds[c], as ``op.compressed(x)`` returns it.
    """
    x = hessian_point(n)
    op = api.prepare_hessian(rosenbrock, x, coloring=coloring)
    B = op.compressed(x).reshape(op.ncolors, n).T.numpy()
    return CompressedHessian(op(x).to_dense().numpy(), op.pattern.toarray(), np.asarray(op.coloring.colors),
                             np.asarray(op.coloring.seeds()), B, coloring)


def data_hessian_star() -> CompressedHessian:
    """Star coloring: every Hessian entry is read directly from one compressed HVP."""
    return data_hessian("star")


def data_hessian_acyclic() -> CompressedHessian:
    """Acyclic coloring: fewer HVPs, entries recovered by substitution."""
    return data_hessian("acyclic")
