"""Session 40's review: a prepared operator's products recorded inside a torch.func transform."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import asd
from asd.backends import traced
from asd.problems import brusselator, brusselator_input


def _products(op):
    return getattr(op.state, "fused", None) or op.state.products


def _jacrev(op, x):
    return torch.func.jacrev(op.values)(x)


def _vmap(op, x):
    return torch.func.vmap(op.values)(torch.stack([x, x * 1.01]))


def _dual(op, x):
    with fwAD.dual_level():
        return op.values(fwAD.make_dual(x, torch.ones_like(x)))


@pytest.mark.parametrize("transform", [_jacrev, _vmap, _dual], ids=["jacrev", "vmap", "forward-ad"])
def test_products_are_not_recorded_inside_a_transform(transform):
    """An operator called inside ``jacrev``/``vmap`` or at a forward-mode AD level for the calls
    that reach the recording: a graph recorded there held the transform's wrapped tensors, the
    products of that point among them, as constants, passed its first-replay comparison at the
    same point and answered every later point with that point's Jacobian, without a word."""
    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x, check=False)
    xa = brusselator_input(8, seed=1)
    for _ in range(traced.CALLS_BEFORE_TRACING + 3):
        transform(op, xa)
    assert not _products(op).tracing.graphs  # recorded only outside a transform
    for seed in (2, 3):
        xb = brusselator_input(8, seed=seed)
        torch.testing.assert_close(op(xb).to_dense(), torch.func.jacfwd(f)(xb), rtol=1e-12, atol=1e-12)
    for _ in range(traced.CALLS_BEFORE_TRACING + 3):  # recorded at the plain calls, replayed inside one
        op.values(xa)
    assert _products(op).tracing.graphs
    xc = brusselator_input(8, seed=4)
    torch.testing.assert_close(torch.func.jacrev(op.values)(xc), torch.func.jacrev(lambda t: op.values(t))(xc))
    torch.testing.assert_close(op(xc).to_dense(), torch.func.jacfwd(f)(xc), rtol=1e-12, atol=1e-12)


def test_a_graph_dropped_and_recorded_again_inside_jacrev_is_not_kept():
    """The reviewer's sequence: ``jacfwd`` around a warm operator drops its graph, ``jacrev``
    around it then reached the recording; every later point got that point's values."""
    f, x0 = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x0)
    for _ in range(traced.CALLS_BEFORE_TRACING + 5):
        op.values(x0)
    xa, xb = brusselator_input(8, seed=1), brusselator_input(8, seed=2)
    torch.func.jacfwd(op.values)(xa)
    torch.func.jacrev(op.values)(xa)
    op.values(xa)
    got = op(xb)
    assert not torch._C._functorch.is_functorch_wrapped_tensor(got.values())
    torch.testing.assert_close(got.to_dense(), torch.func.jacfwd(f)(xb), rtol=1e-12, atol=1e-12)


# --- the second review: operators under torch.func transforms and forward-mode AD -------------------

def _entries(op, x):
    c = op(x)
    return torch.repeat_interleave(torch.arange(c.shape[0]), c.crow_indices().diff()), c.col_indices()


def _rosenbrock_x(n=30):
    return torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


_DUAL_CASES = {
    "jacobian": (lambda: asd.prepare_jacobian(brusselator(8), brusselator_input(8)),
                 lambda z: torch.func.jacfwd(brusselator(8))(z).reshape(128, 128), lambda: brusselator_input(8)),
    "jacobian-compiled": (lambda: asd.prepare_jacobian(brusselator(8), brusselator_input(8), compile=True),
                          lambda z: torch.func.jacfwd(brusselator(8))(z).reshape(128, 128),
                          lambda: brusselator_input(8)),
    "hessian-star": (lambda: asd.prepare_hessian(asd.problems.rosenbrock, _rosenbrock_x(), coloring="star"),
                     lambda z: torch.func.hessian(asd.problems.rosenbrock)(z), _rosenbrock_x),
    "hessian-acyclic": (lambda: asd.prepare_hessian(asd.problems.rosenbrock, _rosenbrock_x(), coloring="acyclic"),
                        lambda z: torch.func.hessian(asd.problems.rosenbrock)(z), _rosenbrock_x),
}


@pytest.mark.parametrize("name", sorted(_DUAL_CASES))
def test_forward_mode_tangents_pass_through_operators(name):
    """``op.values(make_dual(x, t))`` carries the values' derivative along ``t``, at the first calls
    (the warm-up loop detached x), after the recording (the fast replay gathered with Numba,
    compiled kernels and the Numba substitution dropped the tangent): forward mode read the missing
    tangent as zero, a silently zero derivative. The operator keeps its strategy for later calls."""
    make, dense, point = _DUAL_CASES[name]
    op = make()
    x = point()
    rows, cols = _entries(op, x)
    t = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    strategy = op.strategy
    for call in range(traced.CALLS_BEFORE_TRACING + 6):
        if call in (0, 1, traced.CALLS_BEFORE_TRACING + 5):
            z = x * (1 + 0.01 * call)
            with fwAD.dual_level():
                primal, tangent = fwAD.unpack_dual(op.values(fwAD.make_dual(z, t)))
            _, want = torch.func.jvp(lambda u: dense(u)[rows, cols], (z,), (t,))
            assert tangent is not None, call
            torch.testing.assert_close(tangent, want, rtol=1e-10, atol=1e-10 * float(want.abs().max()))
            if call == 0:  # and PyTorch's own second derivatives against central differences
                h = 1e-5
                fd = (dense(z + h * t)[rows, cols] - dense(z - h * t)[rows, cols]) / (2 * h)
                torch.testing.assert_close(tangent, fd, rtol=1e-5, atol=1e-5 * float(fd.abs().max()))
            torch.testing.assert_close(primal, dense(z)[rows, cols], rtol=1e-10, atol=1e-9)
        else:
            op.values(x)
    assert op.strategy == strategy


def test_a_csr_result_refuses_forward_mode_tangents_clearly():
    """PyTorch has no forward AD for sparse compressed tensors: the CSR result names ``values``."""
    op = asd.prepare_jacobian(brusselator(8), brusselator_input(8))
    with fwAD.dual_level(), pytest.raises(asd.InputError, match="values"):
        op(fwAD.make_dual(brusselator_input(8), torch.ones(128, dtype=torch.float64)))


@pytest.mark.parametrize("transform", ["jacfwd", "vmap", "jacrev", "grad"])
def test_warm_operators_inside_transforms_keep_their_graphs_and_kernels(transform):
    """Calls inside a transform are evaluated by the transforms: a compiled operator's kernels read
    storage that wrapped tensors lack (they raised, or were given up for good), a replay there
    counted as a relayout or a disagreement (three such calls switched tracing off), a guard on a
    captured mask raised (recording off for good)."""
    n = 24
    mask = torch.arange(n) % 3 != 0
    c = torch.linspace(-1, 1, n, dtype=torch.float64)

    def f(x):
        return torch.where(mask, x ** 3, torch.cos(x)) + torch.nn.functional.pad(x[None], (1, 1), mode="reflect")[0, 2:] * c

    x0 = torch.linspace(0.1, 1, n, dtype=torch.float64)
    dense = torch.func.jacfwd(f)
    for compile in (False, True):
        op = asd.prepare_jacobian(f, x0, compile=compile)
        for _ in range(traced.CALLS_BEFORE_TRACING + 3):
            op.values(x0)
        tracing = _products(op).tracing
        assert tracing.graphs
        rows, cols = _entries(op, x0)
        ref = lambda z: dense(z)[rows, cols]  # noqa: E731
        T = {"jacfwd": (torch.func.jacfwd(op.values), torch.func.jacfwd(ref)),
             "jacrev": (torch.func.jacrev(op.values), torch.func.jacrev(ref)),
             "vmap": (lambda z: torch.func.vmap(op.values)(torch.stack([z, z * 1.1])),
                      lambda z: torch.stack([ref(z), ref(z * 1.1)])),
             "grad": (torch.func.grad(lambda z: op.values(z).square().sum()),
                      torch.func.grad(lambda z: ref(z).square().sum()))}[transform]
        for k in range(4):
            z = x0 * (1 + 0.05 * k)
            torch.testing.assert_close(T[0](z), T[1](z), rtol=1e-10, atol=1e-10)
        assert tracing.graphs and not tracing.disabled and not tracing.relayouts and not tracing.misses
        assert tracing.compile_refused is None and not tracing.failed_later
        torch.testing.assert_close(op.values(x0 * 0.9), ref(x0 * 0.9), rtol=1e-12, atol=1e-12)


def test_a_mask_argument_is_read_inside_jacrev():
    """An extra bool-tensor argument inside ``jacrev``/``grad``: its fingerprint copied it inside
    the transform (a wrapped copy, no storage) and every such call raised; ``jacrev`` wraps the
    prepared mask too, which then counted as another argument and was checked there."""
    n = 12
    mask = torch.arange(n) % 3 != 0

    def f(x, m):
        return torch.where(m, x ** 3, torch.cos(x)) + x.roll(2)

    x0 = torch.linspace(0.1, 1, n, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x0, args=(mask,))
    rows, cols = _entries(op, x0)
    ref = lambda z: torch.func.jacfwd(f)(z, mask)[rows, cols]  # noqa: E731
    torch.testing.assert_close(torch.func.jacrev(op.values)(x0, mask), torch.func.jacrev(ref)(x0))
    torch.testing.assert_close(torch.func.jacrev(op.values)(x0), torch.func.jacrev(ref)(x0))
    torch.testing.assert_close(torch.func.grad(lambda z: op.values(z, mask).sum())(x0),
                               torch.func.grad(lambda z: ref(z).sum())(x0))


def test_an_acyclic_hessian_inside_vmap_is_bounded_and_refused_clearly_where_it_cannot_be():
    """Substitution under ``vmap`` runs in torch and its rounding is bounded per batch element;
    inside ``jacrev`` the values cannot be read to bound them: a clear error naming star."""
    x = _rosenbrock_x()
    op = asd.prepare_hessian(asd.problems.rosenbrock, x, coloring="acyclic")
    rows, cols = _entries(op, x)
    ref = lambda z: torch.func.hessian(asd.problems.rosenbrock)(z)[rows, cols]  # noqa: E731
    got = torch.func.vmap(op.values)(torch.stack([x, x * 1.1]))
    torch.testing.assert_close(got, torch.stack([ref(x), ref(x * 1.1)]), rtol=1e-12, atol=1e-9)
    with pytest.raises(asd.InputError, match="star"):
        torch.func.jacrev(op.values)(x)
    torch.testing.assert_close(op.values(x * 0.8), ref(x * 0.8), rtol=1e-12, atol=1e-9)


def test_forward_mode_tangents_pass_through_torch_compile_operators():
    """``compile=True`` where the products are not recorded (``trace=False``) runs torch.compile's
    graph, which dropped a forward-mode tangent (read as zero): such a call runs uncompiled."""
    _assert_b1_tangents(asd.prepare_jacobian(brusselator(8), brusselator_input(8), compile=True, trace=False), 2)


def _assert_b1_tangents(op, calls):
    """``op`` (B1 N=8) at a dual level: the tangent of its values is the dense Jacobian's jvp."""
    f, x = brusselator(8), brusselator_input(8)
    rows, cols = _entries(op, x)
    t = torch.ones_like(x)
    _, want = torch.func.jvp(lambda z: torch.func.jacfwd(f)(z).reshape(128, 128)[rows, cols], (x,), (t,))
    for _ in range(calls):
        with fwAD.dual_level():
            _, tangent = fwAD.unpack_dual(op.values(fwAD.make_dual(x, t)))
        assert tangent is not None
        torch.testing.assert_close(tangent, want, rtol=1e-10, atol=1e-9)


# --- the third review -------------------------------------------------------------------------------

def test_compressed_products_at_a_forward_mode_level_keep_the_operators_layout():
    """A column-colored Jacobian cannot run its forward products inside a user's dual level (nested
    forward mode): the values come from another strategy for that call only, but a compressed
    buffer is in its coloring's layout, which another strategy's is not (same size: nothing caught
    it); the operator then adopts the strategy that runs."""
    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x, mode="forward")
    t = torch.ones_like(x)
    with fwAD.dual_level(), pytest.warns(RuntimeWarning):
        compressed = op.compressed(fwAD.make_dual(x, t))
    got = op.decompressor.values(fwAD.unpack_dual(compressed).primal)
    rows, cols = _entries(op, x)
    torch.testing.assert_close(got, torch.func.jacfwd(f)(x).reshape(128, 128)[rows, cols], rtol=1e-12, atol=1e-12)


def test_values_at_a_forward_mode_level_keep_the_operators_strategy():
    """The strategy that evaluates such a call is kept for the next one (not colored and set up at
    each) and the operator's own stays for plain calls."""
    op = asd.prepare_jacobian(brusselator(8), brusselator_input(8), mode="forward")
    strategy = op.strategy
    _assert_b1_tangents(op, 3)
    assert op.strategy == strategy and op._transform_fallback is not None


def _chain_with_large_entry(n=12, k=4, s=1e-6):
    def f(x):
        return (x[:-1] * x[1:] * (1 + s * x[:-1])).sum() + 0.5 * (x * x).sum() + torch.exp(3 * x[k]) * x[k + 1]

    x = torch.full((n,), 0.5, dtype=torch.float64)
    x[k], x[k + 1] = 6.0, 0.0
    v = torch.ones(n, dtype=torch.float64)
    v[k + 1] = 0.0
    return f, x, v


def test_a_forward_tangent_through_acyclic_substitution_is_bounded_too():
    """The tangent of an acyclic Hessian's values goes through the same substitution: its rounding
    lost 6e-2 of the smaller row's scale (the tolerance is 1.5e-7) while only the primal was
    bounded. Now an operator that chose acyclic itself colors again with star (the tangent then
    exact); one given acyclic warns."""
    f, x, v = _chain_with_large_entry()
    x0 = torch.zeros(12, dtype=torch.float64)
    op = asd.prepare_hessian(f, x0)
    assert op.coloring.problem == "acyclic"
    rows = torch.from_numpy(op.pattern.rows.copy())
    cols = torch.from_numpy(op.pattern.indices.copy())
    _, want = torch.func.jvp(lambda z: torch.func.hessian(f)(z)[rows, cols], (x,), (v,))
    with pytest.warns(asd.PrecisionWarning), fwAD.dual_level():
        _, tangent = fwAD.unpack_dual(op.values(fwAD.make_dual(x, v)))
    assert op.coloring.problem == "star"
    torch.testing.assert_close(tangent, want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))
    given = asd.prepare_hessian(f, x0, coloring="acyclic")
    with pytest.warns(asd.PrecisionWarning), fwAD.dual_level():
        given.values(fwAD.make_dual(x, v))


def test_a_recolor_inside_vmap_keeps_the_prepared_point():
    """The switch to star inside ``vmap`` set the operator up again at that call's wrapped ``x``,
    which then kept the whole batch alive under the operator."""
    k, n = 4, 12

    def f(x):
        return (x[:-1] * x[1:]).sum() + 0.5 * (x * x).sum() + torch.exp(3 * x[k]) * x[k + 1]

    x0 = torch.zeros(n, dtype=torch.float64)
    x = x0.clone()
    x[k], x[k + 1] = 12.0, 0.3
    op = asd.prepare_hessian(f, x0)
    with pytest.warns(asd.PrecisionWarning):
        torch.func.vmap(op.values)(torch.stack([x0, x]))
    assert op.coloring.problem == "star"
    assert not torch._C._functorch.is_functorch_wrapped_tensor(op._x0) and op._x0.shape == (12,)
    torch.testing.assert_close(op(x).to_dense(), torch.func.hessian(f)(x), rtol=1e-12, atol=1e-9)


def test_a_rebound_operator_does_not_keep_the_old_functions_fallback():
    """``rebind`` copied the strategy cached for calls at a dual level, set up on the old function
    and its argument box: the rebound operator's next such call gave the old function's values."""
    f1 = brusselator(8)
    op = asd.prepare_jacobian(f1, brusselator_input(8), mode="forward")
    x, t = brusselator_input(8), torch.ones(128, dtype=torch.float64)
    with fwAD.dual_level():
        op.values(fwAD.make_dual(x, t))
    assert op._transform_fallback is not None

    def f2(z):
        return 2 * f1(z)

    op2 = op.rebind(f2)
    rows, cols = _entries(op2, x)
    want, want_t = torch.func.jvp(lambda z: torch.func.jacfwd(f2)(z).reshape(128, 128)[rows, cols], (x,), (t,))
    with fwAD.dual_level():
        primal, tangent = fwAD.unpack_dual(op2.values(fwAD.make_dual(x, t)))
    torch.testing.assert_close(primal, want, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(tangent, want_t, rtol=1e-10, atol=1e-9)
