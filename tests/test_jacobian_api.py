"""End-to-end sparse Jacobians: values against dense torch.func in float64, options, cache, errors."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import asd
from asd.cache import CACHE
from asd.problems import brusselator, brusselator_input, conv_layer

torch.manual_seed(0)


def dense_jacobian(f, x):
    return torch.autograd.functional.jacobian(lambda v: f(v.reshape(x.shape)).reshape(-1), x.reshape(-1))


def assert_jacobian(J, f, x, ref=None, rtol=1e-10, atol=1e-10):
    assert J.layout == torch.sparse_csr
    assert J.dtype == x.dtype and J.device == x.device
    Jd = dense_jacobian(ref or f, x)
    assert tuple(J.shape) == tuple(Jd.shape)
    torch.testing.assert_close(J.to_dense(), Jd, rtol=rtol, atol=atol)
    # every stored entry belongs to the detected pattern, and no true nonzero is outside it
    P = asd.jacobian_sparsity(f, x).toarray()
    assert not ((Jd != 0).numpy() & ~P).any()


@pytest.mark.parametrize("mode", ["forward", "reverse", "auto"])
def test_brusselator_modes(mode):
    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x, mode=mode)
    assert_jacobian(op(x), f, x)
    assert op.ncolors <= 12
    if mode != "auto":
        assert op.mode == mode
    x2 = brusselator_input(8, seed=3)
    assert_jacobian(op(x2), f, x2)


def test_bidirectional_arrowhead():
    # a dense first row and column: column or row coloring alone needs n colors
    def f(x):
        y = x * x
        y = torch.cat([x.sum(0, keepdim=True), y[1:] + x[0] * x[1:]])
        return y

    x = torch.randn(40, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, coloring="bidirectional")
    assert op.mode == "bidirectional"
    assert op.ncolors < 10
    assert_jacobian(op(x), f, x)
    assert asd.prepare_jacobian(f, x, mode="forward").ncolors == 40


@pytest.mark.parametrize("order", ["natural", "largest_first", "smallest_last", "incidence_degree", "random"])
def test_orders_give_exact_values(order):
    f, x = brusselator(6), brusselator_input(6)
    assert_jacobian(asd.sparse_jacobian(f, x, mode="forward", order=order), f, x)


@pytest.mark.parametrize("batch_size", [1, 3, 100])
def test_batch_size_chunks(batch_size):
    f, x = brusselator(5), brusselator_input(5)
    assert_jacobian(asd.sparse_jacobian(f, x, batch_size=batch_size, cache=False), f, x)


def test_conv_layer_b2a():
    f, x = conv_layer("a")
    J = asd.sparse_jacobian(f, x)
    assert J.shape == (576, 784)
    assert_jacobian(J, f, x)


@pytest.mark.parametrize("layout", ["csr", "coo"])
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_sparse_constant_operator(layout, mode):
    n = 30
    L = sp.diags([1.0, -2.0, 1.0], [-1, 0, 1], shape=(n, n), format="csr")
    Ld = torch.tensor(L.toarray())
    A = Ld.to_sparse_csr() if layout == "csr" else Ld.to_sparse_coo()

    def f(u):
        return A @ u + torch.sin(u) * u.roll(1)

    def ref(u):
        return Ld @ u + torch.sin(u) * u.roll(1)

    u = torch.randn(n, dtype=torch.float64)
    J = asd.sparse_jacobian(f, u, mode=mode)
    assert_jacobian(J, f, u, ref=ref)
    assert J._nnz() == 3 * n - 1  # tridiagonal plus the periodic corner entry of roll


def test_sparse_constant_matrix_rhs():
    n = 12
    Ld = torch.tensor(sp.random(n, n, density=0.2, random_state=1).toarray() + np.eye(n))
    A = Ld.to_sparse_csr()

    def f(U):
        return (A @ U).tanh()

    U = torch.randn(n, 3, dtype=torch.float64)
    assert_jacobian(asd.sparse_jacobian(f, U, mode="forward"), f, U, ref=lambda U: (Ld @ U).tanh())
    assert_jacobian(asd.sparse_jacobian(f, U, mode="reverse"), f, U, ref=lambda U: (Ld @ U).tanh())


def test_inplace_residual_in_buffer():
    def residual(u):
        r = torch.zeros_like(u)
        r[1:-1] = u[2:] - 2 * u[1:-1] + u[:-2] + u[1:-1] ** 3
        r[0] = u[0] - 1
        r[-1] += u[-1] * u[-2]
        return r

    u = torch.randn(50, dtype=torch.float64)
    J = asd.sparse_jacobian(residual, u)
    assert_jacobian(J, residual, u)
    assert J._nnz() == 3 * 48 + 1 + 2


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 25), n=st.integers(1, 25), density=st.floats(0.0, 0.5), seed=st.integers(0, 2**16),
       mode=st.sampled_from(["forward", "reverse", "auto"]))
def test_random_sparse_structures(m, n, density, seed, mode):
    rng = np.random.default_rng(seed)
    M = sp.random(m, n, density=density, random_state=rng, format="csr")
    Md = torch.tensor(M.toarray())
    A = Md.to_sparse_csr()

    def f(x):
        return torch.exp(A @ x) * (A @ (x * x))

    x = torch.randn(n, dtype=torch.float64)
    J = asd.sparse_jacobian(f, x, mode=mode, cache=False)
    assert_jacobian(J, f, x, ref=lambda x: torch.exp(Md @ x) * (Md @ (x * x)))


def test_float32_and_shapes():
    def f(X):
        return (X[:, 1:] * X[:, :-1]).exp()

    X = torch.randn(4, 5, dtype=torch.float32)
    J = asd.sparse_jacobian(f, X)
    assert J.dtype == torch.float32
    torch.testing.assert_close(J.to_dense(), dense_jacobian(f, X))


def test_values_and_to_scipy():
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x)
    S = asd.to_scipy(op(x))
    assert isinstance(S, sp.csr_array)
    np.testing.assert_allclose(S.toarray(), dense_jacobian(f, x).numpy(), atol=1e-9)
    np.testing.assert_allclose(op.values(x).numpy(), S.data)
    assert (op.pattern.indptr == S.indptr).all() and (op.pattern.indices == S.indices).all()


def test_pattern_option_skips_detection(monkeypatch):
    import asd.detection
    from asd.patterns import as_pattern

    f, x = brusselator(4), brusselator_input(4)
    P = asd.jacobian_sparsity(f, x)

    def no_detection(*args, **kwargs):
        raise AssertionError("a given pattern is not detected again")

    monkeypatch.setattr(asd.detection, "jacobian_pattern", no_detection)
    op = asd.prepare_jacobian(f, x, pattern=P)
    given = as_pattern(P)
    assert np.array_equal(op.pattern.indptr, given.indptr) and np.array_equal(op.pattern.indices, given.indices)
    assert_jacobian(op(x), f, x)


def test_cache_hits_and_clear():
    f, x = brusselator(4), brusselator_input(4)
    asd.sparse_jacobian(f, x)
    misses = CACHE.misses
    asd.sparse_jacobian(f, brusselator_input(4, seed=1))
    assert CACHE.misses == misses and CACHE.hits >= 1
    asd.sparse_jacobian(f, brusselator_input(4).float())  # another dtype: another entry
    assert CACHE.misses == misses + 1
    asd.clear_cache()
    assert len(CACHE) == 0
    asd.sparse_jacobian(f, x, local=True)  # local patterns hold at one point: never cached
    assert len(CACHE) == 0


def test_local_pattern_is_sparser_and_exact_at_point():
    def f(x):
        return torch.relu(x) * x.roll(1)

    x = torch.tensor([1.0, -1.0, 2.0, -3.0], dtype=torch.float64)
    Jg = asd.jacobian_sparsity(f, x)
    Jl = asd.jacobian_sparsity(f, x, local=True)
    assert Jl.nnz < Jg.nnz
    assert_jacobian(asd.sparse_jacobian(f, x, local=True), f, x)


def test_compile_fallback_is_clean(monkeypatch):
    def broken_compile(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("compiler exploded")
        return run

    def broken_inductor(*a, **k):
        raise RuntimeError("compiler exploded")

    from asd.backends import compile_cache

    monkeypatch.setattr(torch, "compile", broken_compile)  # the transforms' compile
    monkeypatch.setattr(compile_cache, "compile_graph", broken_inductor)  # the recorded graph's
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True)
    # the recorded graph's compilation failed: the plain transforms, not torch.compile of them
    with pytest.warns(RuntimeWarning, match="not compiled"):
        J = op(x)
    assert_jacobian(J, f, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op(x)  # falls back once, then stays eager silently


def test_a_function_that_cannot_be_recorded_is_compiled_by_torch_compile(monkeypatch):
    """Where the products cannot be recorded as a graph, compile=True compiles the transforms
    with torch.compile; a failing torch.compile falls back to eager evaluation with a warning."""
    from asd.backends import traced

    compiled = []

    def broken_compile(fn, **kw):
        compiled.append(fn)

        def run(*a, **k):
            raise RuntimeError("compiler exploded")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(traced.Tracing, "_record", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("not recordable")))
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True)
    assert_jacobian(op(x), f, x)  # a recording that raised is tried once more (f's error may have passed)
    assert op.state.fused.tracing.record_failures == 1 and not compiled
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        J = op(x)
    assert_jacobian(J, f, x)
    assert compiled and op.state.fused.tracing.compile_refused is None


def test_compile_real():
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True, mode="forward")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compile fallback warns
        assert_jacobian(op(x), f, x)
    assert op.state.fused.compile_failed is None


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("x, msg", [
    (torch.arange(4), "floating-point"),
    (torch.randn(4, dtype=torch.complex128), "complex"),
    ([1.0, 2.0], "torch.Tensor"),
])
def test_bad_input_dtype(x, msg):
    with pytest.raises(asd.InputError, match=msg):
        asd.sparse_jacobian(lambda v: v * 2, x)


def test_function_returning_non_tensor():
    with pytest.raises(asd.InputError, match="returned tuple"):
        asd.sparse_jacobian(lambda v: (v, v), torch.randn(3))


def test_function_returning_integers():
    with pytest.raises(asd.InputError, match="dtype torch.int64"):
        asd.sparse_jacobian(lambda v: (v > 0).long(), torch.randn(3))


def test_shape_dtype_device_change_after_prepare():
    op = asd.prepare_jacobian(lambda v: v.sin(), torch.randn(5, dtype=torch.float64))
    with pytest.raises(asd.InputError, match="shape"):
        op(torch.randn(6, dtype=torch.float64))
    with pytest.raises(asd.InputError, match="dtype"):
        op(torch.randn(5, dtype=torch.float32))
    with pytest.raises(asd.InputError, match="torch.Tensor"):
        op([0.0] * 5)
    # a numpy array is converted (issue 16: SciPy's callbacks pass them; see test_scipy_interop)
    torch.testing.assert_close(op(np.zeros(5)).to_dense(), torch.eye(5, dtype=torch.float64))


def test_bad_options():
    x = torch.randn(3)
    with pytest.raises(asd.InputError, match="mode"):
        asd.prepare_jacobian(torch.sin, x, mode="sideways")
    with pytest.raises(asd.InputError, match="coloring"):
        asd.prepare_jacobian(torch.sin, x, coloring="star")
    with pytest.raises(asd.InputError, match="batch_size"):
        asd.prepare_jacobian(torch.sin, x, batch_size=0)


def test_control_flow_under_global_tracing_says_local():
    def f(x):
        return x if x.sum() > 0 else -x

    with pytest.raises(asd.TracingError, match="local=True"):
        asd.sparse_jacobian(f, torch.randn(3))
    J = asd.sparse_jacobian(f, torch.ones(3), local=True)
    torch.testing.assert_close(J.to_dense(), torch.eye(3))


def test_import_is_light():
    code = "import asd, sys; print('numba' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_sparse_constant_built_inside_f_falls_back_to_plain_autograd():
    M = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 1.0]], dtype=torch.float64)

    def f(x):
        return M.clone().to_sparse_csr() @ x.sin()

    x = torch.randn(3, dtype=torch.float64)
    assert (asd.jacobian_sparsity(f, x).toarray() == (M != 0).numpy()).all()
    op = asd.prepare_jacobian(f, x)
    with pytest.warns(RuntimeWarning, match="cannot evaluate this function"):
        J = op(x)
    assert op.strategy == "autograd loop" and "sparse" in op.fallback_reason
    torch.testing.assert_close(J.to_dense(), M * torch.cos(x))


def test_sparse_tensor_computed_from_input_is_refused():
    def f(x):
        return torch.diag(x).to_sparse_csr() @ x

    with pytest.raises(asd.TracingError, match="computed from the input cannot be traced"):
        asd.jacobian_sparsity(f, torch.randn(3, dtype=torch.float64))


def test_inplace_shape_changes_and_vector_matrix_products():
    W = torch.randn(10, 5, dtype=torch.float64)
    x = torch.randn(10, dtype=torch.float64)
    assert_jacobian(asd.sparse_jacobian(lambda v: (v @ W).sin(), x), lambda v: (v @ W).sin(), x)

    def g(X):
        Y = X.clone()
        Y.t_()
        Y.unsqueeze_(0)
        Y.squeeze_(0)
        Y.transpose_(0, 1)
        Z = Y[1:]
        Z.t_()  # an in-place transpose of a view
        return (Y * X).sum(1).repeat(3) + (Z.sum(1) ** 2).sum()

    X = torch.randn(3, 4, dtype=torch.float64)
    assert_jacobian(asd.sparse_jacobian(g, X), g, X)
    Jd = dense_jacobian(g, X) != 0
    assert (asd.jacobian_sparsity(g, X).toarray() == Jd.numpy()).all()


def test_verify_is_exported():
    f, x = brusselator(4), brusselator_input(4)
    report = asd.verify(f, x)
    assert report.ok and report.precision == 1.0


def test_sparse_constant_values_changed_in_place():
    D = torch.diag(torch.ones(6, dtype=torch.float64) * 2) + torch.diag(torch.ones(5, dtype=torch.float64), 1)
    for A in (D.to_sparse_csr(), D.to_sparse_coo()):
        def f(u):
            return A @ (u * u)

        x = torch.randn(6, dtype=torch.float64)
        op = asd.prepare_jacobian(f, x, mode="reverse")
        op(x)
        with torch.no_grad():
            (A.values() if A.layout == torch.sparse_csr else A._values()).mul_(3)
        torch.testing.assert_close(op(x).to_dense(), dense_jacobian(lambda u: (3 * D) @ (u * u), x))
        H = asd.sparse_hessian(lambda u: (u * (A @ u)).sum(), x, cache=False)
        torch.testing.assert_close(H.to_dense(), 3 * D + 3 * D.T)


def test_shape_error_in_f_is_reported_as_such():
    with pytest.raises(RuntimeError, match="reduction dim|shape"):
        asd.jacobian_sparsity(lambda x: x @ torch.rand(7, 7, dtype=torch.float64), torch.rand(5, dtype=torch.float64))


def test_pattern_with_wrong_rows_is_refused():
    with pytest.raises(asd.InputError, match="3 rows but f\\(x\\) has 5"):
        asd.sparse_jacobian(lambda x: x * 2, torch.rand(5, dtype=torch.float64), pattern=np.eye(3, 5))


def test_overwriting_writes_with_duplicate_targets_credit_every_write():
    def f(x):
        y = x.clone()
        y[torch.tensor([0, 0, 2])] = x[3:]
        return y

    x = torch.randn(6, dtype=torch.float64)
    P = asd.jacobian_sparsity(f, x).toarray()
    assert not ((torch.func.jacrev(f)(x) != 0).numpy() & ~P).any()
    assert not ((torch.func.jacfwd(f)(x) != 0).numpy() & ~P).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_half_precision_inputs(dtype):
    x = torch.rand(5, dtype=dtype)

    def f(v):
        return v * v + v.roll(1)

    J = asd.sparse_jacobian(f, x)
    assert J.dtype == dtype
    ref = torch.autograd.functional.jacobian(f, x.double()).to(dtype)
    torch.testing.assert_close(J.to_dense(), ref)


def test_zero_dimensional_and_empty_inputs():
    x0 = torch.tensor(0.7, dtype=torch.float64)
    J = asd.sparse_jacobian(lambda v: torch.stack([v.sin(), v * v]), x0)
    torch.testing.assert_close(J.to_dense(), torch.tensor([[torch.cos(x0).item()], [1.4]], dtype=torch.float64))
    H = asd.sparse_hessian(lambda v: v.sin() * v, x0)
    torch.testing.assert_close(H.to_dense().reshape(()), torch.func.hessian(lambda v: v.sin() * v)(x0))
    xe = torch.zeros(0, dtype=torch.float64)
    assert asd.sparse_jacobian(lambda v: v * 2, xe).shape == (0, 0)
    assert asd.sparse_jacobian(lambda v: torch.cat([v, torch.ones(2, dtype=v.dtype)]), xe).shape == (2, 0)


def test_pattern_to_scipy_gives_fresh_arrays_of_the_smallest_index_dtype():
    """``to_scipy`` (what ``jacobian_sparsity`` returns) hands scipy ``int32`` index arrays where
    they fit, ``int64`` where the shape does not; the arrays are fresh and writable."""
    from asd.patterns import SparsityPattern

    P = SparsityPattern.from_coo([0, 2, 2], [1, 0, 3], (3, 4))
    A = P.to_scipy()
    assert A.indices.dtype == np.int32 and A.indptr.dtype == np.int32
    np.testing.assert_array_equal(A.toarray(), P.toarray())
    A.indices[0] = 2  # writable, and not the pattern's own
    assert P.indices[0] == 1
    wide = SparsityPattern.from_coo([0], [2**31 + 3], (1, 2**31 + 5))
    B = wide.to_scipy()
    assert B.indices.dtype == np.int64 and B.indices.tolist() == [2**31 + 3]
