"""asd.jax: results that were wrong without a word (a review of the prepared operators and the API).

A reduce_window of several operands whose reducer mixes them, a conv with batch_group_count > 1 (no
second-order terms), an unstable sort with tied keys traced at a point, values of an XLA stateful
generator or a host callback used as constants at detection, a repeated argnums entry, and operators
prepared at one point (``local=True``) or with a given pattern and called elsewhere without a check.
"""

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="asd.jax needs jax (pip install asd[jax])")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import asd.jax as aj  # noqa: E402
from asd.errors import CheckError, InputError  # noqa: E402


def _jvp_columns(f, x):
    eye = jnp.eye(x.size, dtype=x.dtype)
    return np.stack([np.asarray(jax.jvp(f, (x,), (eye[i].reshape(x.shape),))[1]).ravel() for i in range(x.size)], 1)


def test_a_reduce_window_whose_reducer_mixes_its_operands():
    def cmul(a, b):  # complex products of (re, im) pairs
        return (a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0])

    def f(x):
        return lax.reduce_window((x[:4], x[4:]), (1.0, 0.0), cmul, (2,), (1,), "VALID")[0]

    x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, 8))
    P = aj.jacobian_sparsity(f, x).toarray()
    assert not ((_jvp_columns(f, x) != 0) & ~P).any()
    H = aj.hessian_sparsity(lambda z: jnp.sum(f(z)), x).toarray()
    # finite differences of first derivatives (JAX cannot take a second JVP of this reduce_window)
    s = lambda z: jnp.sum(f(z))  # noqa: E731
    eye, h = jnp.eye(8), 1e-5
    d = jax.jit(lambda z, t: jax.jvp(s, (z,), (t,))[1])
    D = np.array([[(float(d(x + h * eye[j], eye[i])) - float(d(x - h * eye[j], eye[i]))) / (2 * h)
                   for j in range(8)] for i in range(8)])
    assert not ((np.abs(D) > 1e-6) & ~H).any()


def test_a_conv_with_batch_groups_has_its_hessian():
    def f(x):
        lhs, rhs = x[:6].reshape(2, 1, 3), x[6:].reshape(2, 1, 2)
        return jnp.sum(lax.conv_general_dilated(lhs, rhs, (1,), "VALID", batch_group_count=2))

    x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, 10))
    D = np.asarray(jax.hessian(f)(x))
    assert not ((D != 0) & ~aj.hessian_sparsity(f, x).toarray()).any()
    np.testing.assert_allclose(aj.to_scipy(aj.sparse_hessian(f, x)).toarray(), D, atol=1e-12)


@pytest.mark.parametrize("shape,d", [((36,), 0), ((4, 9), 1), ((4, 9), 0)])
def test_a_local_unstable_sort_with_ties(shape, d):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 3, int(np.prod(shape))).astype(float).reshape(shape))
    w = jnp.arange(1.0, x.size + 1).reshape(shape)
    f = lambda z: lax.sort(z, dimension=d, is_stable=False) * w  # noqa: E731
    D = np.asarray(jax.jacfwd(f)(x)).reshape(x.size, x.size)
    P = aj.jacobian_sparsity(f, x, local=True).toarray()
    assert not ((D != 0) & ~P).any()
    J = aj.to_scipy(aj.prepare_jacobian(f, x, local=True)(x)).toarray()
    np.testing.assert_allclose(J, D, atol=1e-12)


def test_values_of_a_stateful_generator_or_a_callback_do_not_prune():
    x = jnp.linspace(1.0, 2.0, 8)
    f = lambda z: jnp.where(lax.rng_uniform(0.0, 1.0, (8,)) > 0.5, z, z[::-1])  # noqa: E731
    P = aj.jacobian_sparsity(f, x).toarray()
    assert P[np.arange(8), np.arange(8)].all() and P[np.arange(8), np.arange(8)[::-1]].all()
    rng = np.random.default_rng(0)
    mask = lambda: jax.pure_callback(lambda: rng.random(8) > 0.5, jax.ShapeDtypeStruct((8,), jnp.bool_))  # noqa: E731
    g = lambda z: jnp.where(mask(), z, z[::-1])  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P = aj.jacobian_sparsity(g, x).toarray()
    assert P[np.arange(8), np.arange(8)].all() and P[np.arange(8), np.arange(8)[::-1]].all()


def test_a_repeated_argnums_entry_is_refused():
    f = lambda a, b: a * b  # noqa: E731
    x = (jnp.ones(3), jnp.ones(3))
    for argnums in ((0, 0), (0, -2)):
        with pytest.raises(InputError, match="twice"):
            aj.jacobian_sparsity(f, x, argnums=argnums)


def _where_f(x):
    return jnp.where(x > 0, x[::-1] * x, x)


def _cond_g(x):
    return lax.cond(x[0] > 0, lambda z: z[0] * z[1], lambda z: z[2] * z[3], x)


X0 = jnp.array([1.0, -2.0, 3.0, -4.0])


def test_a_local_operator_called_where_its_pattern_fails_raises():
    op = aj.prepare_jacobian(_where_f, X0, local=True)
    np.testing.assert_allclose(aj.to_scipy(op(X0)).toarray(), np.asarray(jax.jacfwd(_where_f)(X0)))
    with pytest.raises(CheckError):
        op(-X0)
    H = aj.prepare_hessian(_cond_g, X0, local=True)
    with pytest.raises(CheckError):
        H(-X0)
    with pytest.raises(CheckError):
        H.value_grad_hessian(-X0)
    # where the pattern holds, the checked call answers (a point with the same signs)
    np.testing.assert_allclose(aj.to_scipy(op(2 * X0)).toarray(), np.asarray(jax.jacfwd(_where_f)(2 * X0)))


def test_a_given_pattern_missing_entries_raises_unless_unchecked():
    f = lambda a: a * a[::-1]  # noqa: E731
    x = jnp.arange(1.0, 7.0)
    op = aj.prepare_jacobian(f, x, pattern=np.eye(6, dtype=bool))
    with pytest.raises(CheckError):
        op(x)
    unchecked = aj.prepare_jacobian(f, x, pattern=np.eye(6, dtype=bool), check=False)
    assert unchecked.check is False
    unchecked(x)  # the caller's choice: no check
    full = aj.prepare_jacobian(f, x, pattern=np.asarray(jax.jacfwd(f)(x)) != 0)
    np.testing.assert_allclose(aj.to_scipy(full(x + 1)).toarray(), np.asarray(jax.jacfwd(f)(x + 1)))
    with pytest.raises(InputError, match="check"):
        aj.prepare_jacobian(f, x, check="yes")


def test_a_globally_prepared_operator_is_not_checked_by_default():
    op = aj.prepare_jacobian(lambda a: a * a[::-1], jnp.arange(1.0, 7.0))
    assert op.check is False


def test_auto_mode_takes_forward_for_a_while_loop():
    def f(x):
        def body(c):
            v, k = c
            return v * 0.5 + jnp.sum(x ** 2), k + 1
        return lax.while_loop(lambda c: c[1] < 3, body, (0.0, 0))[0].reshape(1)

    x = jnp.linspace(0.1, 1.0, 6)
    op = aj.prepare_jacobian(f, x)
    assert op.mode == "forward"
    np.testing.assert_allclose(aj.to_scipy(op(x)).toarray(), np.asarray(jax.jacfwd(f)(x)), atol=1e-12)


def test_reverse_mode_with_an_output_of_another_dtype():
    f = lambda x: (x[1:] * x[:-1]).astype(jnp.float32)  # noqa: E731
    x = jnp.linspace(0.1, 1.0, 6)
    J = aj.to_scipy(aj.sparse_jacobian(f, x, mode="reverse")).toarray()
    np.testing.assert_allclose(J, np.asarray(jax.jacfwd(f)(x)), rtol=1e-6)


def test_value_grad_hessian_through_a_custom_vjp_function():
    @jax.custom_vjp
    def sinw(x, w):
        return jnp.sin(x) * w

    sinw.defvjp(lambda x, w: (sinw(x, w), (x, w)),
                lambda r, g: (g * jnp.cos(r[0]) * r[1], g * jnp.sin(r[0])))
    g = lambda x: jnp.sum(sinw(x, x[::-1]))  # noqa: E731
    x = jnp.linspace(0.1, 1.0, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Hessian through a custom_vjp function is conservative
        val, grad, H = aj.gradient_and_hessian(g, x)
    np.testing.assert_allclose(float(val), float(g(x)))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.grad(g)(x)), atol=1e-12)
    ref = np.asarray(jax.jacrev(jax.jacrev(g))(x))  # jax.hessian cannot: the fwd calls sinw itself
    np.testing.assert_allclose(aj.to_scipy(H).toarray(), ref, atol=1e-12)


def test_the_check_judges_a_float32_output_at_float32_precision():
    f = lambda x: (jnp.sin(x) * jnp.roll(x, 1)).astype(jnp.float32)  # noqa: E731
    x = jnp.linspace(0.1, 1.0, 6)
    for options in ({"local": True}, {"local": True, "mode": "reverse"},
                    {"pattern": aj.prepare_jacobian(f, x).pattern}):
        np.testing.assert_allclose(aj.to_scipy(aj.prepare_jacobian(f, x, **options)(x)).toarray(),
                                   np.asarray(jax.jacfwd(f)(x)), rtol=1e-6)

    @jax.custom_vjp
    def cv(x):
        return jnp.sin(x)

    cv.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (jnp.cos(r) * g,))
    f2 = lambda x: (cv(x) * jnp.roll(x, 1)).astype(jnp.float32)  # noqa: E731  (reverse mode only)
    np.testing.assert_allclose(aj.to_scipy(aj.prepare_jacobian(f2, x, local=True)(x)).toarray(),
                               np.asarray(jax.jacrev(f2)(x)), rtol=1e-6)


def test_the_check_passes_over_a_nan_that_one_mode_computes():
    """sqrt at 0 under where: reverse mode's values are NaN there (0 * inf, as jax.jacrev's), the
    checking JVP is finite; no CheckError blames the pattern."""
    f = lambda x: jnp.where(x > 0, jnp.sqrt(jnp.abs(x)), 0.0) + jnp.roll(x, 1)  # noqa: E731
    x = jnp.array([0.0, 1.0, 4.0, 2.0, 0.5, 3.0])
    for options in ({"mode": "reverse", "local": True}, {"mode": "reverse", "pattern": aj.prepare_jacobian(f, x).pattern}):
        J = aj.to_scipy(aj.prepare_jacobian(f, x, **options)(x)).toarray()
        finite = np.isfinite(J)
        np.testing.assert_allclose(J[finite], np.asarray(jax.jacfwd(f)(x))[finite])
