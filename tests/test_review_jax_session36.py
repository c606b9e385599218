"""Defects an adversarial review of asd.jax found (session 36), each against dense JAX results."""

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="asd.jax needs jax (pip install asd[jax])")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import asd  # noqa: E402
import asd.jax as aj  # noqa: E402

_STATE = {"W": jnp.eye(4)}


def _quadratic(x):
    return 0.5 * x @ (_STATE["W"] @ x)


def test_value_grad_hessian_after_a_rebound_global_is_the_prepared_function():
    """The jitted value_grad_hessian is traced at its first call: it read the global as rebound by
    then, and decompressed those values with the old pattern (4 I, neither the old nor the new
    Hessian). Every function of an operator evaluates f as it stood at preparation."""
    _STATE["W"] = jnp.eye(4)
    x = jnp.arange(1.0, 5.0)
    op = aj.prepare_hessian(_quadratic, x)
    old_H, old_g = np.asarray(jax.hessian(_quadratic)(x)), np.asarray(jax.grad(_quadratic)(x))
    _STATE["W"] = jnp.ones((4, 4))
    try:
        np.testing.assert_allclose(np.asarray(op(x).todense()), old_H)
        val, grad, H = op.value_grad_hessian(x)
        np.testing.assert_allclose(np.asarray(H.todense()), old_H)
        np.testing.assert_allclose(np.asarray(grad), old_g)
        np.testing.assert_allclose(float(val), 0.5 * float(x @ x))
    finally:
        _STATE["W"] = jnp.eye(4)


def test_a_committed_input_after_a_numpy_array_changed_in_place_gets_the_prepared_jacobian():
    """A committed input makes jit trace again, and that trace read the numpy array f captures (which
    JAX's constant aliased) as changed: new values decompressed with the old pattern."""
    A = np.eye(4)
    f = lambda x: (jnp.asarray(A) @ x) * x  # noqa: E731
    x = jnp.asarray(np.linspace(1, 2, 4))
    expected = np.asarray(jax.jacfwd(f)(x))
    op = aj.prepare_jacobian(f, x)
    A[:] = np.arange(16.0).reshape(4, 4)
    for point in (x, jax.device_put(x, jax.devices()[0])):
        np.testing.assert_allclose(np.asarray(op(point).todense()), expected)


def test_the_check_product_is_traced_with_the_prepared_function():
    """The check's jitted product is traced at the first call too: a closure changed before it
    made the check blame the pattern (CheckError) for what the user's change did."""
    A = np.eye(5)
    f = lambda x: (jnp.asarray(A) @ x) * jnp.roll(x, 1)  # noqa: E731
    x = jnp.linspace(1.0, 2.0, 5)
    expected = np.asarray(jax.jacfwd(f)(x))
    op = aj.prepare_jacobian(f, x, local=True)
    A[:] = 3.0
    np.testing.assert_allclose(np.asarray(op(x).todense()), expected)


def test_auto_mode_takes_forward_where_jax_has_no_reverse_rule():
    """``select_and_gather_add`` has no transpose rule: JAX raises NotImplementedError (not the
    ValueError of a while loop), and "auto" chose reverse mode, which then failed."""
    pool = lambda u: lax.reduce_window(u, jnp.inf, lax.min, (1, 1, 3, 2), (1, 1, 1, 2), "SAME",  # noqa: E731
                                       window_dilation=(1, 1, 2, 1))
    f = lambda x: jax.jvp(pool, (x,), (jnp.roll(x, 1),))[1].ravel()  # noqa: E731
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 1, 5, 6)))
    J = aj.sparse_jacobian(f, x)
    np.testing.assert_allclose(np.asarray(J.todense()), np.asarray(jax.jacfwd(f)(x)).reshape(J.shape))


def test_a_checked_operator_under_jit_says_why_it_cannot_run():
    op = aj.prepare_jacobian(lambda v: jnp.sin(v) * jnp.roll(v, 1), jnp.linspace(1.0, 2.0, 5), local=True)
    with pytest.raises(asd.InputError, match="check=False"):
        jax.jit(lambda v: op(v).todense())(jnp.linspace(1.0, 2.0, 5))


def test_a_hessian_of_a_function_returning_one_scalar_in_a_tuple():
    f = lambda u: (jnp.sum(u ** 3),)  # noqa: E731
    x = jnp.linspace(1.0, 2.0, 5)
    np.testing.assert_allclose(np.asarray(aj.sparse_hessian(f, x).todense()), np.diag(6 * np.asarray(x)))
    with pytest.raises(asd.InputError, match="one element"):
        aj.prepare_hessian(lambda u: (jnp.sum(u), jnp.sum(u ** 2)), x)


def test_to_scipy_copies_the_values():
    H = aj.sparse_hessian(lambda u: jnp.sum(u ** 3), jnp.linspace(1.0, 2.0, 5))
    M = aj.to_scipy(H)
    M.data[0] = 5.0  # the docstring promises a copy: writable, and H keeps its values
    assert float(H.data[0]) == 6.0


def test_no_spurious_warnings():
    x = jnp.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # jax.grad of a cond holds JAX's `empty2` (zeros for the branch not taken)
        aj.jacobian_sparsity(jax.grad(lambda v: lax.cond(v[0] > 0, lambda u: jnp.sum(u ** 2),
                                                         lambda u: jnp.sum(u), v)), x)
        # an acyclic operator's first call screens its values (torch.from_numpy of a read-only array warned)
        f = lambda x: jnp.sum(jnp.exp(x[:-1] * x[1:])) + jnp.sum(x ** 2)  # noqa: E731
        op = aj.prepare_hessian(f, 0.3 * jnp.asarray(np.random.default_rng(0).standard_normal(40)))
        assert op.coloring.problem == "acyclic"


def test_one_call_helpers_take_numpy_float64_without_64_bit_mode():
    """With JAX's 64-bit mode off the operator is prepared for float32 (jnp.asarray(x)); the one-call
    helpers then called it with the float64 numpy array itself and raised a dtype error."""
    code = textwrap.dedent("""
        import numpy as np, jax, jax.numpy as jnp
        import asd.jax as aj
        x = np.linspace(1, 2, 5)
        f = lambda v: jnp.sin(v) * jnp.roll(v, 1)
        J = aj.sparse_jacobian(f, x)
        np.testing.assert_allclose(np.asarray(J.todense()), np.asarray(jax.jacfwd(f)(jnp.asarray(x))), rtol=1e-6)
        g = lambda v: jnp.sum(v ** 3)
        np.testing.assert_allclose(np.asarray(aj.sparse_hessian(g, x).todense()).diagonal(), 6 * x, rtol=1e-6)
        v, grad, H = aj.gradient_and_hessian(g, x)
        np.testing.assert_allclose(np.asarray(grad), 3 * x ** 2, rtol=1e-6)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                         env={**__import__("os").environ, "JAX_ENABLE_X64": "0", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
