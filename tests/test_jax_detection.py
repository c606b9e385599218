"""Sparsity detection on jaxprs (asd.jax) against dense float64 jax.jacfwd / jax.hessian."""

import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="asd.jax needs jax (pip install asd[jax])")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import asd  # noqa: E402
import asd.jax as aj  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402


def dense_jac(f, x, points=2, seed=0):
    rng = np.random.default_rng(seed)
    out = None
    for k in range(points):
        xp = x if k == 0 else x + jnp.asarray(rng.standard_normal(x.shape))
        flat = lambda z: jnp.ravel(f(z))  # noqa: E731
        try:
            y = jax.jacfwd(flat)(xp)
        except TypeError:  # custom_vjp functions have no forward mode
            y = jax.jacrev(flat)(xp)
        nz = np.asarray(y).reshape(-1, x.size) != 0
        out = nz if out is None else out | nz
    return out


def dense_hess(f, x, points=2, seed=0):
    rng = np.random.default_rng(seed)
    out = None
    for k in range(points):
        xp = x if k == 0 else x + jnp.asarray(rng.standard_normal(x.shape))
        nz = np.asarray(jax.hessian(f)(xp)).reshape(x.size, x.size) != 0
        out = nz if out is None else out | nz
    return out


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
    "custom_jvp": (lambda x: jax.nn.softplus(x[:, 1:]) + jax.nn.relu(x[:, :-1]), True),
    "checkpoint": (lambda x: jax.checkpoint(lambda z: jnp.sin(z) * z[::-1])(x), True),
    "jit_inner": (lambda x: jax.jit(lambda z: z[1:] - z[:-1])(x), True),
    "clamp": (lambda x: jnp.clip(x, 0.7, 1.2), False),
    "custom_vjp": (lambda x: _cube(x[:, ::2]) + x[:, 1::2], True),
    "traced_gather_index": (lambda x: x[0, jnp.argmax(x[1])] * x[2], False),
    "traced_dynamic_slice": (lambda x: lax.dynamic_slice(x, (0, jnp.argmin(x[0])), (2, 3)), False),
    "traced_scatter_index": (lambda x: x.at[0, jnp.argmax(x[1])].add(x[3, 0]), False),
    "integer_pow": (lambda x: x ** 3, True),
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
    if name not in ("cond",):
        np.testing.assert_array_equal(P, D)


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
