"""Defects found in session 32's reviews, each with the example that showed it."""

import warnings

import numpy as np
import pytest
import torch

import asd


# -- sparse constants built inside f with PyTorch's invariant check ----------------------------------

def _checked_constants(t, layout):
    n = t.numel()
    i = torch.arange(n)
    vals = torch.linspace(1.0, 2.0, n, dtype=t.dtype)
    if layout == "coo":
        A = torch.sparse_coo_tensor(torch.stack([i, (i + 1) % n]), vals, (n, n), check_invariants=True)
    else:
        A = torch.sparse_csr_tensor(torch.arange(n + 1), (i + 2) % n, vals, (n, n), check_invariants=True)
    return torch.sparse.mm(A, t.unsqueeze(1)).squeeze(1)


@pytest.mark.filterwarnings("ignore:Sparse")
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("local", [False, True])
def test_a_sparse_constant_checked_inside_f_is_traced(layout, local):
    """PyTorch's check reads the indices' memory, which a traced tensor has none of: detection used
    to crash ('data is not allocated yet')."""
    x = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    f = lambda t: torch.sin(_checked_constants(t, layout)) * t  # noqa: E731
    D = torch.autograd.functional.jacobian(f, x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        P = asd.jacobian_sparsity(f, x, local=local).toarray()
    assert not [w for w in seen if "is_pinned" in str(w.message)]  # the check's query has its rule
    assert not ((D != 0).numpy() & ~P).any()
    assert P.sum() == 12  # exact: the diagonal and one shifted diagonal
    torch.testing.assert_close(asd.sparse_jacobian(f, x, local=local).to_dense(), D)
    h = lambda t: (_checked_constants(t, layout) ** 2 * t).sum()  # noqa: E731
    torch.testing.assert_close(asd.sparse_hessian(h, x, local=local).to_dense(),
                               torch.autograd.functional.hessian(h, x))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("local", [False, True])
def test_a_checked_sparse_constant_with_bad_indices_still_raises_pytorchs_error(local):
    x = torch.rand(4, dtype=torch.float64)

    def f(t):
        i = torch.tensor([[0, 7], [0, 1]])
        return torch.sparse.mm(torch.sparse_coo_tensor(i, torch.ones(2, dtype=t.dtype), (4, 4), check_invariants=True),
                               t.unsqueeze(1))

    with pytest.raises(RuntimeError, match="inconsistent with indices"):
        asd.jacobian_sparsity(f, x, local=local)
    g = lambda t: torch.sparse.mm(torch.sparse_coo_tensor(  # noqa: E731
        torch.tensor([[0, 7], [0, 1]]), torch.ones(2, dtype=t.dtype), (4, 4)), t.unsqueeze(1))
    with torch.sparse.check_sparse_tensor_invariants(), pytest.raises(RuntimeError, match="inconsistent with indices"):
        asd.jacobian_sparsity(g, x, local=local)


# -- integer options given as numpy integers ---------------------------------------------------------

@pytest.mark.parametrize("batch_size", [np.int64(2), np.int32(3)])
def test_a_numpy_integer_batch_size_is_an_integer(batch_size):
    x = torch.rand(9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    f = lambda z: z[1:] * z[:-1] ** 2  # noqa: E731
    op = asd.prepare_jacobian(f, x, batch_size=batch_size)
    assert type(op.batch_size) is int and op.batch_size == int(batch_size)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    h = lambda z: (z[1:] * z[:-1] ** 2).sum()  # noqa: E731
    torch.testing.assert_close(asd.sparse_hessian(h, x, batch_size=batch_size).to_dense(), torch.func.hessian(h)(x))
    for bad in (np.int64(0), np.float64(2.0), np.bool_(True)):
        with pytest.raises(asd.InputError, match="batch_size"):
            asd.prepare_jacobian(f, x, batch_size=bad)


def test_jax_numpy_integer_batch_size_and_verify_of_a_custom_vjp_function():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import asd.jax as aj

    x = jnp.linspace(0.5, 1.5, 8, dtype=jnp.float32)
    h = lambda z: jnp.sum(z[1:] * z[:-1] ** 2)  # noqa: E731
    H = aj.sparse_hessian(h, x, batch_size=np.int64(2))
    np.testing.assert_allclose(np.asarray(H.todense()), np.asarray(jax.hessian(h)(x)), rtol=1e-5)

    @jax.custom_vjp
    def g(z):
        return jnp.sin(z)

    g.defvjp(lambda z: (jnp.sin(z), z), lambda z, c: (jnp.cos(z) * c,))
    report = aj.verify(lambda z: g(z) * z[::-1], x)  # jax.jacfwd raised TypeError here
    assert report.ok
    missing = aj.verify(lambda z: g(z) * z[::-1], x, pattern=aj.jacobian_sparsity(lambda z: g(z), x))
    assert not missing.ok
