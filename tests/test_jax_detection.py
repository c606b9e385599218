"""Sparsity detection on jaxprs (asd.jax) against dense float64 jax.jacfwd / jax.hessian."""

import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="asd.jax needs jax (pip install asd[jax])")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

import asd  # noqa: E402
import asd.jax as aj  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402


def _nonzeros(transforms, x, size, points, seed):
    """Where the first of ``transforms`` that applies (each a jitted dense derivative: one
    compilation for every point, instead of one per primitive and point eagerly) is nonzero at
    ``x`` or at any of ``points - 1`` random points near it."""
    for k, transform in enumerate(transforms):
        d = jax.jit(transform)
        try:
            first = d(x)
            break
        except (TypeError, ValueError):  # custom_vjp: no forward mode; while loops: no reverse mode
            if k == len(transforms) - 1:
                raise
    rng = np.random.default_rng(seed)
    out = np.asarray(first).reshape(size, x.size) != 0
    for _ in range(points - 1):
        out |= np.asarray(d(x + jnp.asarray(rng.standard_normal(x.shape)))).reshape(size, x.size) != 0
    return out


def dense_jac(f, x, points=2, seed=0):
    flat = lambda z: jnp.ravel(f(z))  # noqa: E731
    return _nonzeros([jax.jacfwd(flat), jax.jacrev(flat)], x, int(np.size(jax.eval_shape(flat, x))), points, seed)


def dense_hess(f, x, points=2, seed=0):
    return _nonzeros([jax.hessian(f), jax.jacrev(jax.jacrev(f)), jax.jacfwd(jax.jacfwd(f))], x, x.size, points, seed)


def check(f, x, exact=True, local=False):
    P = aj.jacobian_sparsity(f, x, local=local).toarray()
    D = dense_jac(f, x, points=1 if local else 2)
    assert P.shape == D.shape
    assert not (D & ~P).any(), "pattern misses a nonzero"
    if exact:
        np.testing.assert_array_equal(P, D)
    return P


@jax.custom_vjp
def _cube(x):
    return x ** 3


_cube.defvjp(lambda x: (x ** 3, x), lambda x, g: (3 * x ** 2 * g,))

X = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, (4, 6)))
A = jnp.asarray(np.random.default_rng(2).standard_normal((6, 5)) * (np.random.default_rng(3).random((6, 5)) < 0.4))

CASES = {
    "elementwise": (lambda x: jnp.sin(x) * jnp.exp(x) + x ** 2 / (1 + x), True),
    "scalar_broadcast": (lambda x: x * 2.0 + jnp.sum(x), True),
    "broadcast_in_dim": (lambda x: x[:, :1] * x, True),
    "dot_dense": (lambda x: x @ jnp.ones((6, 3)), True),
    "dot_sparse_const": (lambda x: x @ A, True),
    "dot_traced": (lambda x: x[:, :4] @ x[:, 2:].T, True),
    "reduce_sum_axis": (lambda x: jnp.sum(x, axis=0), True),
    "reduce_max": (lambda x: jnp.max(x, axis=1), False),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), True),
    "cumsum_rev": (lambda x: lax.cumsum(x, axis=0, reverse=True), True),
    "cumprod": (lambda x: jnp.cumprod(x, axis=1), True),
    "slice_stride": (lambda x: x[::2, 1::3], True),
    "pad": (lambda x: jnp.pad(x, ((1, 2), (0, 1))) * 3.0, True),
    "pad_interior": (lambda x: lax.pad(x, 0.0, ((1, -1, 1), (0, 0, 2))), True),
    "concatenate": (lambda x: jnp.concatenate([x[:, ::-1], x.T.reshape(4, 6)], axis=0), True),
    "transpose_reshape": (lambda x: jnp.transpose(x).reshape(3, 8)[1:], True),
    "roll": (lambda x: jnp.roll(x, 2, axis=1) - x, True),
    "gather_fancy": (lambda x: x[jnp.array([3, 0, 0]), :][:, jnp.array([5, 1])], True),
    "gather_take": (lambda x: jnp.take(x.ravel(), jnp.array([7, 2, 23, 7])), True),
    "gather_fill": (lambda x: jnp.take(x.ravel(), jnp.array([1, 30]), mode="fill", fill_value=0.0), True),
    "scatter_add": (lambda x: jnp.zeros(5).at[jnp.array([0, 2, 2])].add(x[0, :3]), True),
    "scatter_set": (lambda x: x.at[1, 2:4].set(x[0, :2]), True),
    "scatter_mul": (lambda x: x.at[0].multiply(x[1]), True),
    "dynamic_slice": (lambda x: lax.dynamic_slice(x, (1, 2), (2, 3)), True),
    "dynamic_update_slice": (lambda x: lax.dynamic_update_slice(x, x[:2, :2] ** 2, (1, 3)), True),
    "select_const": (lambda x: jnp.where(jnp.arange(6) % 2 == 0, x, 0.0), True),
    "sort": (lambda x: jnp.sort(x, axis=1), False),
    "argmax_int": (lambda x: x[0] * jnp.argmax(x[1]).astype(x.dtype), False),
    "comparison": (lambda x: (x > 1.0).astype(x.dtype) + x[0, 0], True),
    "reduce_window_sum": (lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 3), (1, 2), "VALID"), True),
    "reduce_window_max_pad": (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "SAME"), False),
    "split": (lambda x: jnp.split(x, [2], axis=1)[1] * 2.0, True),
    "stack": (lambda x: jnp.stack([x, x[::-1] * 2], axis=1), True),
    "rev": (lambda x: jnp.flip(x, axis=(0, 1)), True),
    "tile": (lambda x: jnp.tile(x[1:3, :4], (3, 1, 2)) * x[0, 0], True),
    "unstack": (lambda x: jnp.unstack(x, axis=1)[4] * jnp.unstack(x)[1][:4], True),
    "custom_jvp": (lambda x: jax.nn.softplus(x[:, 1:]) + jax.nn.relu(x[:, :-1]), True),
    "checkpoint": (lambda x: jax.checkpoint(lambda z: jnp.sin(z) * z[::-1])(x), True),
    "jit_inner": (lambda x: jax.jit(lambda z: z[1:] - z[:-1])(x), True),
    "clamp": (lambda x: jnp.clip(x, 0.7, 1.2), False),
    "custom_vjp": (lambda x: _cube(x[:, ::2]) + x[:, 1::2], True),
    "traced_gather_index": (lambda x: x[0, jnp.argmax(x[1])] * x[2], False),
    "traced_dynamic_slice": (lambda x: lax.dynamic_slice(x, (0, jnp.argmin(x[0])), (2, 3)), False),
    "traced_scatter_index": (lambda x: x.at[0, jnp.argmax(x[1])].add(x[3, 0]), False),
    "integer_pow": (lambda x: x ** 3, True),
    # gather/scatter dimension-number forms: batching dims, clip/fill/drop modes, windows, point indexing
    "gather_take_along_axis": (lambda x: jnp.take_along_axis(x, jnp.array([[5, 0], [1, 1], [2, 4], [3, 3]]), axis=1),
                               True),
    "gather_clip": (lambda x: jnp.take(x[0], jnp.array([-3, 2, 9]), mode="clip"), True),
    "gather_points": (lambda x: x[jnp.array([0, 3, 3]), jnp.array([5, 1, 2])], True),
    "gather_windows": (lambda x: jax.vmap(lambda i: lax.dynamic_slice(x, (i, 1), (2, 3)))(jnp.array([2, 0])), True),
    "gather_vmapped_index": (lambda x: jax.vmap(lambda r, i: r[i])(x, jnp.array([5, 0, 3, 3])), True),
    "scatter_put_along_axis": (lambda x: jnp.put_along_axis(x * 1.0, jnp.array([[1], [0], [5], [2]]), x[:, :1] ** 2,
                                                            axis=1, inplace=False), True),
    "scatter_drop": (lambda x: jnp.zeros(4).at[jnp.array([1, 7, 3])].add(x[1, :3], mode="drop"), True),
    "scatter_min_max": (lambda x: x[0].at[jnp.array([1, 1, 4])].min(x[1, :3]).at[jnp.array([0])].max(x[2, :1]),
                        False),
    "scatter_set_duplicates": (lambda x: x[0].at[jnp.array([2, 2, 5])].set(x[3, :3]), False),
    "scatter_window": (lambda x: x.at[1:3, jnp.array([0, 4])].set(x[:2, 2:4] * 3.0), True),
    "scatter_vmapped": (lambda x: jax.vmap(lambda r, i, u: r.at[i].set(u))(x, jnp.array([1, 0, 5, 2]), x[:, 3] ** 2),
                        True),
    "traced_gather_local_batching": (lambda x: jnp.take_along_axis(x, jnp.argsort(x, axis=1)[:, :2], axis=1), False),
    # comparisons with a total order (searchsorted), the generic reduce, annotations
    "searchsorted": (lambda x: jnp.searchsorted(jnp.sort(x[0]), x[1]).astype(x.dtype) * x[2], False),
    "reduce_variadic": (lambda x: lax.reduce((x, x ** 2), (0.0, 1.0), lambda a, b: (a[0] + b[0], a[1] * b[1]),
                                             (0,))[1], True),
    "checkpoint_name_policy": (lambda x: jax.checkpoint(
        lambda z: checkpoint_name(jnp.sin(z), "s") * z[::-1],
        policy=jax.checkpoint_policies.save_only_these_names("s"))(x), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jacobian_pattern(name):
    f, exact = CASES[name]
    check(f, X, exact=exact)


def test_conv_pattern_exact():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((4, 2, 3, 3)))
    x = jnp.asarray(rng.standard_normal((1, 2, 7, 6)))
    f = lambda x: lax.conv_general_dilated(x, w, (2, 1), ((1, 1), (0, 2)), rhs_dilation=(1, 2))  # noqa: E731
    check(f, x)
    g = lambda x: lax.conv_general_dilated(x, w[:, :1], (1, 1), "SAME", feature_group_count=2,  # noqa: E731
                                           dimension_numbers=("NCHW", "OIHW", "NHWC"))
    check(g, x)
    h = lambda x: lax.conv_general_dilated(x[:, :1, :5, :5], x[0, :, :2, :2].reshape(2, 1, 2, 2),  # noqa: E731
                                           (1, 1), ((0, 0), (1, 0)), lhs_dilation=(2, 1))
    check(h, x)


def test_reduce_window_traced_init_value():
    f = lambda x: lax.reduce_window(x, x[0, 0], lax.mul, (2, 2), (1, 1), "SAME")  # noqa: E731
    P = aj.jacobian_sparsity(f, X).toarray()
    assert P[:, 0].all()
    same_windows = aj.jacobian_sparsity(lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 1), "SAME"), X)
    expected = same_windows.toarray()
    expected[:, 0] = True
    np.testing.assert_array_equal(P, expected)  # (JAX's own jacfwd cannot batch this primitive)


def test_cnn_detection():
    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.standard_normal((8, 1, 3, 3)))
    w2 = jnp.asarray(rng.standard_normal((16, 8, 3, 3)))

    def cnn(x):
        h = jnp.tanh(lax.conv_general_dilated(x, w1, (1, 1), "SAME"))
        return lax.conv_general_dilated(h, w2, (2, 2), "SAME")

    x = jnp.asarray(rng.standard_normal((1, 1, 28, 28)))
    P = aj.jacobian_sparsity(cnn, x)
    assert P.shape == (16 * 14 * 14, 784)
    J = np.asarray(jax.jacfwd(lambda z: cnn(z).ravel())(x)).reshape(P.shape) != 0
    assert not (J & ~P.toarray()).any()


def test_local_prunes():
    x = jnp.array([-1.0, 2.0, 3.0, -4.0])
    f = lambda x: jnp.maximum(x, 0.0) + jnp.where(x > 0, x ** 2, 1.0) + jnp.max(x) * x[0]  # noqa: E731
    P = check(f, x, exact=True, local=True)
    G = aj.jacobian_sparsity(f, x).toarray()
    assert P.sum() < G.sum()
    c = lambda x: lax.cond(x[0] > 0, lambda z: z * 2, lambda z: z[::-1], x)  # noqa: E731
    np.testing.assert_array_equal(aj.jacobian_sparsity(c, x, local=True).toarray(), np.eye(4)[::-1].astype(bool))
    np.testing.assert_array_equal(aj.jacobian_sparsity(c, x).toarray(), (np.eye(4) + np.eye(4)[::-1]) > 0)


def test_control_flow_sound():
    x = jnp.linspace(0.5, 1.5, 6)
    check(lambda x: lax.fori_loop(0, 3, lambda i, c: c * 2 + jnp.roll(c, 1) * x, x), x, exact=False)
    check(lambda x: lax.fori_loop(0, 100, lambda i, c: c + 0.01 * jnp.roll(c, 1), x), x, exact=False)
    check(lambda x: lax.scan(lambda c, xi: (c * xi, c + xi), 1.0, x)[1], x, exact=True)
    cum = aj.jacobian_sparsity(lambda x: lax.scan(lambda c, xi: (c + xi, c + xi), 0.0, x)[1], x).toarray()
    np.testing.assert_array_equal(cum, np.tril(np.ones((6, 6), dtype=bool)))

    def w(x):
        return lax.while_loop(lambda c: c[1] < 5, lambda c: (c[0] + jnp.roll(c[0], 1), c[1] + 1), (x, 0))[0]

    assert aj.jacobian_sparsity(w, x).toarray().all()
    check(w, x, exact=False)


def test_local_hessian():
    x = jnp.array([-1.0, 2.0, 0.5, -3.0])
    f = lambda x: jnp.sum(jax.nn.relu(x) ** 2) + jnp.sum(jnp.where(x > 1, x[::-1] * x, 0.0))  # noqa: E731
    P = aj.hessian_sparsity(f, x, local=True).toarray()
    np.testing.assert_array_equal(P, np.asarray(jax.hessian(f)(x)) != 0)
    assert aj.hessian_sparsity(f, x).toarray().sum() > P.sum()


def test_hessian_mul_is_exact():
    x = jnp.linspace(0.1, 1.0, 8)
    H = aj.hessian_sparsity(lambda x: jnp.sum(x[::2] * x[1::2]), x).toarray()
    expected = np.zeros((8, 8), dtype=bool)
    for i in range(4):
        expected[2 * i, 2 * i + 1] = expected[2 * i + 1, 2 * i] = True
    np.testing.assert_array_equal(H, expected)


HESS = {
    "rosenbrock": lambda x: jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2),
    "quadratic_form": lambda x: x @ (A @ A.T @ x),
    "division": lambda x: jnp.sum(x[:3] / x[3:6]) + jnp.sum(x[6:] * 2.0),
    "exp_sum": lambda x: jnp.exp(jnp.sum(x[:3])) + jnp.sin(x[4]) * x[5],
    "norm": lambda x: jnp.sqrt(jnp.sum(x ** 2)),
    "scan": lambda x: lax.scan(lambda c, xi: (c + xi * xi, None), 0.0, x)[0],
    "cond": lambda x: lax.cond(x[0] > 100.0, lambda z: jnp.sum(z * z), lambda z: z[1] * z[2], x),
    "while": lambda x: lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] * x[0] + x[1], c[1] + 1), (x[2], 0))[0],
    "scan_long": lambda x: lax.scan(lambda c, xi: (c * 0.9 + xi[0] * xi[1], None), 0.0,
                                    jnp.tile(x.reshape(3, 2), (30, 1)))[0],
    "custom_jvp": lambda x: jnp.sum(jax.nn.softplus(x[::2]) * x[1::2]),
    "custom_vjp": lambda x: jnp.sum(_cube(x[:3]) * x[3:]),
    "jit_inner": lambda x: jnp.sum(jax.jit(lambda z: z[1:] * z[:-1])(x)),
    "checkpoint": lambda x: jnp.sum(jax.checkpoint(lambda z: jnp.sin(z[:3]) * z[3:])(x)),
    "gather_pairs": lambda x: jnp.sum(x[jnp.array([0, 2, 4])] * x[jnp.array([1, 3, 5])]),
    "scatter_add": lambda x: jnp.sum(jnp.zeros(3).at[jnp.array([0, 1, 1])].add(x[:3]) * x[3:]),
    "dynamic_update_slice": lambda x: jnp.sum(lax.dynamic_update_slice(x, x[:2] * x[2:4], (4,)) ** 2),
    "dot_batched": lambda x: jnp.sum(jnp.einsum("bi,bj->bij", x[:4].reshape(2, 2), x[2:].reshape(2, 2))),
    "conv": lambda x: jnp.sum(jnp.convolve(x[:4], x[4:], mode="valid")),
    "cumsum_pairs": lambda x: jnp.sum(jnp.cumsum(x)[::2] * x[1::2]),
    "pairs": lambda x: jnp.sum(x[::2] * x[1::2]),
}


@pytest.mark.parametrize("name", sorted(HESS))
def test_hessian_pattern(name):
    x = jnp.linspace(0.3, 1.3, 6 if name != "division" else 8)
    f = HESS[name]
    if name == "quadratic_form":
        x = jnp.linspace(0.3, 1.3, 6)
    P = aj.hessian_sparsity(f, x).toarray()
    D = dense_hess(f, x)
    assert not (D & ~P).any()
    # unions and fixed points over-approximate; so does a custom_vjp function's Hessian (its pullback's
    # dependence on its residuals is not interpreted: every pair of its inputs may interact)
    if name not in ("cond", "while", "scan_long", "custom_vjp"):
        np.testing.assert_array_equal(P, D)


@pytest.mark.parametrize("name", ["rosenbrock", "norm", "scan", "custom_jvp", "dot_batched", "cumsum_pairs"])
def test_hessian_squares_multiplied_out_once_give_the_per_op_pattern(name):
    """The interpreter shares the PyTorch tracer's accumulation (asd.detection.second_order): the
    squares multiplied out once on their stacked rows, or flushed at almost every square, give the
    pattern of one product per op."""
    from asd.detection import second_order as SO

    x = jnp.linspace(0.3, 1.3, 6)
    f = HESS[name]
    stacked = aj.hessian_sparsity(f, x).toarray()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SO.SecondOrder, "MERGE_NNZ", 1)
        flushed = aj.hessian_sparsity(f, x).toarray()
        mp.setattr(SO.SecondOrder, "add_square",
                   lambda self, G: self.add(SO.gram(G, G)) if G is not None and G.nnz else None)
        per_op = aj.hessian_sparsity(f, x).toarray()
    np.testing.assert_array_equal(stacked, per_op)
    np.testing.assert_array_equal(flushed, per_op)


#: the primitives issue 12 names, by family (JAX >= 0.4.35 spellings and the current ones)
NAMED_PRIMITIVES = {
    "elementwise": ["sin", "exp", "log", "tanh", "logistic", "integer_pow", "pow", "add", "sub", "mul", "div", "neg",
                    "max", "min", "abs", "sign", "clamp", "select_n", "convert_element_type", "iota"],
    "comparisons": ["eq", "ne", "lt", "le", "gt", "ge", "eq_to", "lt_to", "le_to", "is_finite"],
    "broadcasting": ["broadcast_in_dim"],
    "contractions": ["dot_general", "conv_general_dilated"],
    "reductions": ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce", "argmax", "argmin",
                   "reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window",
                   "select_and_gather_add", "select_and_scatter_add"],
    "cumulative": ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"],
    "indexing": ["gather", "scatter", "scatter-add", "scatter-mul", "scatter-min", "scatter-max", "dynamic_slice",
                 "dynamic_update_slice"],
    "movement": ["slice", "pad", "concatenate", "rev", "transpose", "reshape", "squeeze", "expand_dims", "split",
                 "tile", "unstack"],
    "sorting": ["sort", "top_k"],
    "control": ["pjit", "jit", "closed_call", "custom_jvp_call", "custom_vjp_call", "cond", "while", "scan",
                "remat2", "checkpoint", "name"],
}


@pytest.mark.parametrize("family", sorted(NAMED_PRIMITIVES))
def test_rule_table_covers_named_primitives(family):
    from asd.jax.table import RULES

    missing = [p for p in NAMED_PRIMITIVES[family] if p not in RULES]
    assert not missing, f"no rule for {missing}"


def test_generated_primitives_have_rules():
    """Every primitive in the jaxprs of the tested functions has a rule (no conservative fallback)."""
    from asd.jax.table import RULES

    seen = set()

    def walk(j):
        for e in getattr(j, "jaxpr", j).eqns:
            seen.add(e.primitive.name)
            for v in e.params.values():
                for w in v if isinstance(v, (tuple, list)) else [v]:
                    if isinstance(w, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                        walk(w)

    for f, _ in CASES.values():
        walk(jax.make_jaxpr(f)(X))
    for name, f in HESS.items():
        walk(jax.make_jaxpr(f)(jnp.ones(8 if name == "division" else 6)))
    assert seen - set(RULES) == set()


def test_pooling_derivatives_inside_f():
    """select_and_gather_add / select_and_scatter_add (max pooling's JVP and VJP) are sound and sparse."""
    pool = lambda w: lax.reduce_window(w, -jnp.inf, lax.max, (2, 2), (1, 2), ((1, 0), (0, 1)))  # noqa: E731
    jvp = lambda z: jax.jvp(pool, (z,), (z ** 2,))[1]  # noqa: E731
    vjp = lambda z: jax.vjp(pool, lax.stop_gradient(z))[1](pool(z) ** 2)[0]  # noqa: E731
    for f in (jvp, vjp):
        P = check(f, X, exact=False)
        assert P.sum() < 0.5 * P.size
    P = aj.jacobian_sparsity(jvp, X).toarray()  # window (r, c) reads rows r-1..r, columns 2c..2c+1
    windows = np.zeros((4, 3, 4, 6), dtype=bool)
    for r in range(4):
        for c in range(3):
            windows[r, c, max(r - 1, 0):r + 1, 2 * c:2 * c + 2] = True
    np.testing.assert_array_equal(P, windows.reshape(12, 24))


def test_composite_follows_its_body():
    """JAX cannot differentiate lax.composite; its pattern is its body's."""
    body = lambda z: jnp.sin(z[:, 1:]) * z[:, :-1]  # noqa: E731
    P = aj.jacobian_sparsity(lambda z: lax.composite(body, name="asd.test")(z), X).toarray()
    np.testing.assert_array_equal(P, aj.jacobian_sparsity(body, X).toarray())


def test_unknown_primitive_warns_and_strict_raises():
    prim = jax.extend.core.Primitive("asd_test_mystery")
    prim.def_impl(lambda x: x[::-1] * 1.0)
    prim.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    x = jnp.ones(4)
    f = lambda x: prim.bind(x[:3]) * 2.0  # noqa: E731
    with pytest.warns(asd.UnsupportedOpWarning, match="asd_test_mystery"):
        P = aj.jacobian_sparsity(f, x).toarray()
    assert P[:, :3].all() and not P[:, 3].any()
    with pytest.raises(asd.UnsupportedOpError):
        aj.jacobian_sparsity(f, x, strict=True)


def test_pytrees_and_argnums():
    a, b = jnp.ones(3), {"u": jnp.ones(2), "v": jnp.ones((2, 2))}
    f = lambda a, b: {"p": a[:2] * b["u"], "q": b["v"].sum(axis=1) + a[2]}  # noqa: E731
    Pa, Pb = aj.jacobian_sparsity(f, (a, b))
    assert Pa.shape == (4, 3) and Pb.shape == (4, 6)
    np.testing.assert_array_equal(Pa.toarray(), [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1]])
    np.testing.assert_array_equal(Pb.toarray(), [[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0],
                                                 [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1]])
    Pb1 = aj.jacobian_sparsity(f, (a, b), argnums=1)
    np.testing.assert_array_equal(Pb1.toarray(), Pb.toarray())


def test_bad_inputs():
    with pytest.raises(asd.InputError, match="floating-point"):
        aj.jacobian_sparsity(lambda x: x, jnp.arange(3))
    with pytest.raises(asd.InputError, match="dtype"):
        aj.jacobian_sparsity(lambda x: x > 0, jnp.ones(3))
    with pytest.raises(asd.InputError, match="scalar"):
        aj.hessian_sparsity(lambda x: x, jnp.ones(3))


def test_import_asd_does_not_import_jax():
    code = "import sys, asd; assert 'jax' not in sys.modules, 'import asd imported jax'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_jax_names_the_extra():
    code = ("import sys; sys.modules['jax'] = None\n"
            "try:\n    import asd.jax\nexcept ImportError as e:\n    assert 'pip install asd[jax]' in str(e), e\n"
            "else:\n    raise SystemExit('no ImportError')")
    subprocess.run([sys.executable, "-c", code], check=True)


OPS = [
    lambda x: jnp.sin(x), lambda x: x * x[::-1], lambda x: jnp.roll(x, 1), lambda x: jnp.cumsum(x),
    lambda x: x / (1.0 + x ** 2), lambda x: jnp.maximum(x, x[::-1]), lambda x: jnp.where(x > 0, x, x[0]),
    lambda x: jnp.concatenate([x[1:], x[:1] ** 2]), lambda x: x.at[2].add(x[5]), lambda x: jnp.sort(x),
    lambda x: x @ jnp.triu(jnp.ones((x.size, x.size))), lambda x: x + jnp.sum(x[:2]),
]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, len(OPS) - 1), min_size=1, max_size=4), st.booleans())
def test_random_compositions_are_sound(chain, local):
    def f(x):
        for k in chain:
            x = OPS[k](x)
        return x

    x = jnp.asarray(np.random.default_rng(len(chain)).standard_normal(7))
    check(f, x, exact=False, local=local)


def test_scan_operand_counts_in_both_parameter_forms():
    """jax 0.11 replaced scan's ``num_consts``/``num_carry`` with a flat tree ``ft_in`` (the scan
    rule raised KeyError there); both forms give the same counts, and the present jax's own scan
    is read right (the scan patterns above)."""
    from asd.jax.rules.control import scan_counts

    class FlatTree:  # what jax 0.11's ft_in answers: unpack() into (consts, carry, xs)
        def __init__(self, *parts):
            self.parts = parts

        def unpack(self):
            return self.parts

    assert scan_counts(dict(num_consts=2, num_carry=1, length=3)) == (2, 1)
    assert scan_counts(dict(ft_in=FlatTree([None] * 2, [None], [None] * 4), length=3)) == (2, 1)
    with pytest.raises(NotImplementedError, match="jax version"):
        scan_counts(dict(length=3))
    eqn = jax.make_jaxpr(lambda c, x: lax.scan(lambda c, xi: (c + xi, c), c, x))(1.0, jnp.ones(3)).eqns[-1]
    assert eqn.primitive.name == "scan" and scan_counts(eqn.params) == (0, 1)


# -- functions with their own derivative rule, and complex moduli (found by an adversarial review) --

@jax.custom_jvp
def _ste(x):
    return jnp.round(x)


_ste.defjvp(lambda p, t: (_ste(p[0]), t[0]))


@jax.custom_vjp
def _ste_vjp(x):
    return jnp.round(x)


_ste_vjp.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))


@jax.custom_jvp
def _mix(x):  # the rule couples neighbours that the body keeps apart
    return jnp.floor(x)


_mix.defjvp(lambda p, t: (_mix(p[0]), t[0] + jnp.roll(t[0], 1) * p[0] ** 2))


@jax.custom_vjp
def _spread(x):
    return jnp.floor(x)


_spread.defvjp(lambda x: (jnp.floor(x), x), lambda x, g: (g * jnp.cos(x) + jnp.roll(g, -1),))


@pytest.mark.parametrize("name,f", [
    ("ste_jvp", lambda x: _ste(x) * 2.0),
    ("ste_vjp", lambda x: _ste_vjp(x) + 1.0),
    ("rule_couples_neighbours", lambda x: _mix(x)),
    ("vjp_rule_couples_neighbours", lambda x: _spread(x)),
    ("inside_jit", jax.jit(lambda x: _ste(x[::2]) * x[1::2])),
])
def test_custom_derivative_rules_are_followed(name, f):
    """A straight-through estimator (round forward, identity derivative): the body alone gave an
    empty pattern and a zero Jacobian."""
    x = jnp.asarray(np.random.default_rng(5).uniform(-2, 2, 8))
    check(f, x)
    vjp = "vjp" in name  # custom_vjp functions have no forward mode in JAX: "auto" picks reverse
    op = aj.prepare_jacobian(f, x)
    assert op.mode == "reverse" or not vjp
    J = np.asarray(op(x).todense())
    ref = jax.jacrev(f)(x) if vjp else jax.jacfwd(f)(x)
    np.testing.assert_allclose(J, np.asarray(ref), atol=1e-12)


def test_custom_vjp_functions_are_evaluated_in_reverse_mode():
    """JAX has no forward mode through a custom_vjp function: mode="auto" picked JVPs, which raised."""
    x = jnp.asarray(np.random.default_rng(7).uniform(-2, 2, 8))
    f = lambda z: _ste_vjp(z) * z  # noqa: E731
    for op in (aj.prepare_jacobian(f, x), aj.prepare_jacobian(f, x, pattern=np.eye(8, dtype=bool))):
        assert op.mode == "reverse"
        np.testing.assert_allclose(np.asarray(op(x).todense()), np.asarray(jax.jacrev(f)(x)), atol=1e-12)


def test_custom_rule_hessians_are_sound():
    x = jnp.asarray(np.random.default_rng(6).uniform(-2, 2, 6))
    for f in (lambda z: jnp.sum(_mix(z) * z), lambda z: jnp.sum(_spread(z) * z ** 2)):
        # these rules are no gradient of anything: the "Hessian" is not symmetric, only its
        # pattern (either triangle) is compared
        P = aj.hessian_sparsity(f, x).toarray()
        D = dense_hess(f, x)
        assert not ((D | D.T) & ~P).any(), "pattern misses a nonzero"


def test_complex_modulus_is_nonlinear():
    """|z| is (piecewise) linear on the reals only: the Hessian of sum(|z|) came out empty."""
    x = jnp.array([0.3, -1.2, 0.8, 0.5])
    z = lambda x: x[:2] + 1j * x[2:]  # noqa: E731
    cases = [lambda x: jnp.sum(jnp.abs(z(x))), lambda x: jnp.sum(jnp.abs(z(x)) ** 2 * x[:2])]
    for f in cases:
        P = aj.hessian_sparsity(f, x).toarray()
        assert not (dense_hess(f, x) & ~P).any(), "pattern misses a nonzero"
        np.testing.assert_allclose(np.asarray(aj.sparse_hessian(f, x).todense()), np.asarray(jax.hessian(f)(x)),
                                   atol=1e-12)
    check(lambda x: jnp.abs(z(x)), x)
    # real moduli stay piecewise linear: no second-order terms
    assert aj.hessian_sparsity(lambda x: jnp.sum(jnp.abs(x) * 2.0), x).nnz == 0


# -- review of session 30: each pattern below was unsound (missing entries) before its fix ----------

@jax.custom_vjp
def _reads_neighbours(x):
    return x * 1.0


_reads_neighbours.defvjp(lambda x: (x * 1.0, x), lambda r, g: (g * (jnp.roll(r, 1) + jnp.roll(r, -1)),))


@jax.custom_gradient
def _reversed_gradient(x):
    return x * 1.0, lambda g: g * x[::-1]


@jax.custom_jvp
def _straight_through(v):
    return jnp.round(v)


_straight_through.defjvp(lambda p, t: (jnp.round(p[0]), t[0]))


@jax.custom_jvp
def _coefficient_through_custom(v):
    return v * 1.0


_coefficient_through_custom.defjvp(lambda p, t: (p[0] * 1.0, _straight_through(p[0][::-1]) * t[0]))

REVIEW_JAC = {
    "reshape_dimensions": lambda x: lax.reshape(x.reshape(2, 3), (6,), dimensions=(1, 0)),
    "reshape_order_F": lambda x: jnp.reshape(x.reshape(2, 3) ** 2, (6,), order="F"),
    "top_k_axis0": lambda x: lax.top_k(x.reshape(3, 2), 1, axis=0)[0],
}
REVIEW_HESS = {
    "custom_vjp_reads_residuals": lambda x: jnp.sum(_reads_neighbours(x)),
    "custom_gradient": lambda x: jnp.sum(_reversed_gradient(x)),
    "custom_jvp_coefficient_through_custom_jvp": lambda x: jnp.sum(_coefficient_through_custom(x)),
}


def _applied(x):
    return x.at[jnp.array([1, 3])].apply(jnp.sin)


@pytest.mark.filterwarnings("ignore::asd.UnsupportedOpWarning")
@pytest.mark.parametrize("name", sorted(REVIEW_JAC))
def test_review_jacobian_patterns_are_sound(name):
    x = jnp.asarray([0.3, -1.2, 0.7, 2.0, 1.1, -0.4])
    P = aj.jacobian_sparsity(REVIEW_JAC[name], x).toarray()
    assert not (dense_jac(REVIEW_JAC[name], x) & ~P).any()


@pytest.mark.filterwarnings("ignore::asd.UnsupportedOpWarning")
@pytest.mark.parametrize("name", sorted(REVIEW_HESS))
def test_review_hessian_patterns_are_sound(name):
    x = jnp.asarray([1.2, -0.4, 2.6, 0.9])
    P = aj.hessian_sparsity(REVIEW_HESS[name], x).toarray()
    assert not (dense_hess(REVIEW_HESS[name], x) & ~P).any()


def test_an_applied_scatter_is_traced_conservatively_with_a_warning():
    """``x.at[i].apply(sin)`` was traced as an overwrite: rows 1 and 3 empty, no Hessian (JAX has no
    JVP of it, so the truth is written out: out[i] = sin(x[i]) at 1 and 3, x[i] elsewhere)."""
    x = jnp.asarray([1.2, -0.4, 2.6, 0.9])
    with pytest.warns(asd.UnsupportedOpWarning, match="apply"):
        P = aj.jacobian_sparsity(_applied, x).toarray()
    assert P[np.arange(4), np.arange(4)].all()
    with pytest.warns(asd.UnsupportedOpWarning, match="apply"):
        H = aj.hessian_sparsity(lambda v: jnp.sum(_applied(v)), x).toarray()
    assert H[1, 1] and H[3, 3]


def test_a_custom_vjp_hessian_warns():
    x = jnp.asarray([1.2, -0.4, 2.6, 0.9])
    with pytest.warns(asd.UnsupportedOpWarning, match="custom_vjp"):
        aj.hessian_sparsity(REVIEW_HESS["custom_vjp_reads_residuals"], x)


def test_local_clamp_with_crossed_bounds_follows_the_upper_one():
    """XLA's clamp is min(max(x, lo), hi): with lo > hi the result is hi."""
    f = lambda v: lax.clamp(v[2:3], v[0:1], v[1:2])  # noqa: E731  (lo = v[2], x = v[0], hi = v[1])
    x = jnp.asarray([0.5, 0.0, 1.0])
    P = aj.jacobian_sparsity(f, x, local=True).toarray()
    D = np.asarray(jax.jacfwd(f)(x)) != 0
    assert not (D & ~P).any()
    np.testing.assert_allclose(np.asarray(aj.sparse_jacobian(f, x, local=True).todense()), np.asarray(jax.jacfwd(f)(x)))
