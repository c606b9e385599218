"""Hessian sparsity detection against dense float64 Hessians (``torch.func.hessian``).

Soundness (every nonzero of the dense Hessian at random points is in the pattern) is checked on
every function; exactness (the pattern equals the union of those nonzeros) on the structures the
second-order tracer is built to get right: products of disjoint pairs, quadratic forms with sparse
constants, separable sums, functions of disjoint groups, products, divisions and powers.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asd.coloring import check, color
from asd.detection import hessian_sparsity
from asd.detection.rules.elementwise import broadcast_union
from asd.detection.table import RULES, SECOND_ORDER, lookup, register_rule
from asd.errors import InputError

aten = torch.ops.aten
SETTINGS = dict(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def dense_pattern(f, n: int, points: int = 2, seed: int = 0, signed: bool = False) -> np.ndarray:
    """Union of the nonzeros of the dense float64 Hessian of ``f`` at random points with entries
    of magnitude in [0.5, 1.5] (positive unless ``signed``: divisions, logs, powers stay defined)."""
    g = torch.Generator().manual_seed(seed)
    out = np.zeros((n, n), dtype=bool)
    for _ in range(points):
        x = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
        if signed:
            x = x * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
        H = torch.func.hessian(f)(x).reshape(n, n)
        out |= ((H != 0) & torch.isfinite(H)).numpy()  # NaN: not differentiable there
    return out


def detect(f, n: int, **kw) -> np.ndarray:
    P = hessian_sparsity(f, torch.zeros(n, dtype=torch.float64), **kw)
    assert isinstance(P, sp.csr_array) and P.dtype == np.bool_ and P.shape == (n, n)
    A = P.toarray()
    assert (A == A.T).all(), "pattern not symmetric"
    return A


def assert_sound(P: np.ndarray, D: np.ndarray) -> None:
    missed = np.argwhere(D & ~P)
    assert len(missed) == 0, f"missed Hessian nonzeros at {missed[:5].tolist()}"


def assert_exact(P: np.ndarray, D: np.ndarray) -> None:
    assert_sound(P, D)
    extra = np.argwhere(P & ~D)
    assert len(extra) == 0, f"spurious entries at {extra[:5].tolist()}"


def check_exact(f, n: int, oracle=None, **kw) -> np.ndarray:
    P = detect(f, n, **kw)
    assert_exact(P, dense_pattern(oracle or f, n))
    return P


# -- structures where the pattern is exact ---------------------------------------------------------

def rosenbrock(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


@pytest.mark.parametrize("n", [2, 3, 10, 31])
def test_chained_rosenbrock_tridiagonal(n):
    P = check_exact(rosenbrock, n)
    i, j = np.nonzero(P)
    assert np.all(np.abs(i - j) <= 1) and P.sum() == 3 * n - 2


@given(st.integers(1, 20), st.integers(0, 2**31 - 1))
@settings(**SETTINGS)
def test_products_of_disjoint_pairs(half, seed):
    n = 2 * half
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    a, b = perm[:half], perm[half:]
    P = check_exact(lambda x: (x[a] * x[b]).sum(), n)
    assert not P.diagonal().any()  # no squares: no diagonal
    assert P.sum() == n


@given(st.integers(1, 25), st.floats(0.0, 0.5), st.integers(0, 2**31 - 1), st.booleans())
@settings(**SETTINGS)
def test_quadratic_forms_with_sparse_constants(n, density, seed, elementwise):
    rng = np.random.default_rng(seed)
    A = sp.random(n, n, density=density, random_state=rng, format="csr",
                  data_rvs=lambda k: rng.uniform(0.5, 2.0, k))  # positive: A + A^T cannot cancel
    At = torch.sparse_csr_tensor(torch.from_numpy(A.indptr.astype(np.int64)),
                                 torch.from_numpy(A.indices.astype(np.int64)),
                                 torch.from_numpy(A.data), size=(n, n), dtype=torch.float64)
    Ad = torch.from_numpy(A.toarray())
    if elementwise:
        f, oracle = (lambda x: (x * (At @ x)).sum()), (lambda x: (x * (Ad @ x)).sum())
    else:
        f, oracle = (lambda x: x @ (At @ x)), (lambda x: x @ (Ad @ x))
    P = check_exact(f, n, oracle=oracle)
    assert (P == ((A + A.T).toarray() != 0)).all()


SMOOTH = [torch.sin, torch.exp, torch.tanh, lambda t: t ** 3, lambda t: torch.log1p(t * t),
          lambda t: 1 / (1 + t), torch.sigmoid]
LINEARISH = [lambda t: 3 * t - 1, torch.relu, torch.abs, lambda t: t.clamp(-1, 1)]


@given(st.lists(st.integers(0, len(SMOOTH) + len(LINEARISH) - 1), min_size=1, max_size=30))
@settings(**SETTINGS)
def test_separable_sums(kinds):
    fs = (SMOOTH + LINEARISH)
    n = len(kinds)

    def f(x):
        return sum(fs[k](x[i]) for i, k in enumerate(kinds))

    P = check_exact(f, n)
    assert not (P & ~np.eye(n, dtype=bool)).any()
    assert (P.diagonal() == np.array([k < len(SMOOTH) for k in kinds])).all()


@given(st.integers(2, 30), st.integers(1, 6), st.integers(0, 2**31 - 1))
@settings(**SETTINGS)
def test_functions_of_disjoint_groups(n, ngroups, seed):
    """sum_g h_g(x[S_g]) for disjoint S_g: the pattern is the union of the blocks S_g x S_g (prod:
    without the diagonal; a linear h: nothing)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, ngroups, n)
    kinds = rng.integers(0, 5, ngroups)
    groups = [torch.from_numpy(np.nonzero(labels == g)[0]) for g in range(ngroups)]

    def f(x):
        total = x.sum() * 0
        for g, idx in enumerate(groups):
            if len(idx) == 0:
                continue
            xs = x[idx]
            k = kinds[g]
            if k == 0:
                total = total + torch.sin(xs.sum())
            elif k == 1:
                total = total + xs.prod()
            elif k == 2 and len(idx) > 1:  # logsumexp of one element is the identity
                total = total + torch.logsumexp(xs, 0)
            elif k == 3 and len(idx) > 1:  # for one element, sqrt(x^2) = |x|: a cancellation
                total = total + (xs ** 2).sum().sqrt()
            elif k == 4:
                total = total + 2 * xs.sum()
            else:
                total = total + torch.exp(xs).sum()
        return total

    P = check_exact(f, n)
    for g, idx in enumerate(groups):
        block = P[np.ix_(idx.numpy(), idx.numpy())]
        if kinds[g] == 4:
            assert not block.any()
        elif kinds[g] == 1:
            assert (block == ~np.eye(len(idx), dtype=bool)).all()


def test_no_diagonal_and_zero_hessians():
    P = check_exact(lambda x: x[0] * x[1] + x[2] * x[3], 4)
    assert not P.diagonal().any()
    assert not check_exact(lambda x: (3 * x).sum() - x[1:].mean(), 5).any()
    assert not check_exact(lambda x: torch.relu(x).sum() + x.abs().max(), 5).any()
    assert not check_exact(lambda x: (x > 0.7).double().sum() + torch.floor(x).sum(), 4).any()
    assert not detect(lambda x: torch.tensor(1.0, dtype=torch.float64), 3).any()  # constant output


def test_division_is_linear_in_the_numerator():
    P = check_exact(lambda x: (x[:3] / x[3:]).sum(), 6)
    assert not P.diagonal()[:3].any() and P.diagonal()[3:].all()
    assert P[0, 3] and not P[0, 1]
    check_exact(lambda x: (x[0] / 2.0) + 1 / x[1], 2)
    check_exact(lambda x: torch.xlogy(x[:2], x[2:]).sum(), 4)
    assert not detect(lambda x: torch.div(x[:2], x[2:], rounding_mode="floor").sum(), 4).any()


def test_power_with_traced_and_constant_exponents():
    P = check_exact(lambda x: (x[:3] ** x[3:]).sum(), 6)
    assert P[0, 0] and P[3, 3] and P[0, 3] and not P[0, 1]
    P = check_exact(lambda x: (x ** 3).sum() + (2.0 ** x).sum(), 4)
    assert (P == np.eye(4, dtype=bool)).all()
    check_exact(lambda x: torch.pow(x[0], x[1]) * x[2], 3)


def test_products_and_contractions():
    check_exact(lambda x: x.prod(), 5)
    check_exact(lambda x: x.reshape(2, 3).prod(1).sum(), 6)
    check_exact(lambda x: (x.reshape(2, 3) @ x.reshape(3, 2)).sum(), 6)
    check_exact(lambda x: x[:3] @ x[3:], 6)
    check_exact(lambda x: (x.reshape(3, 3) @ x.reshape(3, 3)).sum(), 9)  # the same tensor twice
    check_exact(lambda x: torch.dot(x, x), 4)
    check_exact(lambda x: (x[:6].reshape(2, 3) @ x[6:]).sum(), 9)
    check_exact(lambda x: torch.bmm(x[:8].reshape(2, 2, 2), x[8:].reshape(2, 2, 2)).sum(), 16)
    check_exact(lambda x: torch.addcmul(x[:2], x[2:4], x[4:]).sum(), 6)
    check_exact(lambda x: torch.lerp(x[:2], x[2:4], x[4:]).sum(), 6)
    check_exact(lambda x: (x * x).sum() + x[0] * x[0] * x[1], 3)


def test_local_tracing_uses_values():
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0], dtype=torch.float64)
    f = lambda x: (torch.relu(x) ** 2).sum() + torch.relu(x[0] * x[1])  # noqa: E731
    P_global = hessian_sparsity(f, x).toarray()
    P_local = hessian_sparsity(f, x, local=True).toarray()
    D = (torch.func.hessian(f)(x) != 0).numpy()
    assert_sound(P_local, D)
    assert_sound(P_global, P_local)
    assert P_global[0, 0] and not P_local[0, 0] and not P_local[2, 2] and P_local[1, 1]


def test_dead_code_is_ignored():
    def f(x):
        unused = torch.sin(x[0] * x[1])  # noqa: F841
        return (x[2:] ** 2).sum()

    assert (detect(f, 4) == np.diag([False, False, True, True])).all()


def test_input_validation():
    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(InputError, match="scalar"):
        hessian_sparsity(lambda x: x ** 2, x)
    with pytest.raises(InputError, match="dtype"):
        hessian_sparsity(lambda x: (x > 0).sum(), x)
    with pytest.raises(InputError, match="returned"):
        hessian_sparsity(lambda x: (x.sum(), x.sum()), x)
    with pytest.raises(InputError):
        hessian_sparsity(lambda x: x.sum(), torch.zeros(3, dtype=torch.int64))
    P = hessian_sparsity(lambda x: (x ** 2).sum().reshape(1, 1), torch.zeros(2, 2))
    assert P.shape == (4, 4) and P.nnz == 4


# -- random compositions: soundness ------------------------------------------------------------------

UNARY = [torch.sin, torch.tanh, torch.exp, lambda t: t * t, lambda t: torch.sqrt(t * t + 1),
         lambda t: torch.log1p(t * t), torch.relu, torch.abs, lambda t: -2 * t, torch.sigmoid,
         lambda t: t.cumsum(-1), lambda t: t.flip(-1), lambda t: t.roll(1, -1),
         lambda t: torch.softmax(t, -1), lambda t: t - t.mean(-1, keepdim=True),
         lambda t: torch.cumprod(t, -1)]
BINARY = [torch.mul, torch.add, torch.sub, lambda a, b: a / (1 + b * b), torch.maximum,
          torch.atan2, lambda a, b: torch.where(a > b, a, b * 2), lambda a, b: (a * a + 1) ** b,
          lambda a, b: a @ b.transpose(-1, -2) @ a, torch.hypot]
REDUCE = [lambda t: t.sum(), lambda t: t.prod(), lambda t: torch.logsumexp(t.reshape(-1), 0),
          lambda t: t.norm(), lambda t: (t ** 2).sum(), lambda t: t.amax()]


@st.composite
def programs(draw):
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)),
                          min_size=1, max_size=6))
    red = draw(st.integers(0, len(REDUCE) - 1))
    return rows, cols, steps, red


def _program_function(program, extra: bool = False):
    rows, cols, steps, red = program

    def f(x):
        vals = [x[: rows * cols].reshape(rows, cols), x[rows * cols:].reshape(rows, cols)]
        for binary, k, i, j in steps:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if binary:
                op = BINARY[k % len(BINARY)]
                vals.append(torch.mul(a, b) if k % len(BINARY) == 8 and rows != cols else op(a, b))
            else:
                vals.append(UNARY[k % len(UNARY)](a))
        out = vals[-1] + 0.1 * vals[-2]
        return REDUCE[red](out + torch.sin(vals[0]).sum() if extra else out)

    return f, 2 * rows * cols


@given(programs(), st.integers(0, 1000))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_compositions_are_sound(program, seed):
    f, n = _program_function(program)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P = detect(f, n)
    assert_sound(P, dense_pattern(f, n, points=2, seed=seed, signed=True))


@given(programs())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_stacked_squares_give_the_per_op_pattern(program):
    """The squares G^T G are multiplied out once, on the stacked G (whenever their size passes
    MERGE_NNZ, and at the end): the pattern is the one of a product per op."""
    from asd.detection import second_order as SO

    f, n = _program_function(program, extra=True)
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    for local in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stacked = hessian_sparsity(f, x, local=local).toarray()
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(SO.SecondOrder, "MERGE_NNZ", 1)  # flushed at almost every square
                flushed = hessian_sparsity(f, x, local=local).toarray()
                mp.setattr(SO.SecondOrder, "add_square",
                           lambda self, G: self.add(SO.gram(G, G)) if G is not None and G.nnz else None)
                per_op = hessian_sparsity(f, x, local=local).toarray()
        np.testing.assert_array_equal(stacked, per_op)
        np.testing.assert_array_equal(flushed, per_op)


# -- colorings and the registry ------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 5, 100, 1000, 10_000])
def test_rosenbrock_star_coloring(n):
    P = hessian_sparsity(rosenbrock, torch.zeros(n, dtype=torch.float64))
    for problem in ("star", "acyclic"):
        c = color(P, problem)
        assert check(P, c)
    assert color(P, "star").ncolors == min(n, 3)


@given(st.integers(1, 25), st.floats(0.0, 0.4), st.integers(0, 2**31 - 1))
@settings(max_examples=10, deadline=None)
def test_colorings_of_detected_patterns_check(n, density, seed):
    A = sp.random(n, n, density=density, random_state=np.random.default_rng(seed), format="csr")
    At = torch.sparse_csr_tensor(torch.from_numpy(A.indptr.astype(np.int64)),
                                 torch.from_numpy(A.indices.astype(np.int64)),
                                 torch.from_numpy(A.data), size=(n, n), dtype=torch.float64)
    P = hessian_sparsity(lambda x: torch.sin(x @ (At @ x)) * 0 + (x * (At @ x)).sum() + (x ** 4).sum(),
                         torch.zeros(n, dtype=torch.float64))
    for problem in ("star", "acyclic"):
        assert check(P, color(P, problem))


def test_every_rule_has_a_second_order_class():
    for op, rule in RULES.items():
        assert rule.second_order in SECOND_ORDER, op
        assert rule.interaction in ("output", "contraction", "multilinear"), op
        if rule.interaction == "contraction":
            assert rule.pairs and len(rule.pairs) == 1, op
    assert lookup(aten.div.Tensor).pairs == (("self", "other"), ("other", "other"))
    assert lookup(aten.mul.Tensor).hessian_pairs(["self", "other"]) == (("self", "other"),)
    assert lookup(aten.add.Tensor).hessian_pairs(["self", "other"]) == ()
    assert lookup(aten.sin.default).hessian_pairs(["self"]) is None
    before = lookup(aten.mul.Tensor)
    with pytest.raises(ValueError, match="does not have"):
        register_rule(aten.mul.Tensor, broadcast_union, second_order="bilinear", pairs=(("self", "othr"),),
                      override=True)
    assert lookup(aten.mul.Tensor) is before


def test_a_user_rules_sets_through_one_argument_are_checked_too(monkeypatch):
    """The Hessian tracer runs a bilinear rule again with all but one argument masked: what a
    user's rule returns there is checked as its first return is (a wrong shape or a dense array
    raised scipy's or Python's error naming nothing; column indices past n crashed the process),
    and a valid matrix in another format gives the right pattern."""
    from asd.detection._core import Call

    original = lookup(aten.mul.Tensor)
    monkeypatch.setitem(RULES, aten.mul.Tensor, original)  # asd's own rule object is put back afterwards

    def install(masked_return):
        def rule(call):
            if type(call) is not Call:  # the masked call of the second-order pass
                return masked_return(call)
            return broadcast_union(call)
        register_rule(aten.mul.Tensor, rule, second_order=original.second_order, pairs=original.pairs,
                      interaction=original.interaction, override=True)

    f = lambda x: (x[:3] * x[1:]).sum()  # noqa: E731
    for masked in (lambda call: [sp.identity(call.n + 1, format="csr", dtype=bool)],
                   lambda call: [np.ones((call.outs[0].numel(), call.n), bool)],
                   lambda call: None):
        install(masked)
        with pytest.raises(InputError, match="sparsity rule 'test_a_user_rules"):
            detect(f, 4)
    install(lambda call: [m.tocsc() if m is not None else None for m in broadcast_union(call)])
    np.testing.assert_array_equal(detect(f, 4), dense_pattern(f, 4))


def test_ops_without_a_rule_are_general(monkeypatch):
    """The conservative fallback is treated as a general nonlinear op: sound, and strict raises."""
    from asd.errors import UnsupportedOpError, UnsupportedOpWarning

    monkeypatch.delitem(RULES, aten.atan2.default)
    f = lambda x: torch.atan2(x[0] * x[1], x[2]) + x[3] ** 2  # noqa: E731
    with pytest.warns(UnsupportedOpWarning):
        P = detect(f, 4)
    assert_sound(P, dense_pattern(f, 4))
    assert P[:3, :3].all() and not P[:3, 3].any()
    with pytest.raises(UnsupportedOpError):
        detect(f, 4, strict=True)


@pytest.mark.parametrize("sliced", [True, False])
def test_product_rule_leaves_the_shared_sets_of_its_operand_intact(sliced):
    """The prod rule's unique-in-group matrix was built on its operand's arrays and compacted in
    place: the operand's sets (shared with the stacked tensor, or a view of them) lost x[3]."""
    import asd

    def f(x):
        a = torch.stack([x[0] + x[1], x[1] + x[2], x[3]])
        return (a[0:2].prod() if sliced else a.prod()) + a[0] * x[3]

    x = torch.rand(4, dtype=torch.float64) + 0.5
    H = torch.func.hessian(f)(x)
    P = hessian_sparsity(f, x).toarray()
    assert P[H != 0].all()
    torch.testing.assert_close(asd.prepare_hessian(f, x)(x).to_dense(), H, rtol=1e-12, atol=1e-12)


def test_set_matrices_are_read_only():
    from asd.detection import sets as S

    M = S.identity(4)
    with pytest.raises(ValueError):
        M.indices[0] = 3
    with pytest.raises(ValueError):
        S.take_rows(M, np.arange(1, 3)).indices[0] = 0


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "unsorted"])
def test_second_order_squares_of_any_sparse_format(fmt):
    """A rule may hand the accumulator a square of any scipy format: the stacked product reads
    CSR arrays, so a CSC matrix read as CSR would drop pairs (unsound) without the conversion."""
    from asd.detection.second_order import SecondOrder

    D = np.zeros((4, 4), dtype=bool)
    D[0, [0, 1]] = True
    D[3, [1, 3]] = True
    G = sp.csr_matrix(D)
    if fmt == "unsorted":
        G.indices[:] = G.indices.reshape(-1, 2)[:, ::-1].ravel()
        G.has_sorted_indices = False
    elif fmt != "csr":
        G = G.asformat(fmt)
    B = sp.csr_matrix(np.eye(4, dtype=bool)[[2]])
    so = SecondOrder(4)
    so.add_square(G)
    so.add_square(B)
    want = (D.astype(int).T @ D.astype(int) + np.outer(np.eye(4)[2], np.eye(4)[2])) > 0
    np.testing.assert_array_equal(so.pattern().toarray(), want)
