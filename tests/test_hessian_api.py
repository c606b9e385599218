"""Sparse Hessians end to end: values against torch.func.hessian in float64, options, errors."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import asd
from asd.coloring import check
from asd.problems import rosenbrock, total_variation


def assert_hessian(H, f, x, atol=1e-9):
    assert H.layout == torch.sparse_csr and H.dtype == x.dtype
    Hd = torch.func.hessian(lambda v: f(v.reshape(x.shape)).reshape(()))(x.reshape(-1))
    torch.testing.assert_close(H.to_dense(), Hd, atol=atol, rtol=1e-9)
    Hs = H.to_dense()
    torch.testing.assert_close(Hs, Hs.T)  # both triangles stored


@pytest.mark.parametrize("coloring", ["star", "acyclic", None])
@pytest.mark.parametrize("hvp", ["forward_over_reverse", "reverse_over_forward"])
def test_rosenbrock(coloring, hvp):
    x = torch.rand(60, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, coloring=coloring, hvp=hvp)
    assert_hessian(op(x), rosenbrock, x)
    check(op.pattern, op.coloring)
    if coloring == "star":
        assert op.ncolors == 3
    x2 = torch.rand(60, dtype=torch.float64)
    assert_hessian(op(x2), rosenbrock, x2)


@pytest.mark.parametrize("coloring", ["star", "acyclic"])
def test_total_variation(coloring):
    f = total_variation(7)
    x = torch.rand(49, dtype=torch.float64)
    assert_hessian(asd.sparse_hessian(f, x, coloring=coloring), f, x)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 30), density=st.floats(0.0, 0.4), seed=st.integers(0, 2**16),
       coloring=st.sampled_from(["star", "acyclic"]))
def test_quadratic_form_with_sparse_constant(n, density, seed, coloring):
    rng = np.random.default_rng(seed)
    M = sp.random(n, n, density=density, random_state=rng, format="csr")
    Md = torch.tensor(M.toarray())
    A = Md.to_sparse_csr()

    def f(x):
        return (x * (A @ x)).sum() + torch.cos(x).sum()

    x = torch.randn(n, dtype=torch.float64)
    H = asd.sparse_hessian(f, x, coloring=coloring, cache=False)
    assert_hessian(H, lambda x: (x * (Md @ x)).sum() + torch.cos(x).sum(), x)
    # exact pattern: structure of A + A^T plus the diagonal of cos
    expected = ((Md != 0) | (Md != 0).T | torch.eye(n, dtype=torch.bool)).numpy()
    assert (asd.hessian_sparsity(f, x).toarray() == expected).all()


def test_gradient_and_hessian_one_evaluation():
    x = torch.rand(3, 8, dtype=torch.float64)

    def f(X):
        return (X[:, 1:] * X[:, :-1]).sin().sum() + (X ** 3).sum()

    v, g, H = asd.gradient_and_hessian(f, x)
    torch.testing.assert_close(v, f(x))
    torch.testing.assert_close(g, torch.func.grad(f)(x))
    assert g.shape == x.shape
    assert_hessian(H, f, x)


def test_zero_hessian_and_linear_function():
    x = torch.rand(5, dtype=torch.float64)
    H = asd.sparse_hessian(lambda v: (3 * v).sum(), x)
    assert H._nnz() == 0 and H.shape == (5, 5)
    v, g, H = asd.gradient_and_hessian(lambda v: (3 * v).sum(), x)
    torch.testing.assert_close(g, torch.full_like(x, 3.0))


def test_batch_size_and_compile():
    x = torch.rand(40, dtype=torch.float64)
    assert_hessian(asd.sparse_hessian(rosenbrock, x, coloring="star", batch_size=1, cache=False), rosenbrock, x)
    op = asd.prepare_hessian(rosenbrock, x, coloring="star", compile=True)
    assert_hessian(op(x), rosenbrock, x)


def test_cache_for_hessians():
    from asd.cache import CACHE

    x = torch.rand(10, dtype=torch.float64)
    asd.sparse_hessian(rosenbrock, x)
    asd.sparse_hessian(rosenbrock, x + 1)
    assert CACHE.hits == 1


def test_errors():
    x = torch.rand(4, dtype=torch.float64)
    with pytest.raises(asd.InputError, match="one element|scalar"):
        asd.sparse_hessian(lambda v: v * v, x)
    with pytest.raises(asd.InputError, match="coloring"):
        asd.prepare_hessian(rosenbrock, x, coloring="column")
    with pytest.raises(asd.InputError, match="hvp"):
        asd.prepare_hessian(rosenbrock, x, hvp="sideways")
    with pytest.raises(asd.InputError, match="floating-point"):
        asd.sparse_hessian(rosenbrock, torch.arange(4))
    op = asd.prepare_hessian(rosenbrock, x)
    with pytest.raises(asd.InputError, match="shape"):
        op(torch.rand(5, dtype=torch.float64))


def test_default_hvp_is_exact_where_double_backward_is_nan():
    def fn(u):
        return torch.cumprod(u[:3], 0).sum()

    x = torch.tensor([0.5, 0.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(asd.sparse_hessian(fn, x).to_dense(), torch.func.hessian(fn)(x))


def test_hessian_warmup_by_double_backward_then_the_recorded_graph(monkeypatch):
    """hvp="auto" on the CPU with few colors: double backward until the batched products are
    recorded, then the recorded graph; every call matches dense autograd."""
    from asd import operators
    from asd.backends.autograd_loop import AutogradLoop
    from asd.backends.traced import CALLS_BEFORE_TRACING
    from asd.problems import rosenbrock

    x = torch.rand(40, dtype=torch.float64)
    ref = torch.func.hessian(rosenbrock)(x)
    op = asd.prepare_hessian(rosenbrock, x, check=False)
    assert op.ncolors <= operators.LOOP_MAX_COLORS and op._warmup is not None
    ran = []
    real = AutogradLoop.compute
    monkeypatch.setattr(AutogradLoop, "compute", lambda self, *a: ran.append(1) or real(self, *a))
    for _ in range(CALLS_BEFORE_TRACING):
        torch.testing.assert_close(op(x).to_dense(), ref, rtol=1e-12, atol=1e-12)
    assert len(ran) == CALLS_BEFORE_TRACING
    tracing = op._warmup.tracing
    assert not tracing.graphs
    for _ in range(3):
        torch.testing.assert_close(op(x).to_dense(), ref, rtol=1e-12, atol=1e-12)
    assert len(ran) == CALLS_BEFORE_TRACING and tracing.graphs


@pytest.mark.parametrize("options, warm", [({}, True), (dict(coloring="acyclic"), True),
                                           (dict(hvp="forward_over_reverse"), False),
                                           (dict(hvp="reverse_over_forward"), False), (dict(compile=True), False),
                                           ("backend", False)])
def test_hessian_warmup_only_for_the_default_eager_strategy(options, warm):
    from asd.backends import ForwardOverReverseHVP
    from asd.problems import rosenbrock

    if options == "backend":
        options = dict(backend=ForwardOverReverseHVP())
    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, **options)
    assert (op._warmup is not None) == warm


def test_hessian_warmup_skipped_for_inputs_that_require_grad():
    from asd.problems import rosenbrock

    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, check=False)
    xr = x.clone().requires_grad_(True)
    op.values(xr)
    assert op._warmup.calls == 0
    op.values(x)
    assert op._warmup.calls == 1


def test_hessian_warmup_for_good_without_tracing():
    from asd.problems import rosenbrock
    from asd.backends.traced import CALLS_BEFORE_TRACING

    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, check=False, trace=False)
    for _ in range(CALLS_BEFORE_TRACING + 3):
        op.values(x)
    assert op._warmup.calls == CALLS_BEFORE_TRACING + 3
    torch.testing.assert_close(op(x).to_dense(), torch.func.hessian(rosenbrock)(x), rtol=1e-12, atol=1e-12)


def test_rebound_hessian_warms_up_its_own_function():
    x = torch.rand(6, dtype=torch.float64)
    op = asd.prepare_hessian(lambda v: (v ** 3).sum(), x, check=False)
    new = op.rebind(lambda v: (2 * v ** 3).sum())
    assert new._warmup is not op._warmup
    torch.testing.assert_close(new(x).to_dense(), torch.diag(12 * x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op(x).to_dense(), torch.diag(6 * x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("f", [lambda v: torch.linalg.vector_norm(v) ** 3, lambda v: torch.norm(v) ** 3,
                               lambda v: torch.linalg.vector_norm(v[1:] - v[:-1]) ** 4])
def test_warmup_nan_where_the_batched_products_are_finite(f):
    """Double backward of a norm at 0 is NaN; the exact Hessian there is 0, which torch.func's
    forward-over-reverse gives: such calls are evaluated by the batched products."""
    x = torch.zeros(4, dtype=torch.float64)
    op = asd.prepare_hessian(f, x, check=False)
    assert op._warmup is not None
    H = op(x).to_dense()
    assert torch.isfinite(H).all()
    torch.testing.assert_close(H, torch.func.jacfwd(torch.func.jacrev(f))(x))
    v, g, H2 = op.value_grad_hessian(x)
    assert torch.isfinite(H2.to_dense()).all()
    y = torch.rand(4, dtype=torch.float64)
    torch.testing.assert_close(op(y).to_dense(), torch.func.hessian(f)(y), rtol=1e-10, atol=1e-12)


def test_warmup_values_whose_sum_overflows_are_kept_finite():
    """The warm-up's finiteness check sums the values (in float64): finite values whose sum
    overflows send the call to the batched products, which give the same finite Hessian (a cost,
    never a wrong value)."""
    f = lambda v: 0.5e308 * (v ** 2).sum()  # noqa: E731
    x = torch.ones(3, dtype=torch.float64)
    op = asd.prepare_hessian(f, x, check=False)
    assert op._warmup is not None
    batched = []
    real = op.backend.values
    object.__setattr__(op.backend, "values", lambda *a, **k: batched.append(1) or real(*a, **k))  # frozen
    torch.testing.assert_close(op(x).to_dense(), torch.diag(torch.full((3,), 1e308, dtype=torch.float64)),
                               rtol=0, atol=0)
    assert batched  # the warm-up's values were finite, but their sum was not: the batched products ran
