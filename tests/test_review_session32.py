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


# -- gradients with respect to f's parameters through eager warm-up products -------------------------

def _param_problem():
    gen = torch.Generator().manual_seed(4)
    p = torch.rand(11, dtype=torch.float64, generator=gen).requires_grad_(True)
    x = torch.rand(12, dtype=torch.float64, generator=gen)
    F = lambda z: p * z[1:] * torch.sin(z[:-1])  # noqa: E731
    h = lambda z: (p * torch.sin(z[:-1]) * z[1:] ** 2).sum() + (z ** 3).sum()  # noqa: E731
    return p, x, F, h


def _grad_of(M, p):
    weights = torch.linspace(1.0, 2.0, M.numel(), dtype=M.dtype).reshape(M.shape)
    (g,) = torch.autograd.grad((M ** 2 * weights).sum(), p)
    return g


@pytest.mark.parametrize("kind,options", [
    ("jacobian", dict(mode="forward", backend="loop")), ("jacobian", dict(mode="reverse", backend="loop")),
    ("hessian", dict(backend="loop")), ("hessian", {}), ("hessian", dict(coloring="acyclic")),
    ("hessian", dict(local=True)), ("hessian", dict(pattern="detected")),
])
def test_values_record_the_gradient_of_fs_parameters_from_the_first_call(kind, options):
    """Few-color Hessians (and every operator in a process where torch.func is cold) evaluate with
    plain autograd first: its products came without the parameters' gradient, so a loss on the
    returned values had a silently wrong gradient (``local=True`` and ``pattern=`` on every call)."""
    from asd.backends.autograd_loop import AutogradLoop

    p, x, F, h = _param_problem()
    f = F if kind == "jacobian" else h
    ref = torch.func.jacrev(F)(x) if kind == "jacobian" else torch.func.hessian(h)(x)
    options = dict(options)
    if options.get("backend") == "loop":
        options["backend"] = AutogradLoop()
    if options.get("pattern") == "detected":
        options["pattern"] = (asd.jacobian_sparsity if kind == "jacobian" else asd.hessian_sparsity)(f, x)
    prepare = asd.prepare_jacobian if kind == "jacobian" else asd.prepare_hessian
    op = prepare(f, x, **options)
    expected = _grad_of(ref, p)
    for _ in range(3):
        M = op(x).to_dense()
        torch.testing.assert_close(M.detach(), ref.detach())
        assert M.requires_grad
        torch.testing.assert_close(_grad_of(M, p), expected)
    with torch.no_grad():
        assert not op(x).values().requires_grad


def test_one_off_hessians_record_the_gradient_of_fs_parameters():
    p, x, _, h = _param_problem()
    expected = _grad_of(torch.func.hessian(h)(x), p)
    torch.testing.assert_close(_grad_of(asd.sparse_hessian(h, x).to_dense(), p), expected)
    _, _, H = asd.gradient_and_hessian(h, x)
    torch.testing.assert_close(_grad_of(H.to_dense(), p), expected)


# -- writes through complex views --------------------------------------------------------------------

def _component_writes():
    def imag_zeroed(x):
        z = torch.view_as_complex(x.reshape(-1, 2)) ** 2
        z.imag.zero_()
        return z.abs()

    def pair_slot_set(x):
        z = torch.view_as_complex(x.reshape(-1, 2)) ** 2
        torch.view_as_real(z)[:, 1] = 0.0
        return z.abs()

    def imag_copied(x):
        z = torch.view_as_complex(x.reshape(-1, 2)) ** 2
        z.imag.copy_(x[::2].flip(0))
        return z.abs()

    def real_assigned(x):
        z = torch.view_as_complex(x.reshape(-1, 2)) ** 2
        z.real = x[::2] ** 3
        return torch.view_as_real(z).reshape(-1)

    def rotated_through_complex_view(x):
        y = x.clone()
        torch.view_as_complex(y.reshape(-1, 2)).mul_(1j)
        return y * x.flip(0)

    def nested_complex_views(x):  # the review: a write reached one level of complex views only
        y = x.clone()
        zc = torch.view_as_complex(y.reshape(-1, 2))
        torch.view_as_complex(torch.view_as_real(zc)).mul_(x[0])
        return y * x.flip(0)

    return [imag_zeroed, pair_slot_set, imag_copied, real_assigned, rotated_through_complex_view,
            nested_complex_views]


@pytest.mark.parametrize("f", _component_writes(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("local", [False, True])
def test_writes_through_complex_views_keep_every_dependency(f, local):
    """A write into one component (``z.imag``, a slot of ``view_as_real``) replaced the sets of the
    whole complex element, and a write through ``view_as_complex`` did not reach the real tensor:
    silently wrong Jacobians and a non-symmetric Hessian."""
    x = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    D = torch.func.jacrev(f)(x)
    P = asd.jacobian_sparsity(f, x, local=local).toarray()
    assert not ((D != 0).numpy() & ~P).any()
    torch.testing.assert_close(asd.sparse_jacobian(f, x, local=local).to_dense(), D)
    h = lambda z: (f(z) ** 2).sum()  # noqa: E731
    torch.testing.assert_close(asd.sparse_hessian(h, x, local=local).to_dense(), torch.func.hessian(h)(x))


def test_a_write_into_a_real_tensor_behind_a_live_complex_view_is_refused():
    def f(x):
        y = x.clone()
        z = torch.view_as_complex(y.reshape(-1, 2))
        y.mul_(x.flip(0))
        return torch.view_as_real(z * 2).reshape(-1)

    x = torch.randn(6, dtype=torch.float64)
    for local in (False, True):
        with pytest.raises(asd.TracingError, match="view_as_complex"):
            asd.jacobian_sparsity(f, x, local=local)


# -- a forked child -----------------------------------------------------------------------------------

def _in_forked_child(target, timeout=60):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=lambda: q.put(target()))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError("the forked child hung")
    assert p.exitcode == 0
    return q.get(timeout=5)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_evaluates_is_not_blocked():
    """A fork while another thread held the evaluation lock (or prepared a cached operator) gave
    the child that lock held by a thread it does not have: every asd call there waited forever."""
    import threading

    from asd import operators as O
    from asd.cache import CACHE

    f = lambda z: z[1:] * torch.sin(z[:-1])  # noqa: E731
    x = torch.rand(40, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    op = asd.prepare_jacobian(f, x)
    held, release = threading.Event(), threading.Event()

    def hold():
        with O.EVAL_LOCK:
            CACHE.get_or_create(("session32", "in flight"), f, lambda: (held.set(), release.wait(60))[0])

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(30)
    try:
        def child():
            J = op(x).to_dense()
            K = asd.sparse_jacobian(f, x).to_dense()
            fresh, hit = CACHE.get_or_create(("session32", "in flight"), f, lambda: "made in the child")
            return float((J - torch.func.jacrev(f)(x)).abs().max()), float((K - J).abs().max()), fresh

        err, diff, fresh = _in_forked_child(child)
    finally:
        release.set()
        t.join(30)
    assert err == 0.0 and diff == 0.0 and fresh == "made in the child"


# -- colorings built from given colors ----------------------------------------------------------------

@pytest.mark.parametrize("problem,colors,match", [
    ("column", [0, 0, 0], "same color"), ("column", [-1, 0, 1], "neutral"), ("row", [0, 0, 0], "same color"),
    ("column", [0.5, 1.5, 2.7], "integers"), ("column", [0, 1], "1-D array of 3"),
    ("column", [0, 1, 2, 3, 4], "1-D array of 3"), ("star", [0, 1, 2], "1-D array of 4"),
    ("star", [0, 1, 0, 1], "recoverable"), ("bidirectional", ([0, 0, 0], [0, 0, 0]), "recoverable"),
    ("bidirectional", [0, 0, 0], "pair"), ("column", [0.0, 1e30, 2.0], "2\\*\\*53"),
    ("column", np.array([0, 2 ** 63 + 5, 1], dtype=np.uint64), "2\\*\\*53"),
])
def test_colors_that_admit_no_decompression_are_refused(problem, colors, match):
    """from_colors only built the acyclic plan: column, row, star and bidirectional colors that do
    not decompress were accepted and decompressed silently wrong (an entry 0, a sum of entries)."""
    from asd.coloring.build import from_colors

    A = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 1]], bool)
    path = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]], bool)
    with pytest.raises(asd.ColoringError, match=match):
        from_colors(path if problem == "star" else A, problem, colors)
    good = from_colors(A, "column", np.array([0.0, 1.0, 2.0]))  # integral floats are integers
    assert good.ncolors == 3
    assert from_colors(A, "bidirectional", np.array([[0, 1, 2], [-1, -1, -1]])).ncolors == 3  # a (2, n) array


# -- patterns given as torch tensors, and inputs the operators refuse ---------------------------------

@pytest.mark.parametrize("layout", ["strided", "bool", "coo", "csr", "csc", "bsr", "bsc"])
def test_a_torch_pattern_of_any_layout_is_taken(layout):
    """A torch pattern was refused with advice (asd.to_scipy) that refused CSC, BSR and dense ones."""
    dense = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    P = {"strided": dense, "bool": dense.bool(), "coo": dense.to_sparse(), "csr": dense.to_sparse_csr(),
         "csc": dense.to_sparse_csc(), "bsr": dense.to_sparse_bsr((1, 1)), "bsc": dense.to_sparse_bsc((1, 1))}[layout]
    x = torch.rand(3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    f = lambda z: torch.stack([z[0] * z[2], z[2] ** 2])  # noqa: E731
    J = asd.sparse_jacobian(f, x, pattern=P)
    torch.testing.assert_close(J.to_dense(), torch.func.jacrev(f)(x))
    assert asd.patterns.as_pattern(P).nnz == 3


def test_a_complex_numpy_input_to_an_operator_says_complex():
    x = torch.rand(4, dtype=torch.float64)
    op = asd.prepare_jacobian(lambda z: z * z.roll(1), x)
    with pytest.raises(asd.InputError, match="complex numpy array"):
        op(np.ones(4, dtype=complex))


# -- lazily conjugated tensors -----------------------------------------------------------------------

def _lazy_conjugates():
    Z = lambda x: torch.view_as_complex(x.reshape(-1, 2))  # noqa: E731

    def conj_dropped_before_a_write(x):
        z = Z(x) * 1
        s = torch.relu(z.conj().imag)  # the conjugate view is gone before the write
        z.mul_(x[0])
        return torch.view_as_real(z).reshape(-1) * s.repeat_interleave(2)

    return {"conj_imag": lambda x: Z(x).conj().imag, "real_of_conj": lambda x: torch.real(torch.conj(Z(x))) ** 2,
            "mH_real": lambda x: (Z(x).reshape(2, 2).mH.real * 2).reshape(-1),
            "adjoint_imag": lambda x: Z(x).reshape(2, 2).adjoint().imag.reshape(-1),
            "ihfft_real": lambda x: torch.fft.ihfft(x).real, "resolved": lambda x: Z(x).conj().resolve_conj().imag,
            "relu_of_conj_imag": lambda x: torch.relu(Z(x).conj().imag) * x[1::2],
            "conj_dropped_before_a_write": conj_dropped_before_a_write}


@pytest.mark.parametrize("name", list(_lazy_conjugates()))
@pytest.mark.parametrize("local", [False, True])
def test_lazily_conjugated_tensors_are_traced(name, local):
    """A conj() view kept PyTorch's lazy conjugate bit on the primal, which view_as_real (.real,
    .imag) refuses: detection raised, under global tracing with advice (local=True) that failed too."""
    f = _lazy_conjugates()[name]
    x = torch.tensor([0.3, -0.5, 0.7, 0.2, -0.4, -0.9, 0.1, 0.6], dtype=torch.float64)
    D = torch.func.jacrev(f)(x)
    P = asd.jacobian_sparsity(f, x, local=local).toarray()
    assert not ((D != 0).numpy() & ~P).any()
    torch.testing.assert_close(asd.sparse_jacobian(f, x, local=local).to_dense(), D)
    h = lambda z: (f(z) ** 2).sum()  # noqa: E731
    # torch.func.hessian itself has no batching rule for the conjugate's _neg_view: plain autograd
    torch.testing.assert_close(asd.sparse_hessian(h, x, local=local).to_dense(),
                               torch.autograd.functional.hessian(h, x))


# -- substitution's rounding --------------------------------------------------------------------------

def _coupled_chain(big, n=120):
    w = 1 + torch.rand(n - 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w[0] = big
    return lambda x: (w * x[:-1] * x[1:]).sum() + (x ** 2).sum()  # noqa: E731


def _worst_relative_error(H, ref):
    return float(((H - ref).abs() / ref.abs().clamp_min(1e-300))[ref != 0].max())


def test_substitution_that_loses_digits_is_replaced_by_direct_decompression():
    """One large coupling at the head of a chain: acyclic substitution (the float64 default) solved
    every later entry through it and lost the digits of the ratio (4e-2 relative at 1e15), while the
    probe passed. The operator now bounds the rounding, warns and colors again with star."""
    x = torch.rand(120, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for big in (1e12, 1e15):
        f = _coupled_chain(big)
        ref = torch.func.hessian(f)(x)
        op = asd.prepare_hessian(f, x)
        assert op.coloring.problem == "acyclic"
        with pytest.warns(asd.PrecisionWarning, match="star"):
            H = op(x).to_dense()
        assert op.coloring.problem == "star" and _worst_relative_error(H, ref) < 1e-13
        torch.testing.assert_close(op(x * 2).to_dense(), torch.func.hessian(f)(x * 2))
        with pytest.warns(asd.PrecisionWarning):
            H = asd.sparse_hessian(f, x, cache=False).to_dense()
        assert _worst_relative_error(H, ref) < 1e-13
        with pytest.warns(asd.PrecisionWarning):
            _, _, H = asd.gradient_and_hessian(f, x, cache=False)
        assert _worst_relative_error(H.to_dense(), ref) < 1e-13
        explicit = asd.prepare_hessian(f, x, coloring="acyclic")  # the user's choice is kept, with the warning
        with pytest.warns(asd.PrecisionWarning, match="coloring='star'"):
            explicit(x)
        assert explicit.coloring.problem == "acyclic"


def test_a_cached_one_off_is_bounded_at_every_call():
    """The one-off cache served an operator screened at another function's point."""
    x = torch.rand(120, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    asd.clear_cache()
    for big in (1.0, 1e15):
        f = _coupled_chain(big)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            H = asd.sparse_hessian(f, x).to_dense()
        assert _worst_relative_error(H, torch.func.hessian(f)(x)) < 1e-10


@pytest.mark.filterwarnings("error::asd.PrecisionWarning")
def test_well_scaled_substitution_keeps_the_acyclic_coloring():
    from asd.problems import rosenbrock

    x = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    op = asd.prepare_hessian(rosenbrock, x)
    op(x)
    assert op.coloring.problem == "acyclic" and op.ncolors == 2
    f = _coupled_chain(1e6)
    op = asd.prepare_hessian(f, torch.rand(120, dtype=torch.float64))
    op(torch.rand(120, dtype=torch.float64))
    assert op.coloring.problem == "acyclic"
    unchecked = asd.prepare_hessian(_coupled_chain(1e15), torch.rand(120, dtype=torch.float64), check=False)
    unchecked(torch.rand(120, dtype=torch.float64))  # check=False: no bound, no warning


def _jax_coupled_chain():
    """``(jax, asd.jax, f, x)``: the coupled chain of the torch tests, in JAX (float64)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)  # as the other JAX test modules do at import
    jnp = jax.numpy
    import asd.jax as aj

    w = 1 + np.random.default_rng(0).random(119)
    w[0] = 1e15
    return jax, aj, (lambda z: jnp.sum(w * z[:-1] * z[1:]) + jnp.sum(z ** 2)), jnp.asarray(np.random.default_rng(1).random(120))


def test_jax_substitution_that_loses_digits_is_replaced_by_direct_decompression():
    jax, aj, f, x = _jax_coupled_chain()
    ref = np.asarray(jax.hessian(f)(x))

    def err(H):
        D = np.asarray(H.todense())
        return float((np.abs(D - ref) / np.maximum(np.abs(ref), 1e-300))[ref != 0].max())

    op = aj.prepare_hessian(f, x)
    assert op.coloring.problem == "acyclic"
    with pytest.warns(asd.PrecisionWarning, match="star"):
        assert err(op(x)) < 1e-13
    assert op.coloring.problem == "star"
    with pytest.warns(asd.PrecisionWarning):
        assert err(aj.gradient_and_hessian(f, x)[2]) < 1e-13
    kept = aj.prepare_hessian(f, x, coloring="acyclic")
    with pytest.warns(asd.PrecisionWarning, match="coloring='star'"):
        kept(x)
    assert kept.coloring.problem == "acyclic"


def test_a_write_while_a_conj_view_lives_is_refused():
    """Review of the fix above: the conj() view became a resolved copy, so a write into its base
    afterwards (or through it) did not reach it: a silently wrong Jacobian (0.9) where it had raised."""
    Z = lambda x: torch.view_as_complex(x.reshape(-1, 2))  # noqa: E731

    def base_written(x):
        z = Z(x) * 1
        c = z.conj()
        z.mul_(x[0])
        return c.imag

    def written_through(x):
        z = Z(x) * 1
        z.conj().mul_(x[0])
        return torch.view_as_real(z).reshape(-1)

    x = torch.tensor([0.3, -0.5, 0.7, 0.2, -0.4, -0.9, 0.1, 0.6], dtype=torch.float64)
    for f in (base_written, written_through):
        for local in (False, True):
            with pytest.raises(asd.TracingError, match="copy"):
                asd.jacobian_sparsity(f, x, local=local)


@pytest.mark.filterwarnings("ignore::asd.PrecisionWarning")
def test_recoloring_inside_value_grad_hessian_rebuilds_its_products():
    """Review: the one-pass products of value_grad_hessian kept the acyclic seeds after the operator
    colored again with star, and every later call raised DecompressionError."""
    n = 120
    w = 1 + torch.rand(n - 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    f = lambda x: (w[1:] * x[1:-1] * x[2:]).sum() + torch.exp(x[0]) * x[1] + (x ** 2).sum()  # noqa: E731
    x0 = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x0[0] = 0.0
    x1 = x0.clone()
    x1[0] = 34.5  # exp(x0) * x1 couples the head of the chain at 1e15
    op = asd.prepare_hessian(f, x0, check=True, hvp="forward_over_reverse")
    for _ in range(8):
        op.value_grad_hessian(x0)
    for _ in range(3):
        _, g, H = op.value_grad_hessian(x1)
        assert _worst_relative_error(H.to_dense(), torch.func.hessian(f)(x1)) < 1e-13
        torch.testing.assert_close(g, torch.func.grad(f)(x1))
    assert op.coloring.problem == "star"


@pytest.mark.filterwarnings("ignore::asd.PrecisionWarning")
def test_two_threads_making_the_first_calls_both_get_screened_values():
    """Review: the screen ran outside the evaluation lock; a thread whose values came from the
    acyclic coloring returned them unscreened while another thread colored again."""
    import threading

    f = _coupled_chain(1e15)
    x = torch.rand(120, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = torch.func.hessian(f)(x)
    for _ in range(10):
        op = asd.prepare_hessian(f, x)
        out, barrier = [None, None], threading.Barrier(2)

        def run(k):
            barrier.wait()
            out[k] = _worst_relative_error(op(x).to_dense(), ref)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert max(out) < 1e-13


def test_jax_screen_under_jit_waits_for_an_eager_call():
    """Review: jax.jit(op.values) raised TracerArrayConversionError (the screen read the tracer's
    values), and marked the operator screened: the next eager call was not."""
    jax, aj, f, x = _jax_coupled_chain()
    op = aj.prepare_hessian(f, x)
    jax.jit(op.values)(x)
    with pytest.warns(asd.PrecisionWarning):
        op(x)
    assert op.coloring.problem == "star"


def test_the_substitution_screen_passes_over_the_meta_device():
    """The screen copied meta values to the host (no data): Hessians on the meta device raised."""
    x = torch.empty(30, dtype=torch.float64, device="meta")
    H = asd.prepare_hessian(lambda z: (z[1:] * z[:-1]).sum() + (z ** 3).sum(), x, coloring="acyclic")(x)
    assert H.device.type == "meta"


def _conj_then_written():
    def hermitian_sum(x):
        z = torch.complex(x[:4], x[4:]).clone()
        z += z.conj()  # the conj() temporary is read by the write and never again
        return torch.view_as_real(z).reshape(-1) * x

    def hermitian_fill(x):
        z = torch.complex(x[:4], x[4:]).clone()
        z[0] = z[3].conj()
        return torch.view_as_real(z).reshape(-1) * x

    def plus_adjoint(x):
        A = torch.complex(x[:4], x[4:]).reshape(2, 2).clone()
        A += A.mH
        return torch.view_as_real(A).reshape(-1) * x

    def ihfft_scaled(x):
        z = torch.fft.ihfft(x)  # a lazily conjugated result whose base f never sees
        z.mul_(x[0])
        return z.abs()

    return [hermitian_sum, hermitian_fill, plus_adjoint, ihfft_scaled]


@pytest.mark.parametrize("f", _conj_then_written(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("local", [False, True])
def test_writes_beside_a_conj_view_that_is_not_read_again_are_traced(f, local):
    """The second review: refusing every write while a conj() copy lived refused z += z.conj(),
    A += A.mH and writes into fft.ihfft's result, which traced before. A stale copy now raises only
    where it is read."""
    x = torch.tensor([0.3, -0.5, 0.7, 0.2, -0.4, -0.9, 0.1, 0.6], dtype=torch.float64)
    D = torch.autograd.functional.jacobian(f, x)
    P = asd.jacobian_sparsity(f, x, local=local).toarray()
    assert not ((D != 0).numpy() & ~P).any()
    torch.testing.assert_close(asd.sparse_jacobian(f, x, local=local).to_dense(), D)


def test_the_distributed_argument_digest_reads_values_not_identities():
    """Second review: a dict key was digested by its repr (a per-process address for a plain
    object), so identical calls on two ranks disagreed; sparse and conjugated tensor arguments made
    the digest fail."""
    from asd.arg_values import digest as args_digest

    class Key:
        pass

    A = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert args_digest(((), {"cfg": {Key(): 2.0}})) == args_digest(((), {"cfg": {Key(): 2.0}}))
    assert args_digest(((), {"cfg": {Key(): 2.0}})) != args_digest(((), {"cfg": {Key(): 3.0}}))
    for arg in (A.to_sparse(), A.to_sparse_csr(), torch.complex(A, A).conj(), torch.empty(3, device="meta")):
        assert args_digest(((arg,), {})) == args_digest(((arg.clone(),), {}))
    assert args_digest(((A.to_sparse(),), {})) != args_digest(((A.to_sparse() * 2,), {}))
