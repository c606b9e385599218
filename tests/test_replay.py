"""Eager replay of recorded graphs: the constant-only work folded, the gather pushed down, the
fastest exact variant measured (asd/backends/replay.py)."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import asd
from asd.backends import replay, traced
from asd.problems import brusselator, brusselator_input, rosenbrock
from graph_edits import read_input_reversed, scale_output


def _settled(op, x):
    for _ in range(traced.CALLS_BEFORE_TRACING + 2):
        op.values(x)
    products = getattr(op.state, "fused", None) or op.state.products
    assert products.tracing.graphs and not products.tracing.disabled
    return products.tracing.replay


def _reference(f, x, **options):
    """The transforms' values at ``x`` (no recorded graph)."""
    return asd.prepare_jacobian(f, x, trace=False, check=False, **options).values(x)


@pytest.mark.parametrize("N", [5, 12])
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_specialized_replay_gives_the_transforms_bits_at_new_points(N, mode):
    f, x = brusselator(N), brusselator_input(N)
    op = asd.prepare_jacobian(f, x, mode=mode, check=False)
    r = _settled(op, x)
    assert r.chosen in r.timings and set(r.timings) >= {"recorded"}
    assert len(r.timings) > 1, r.notes  # the folded variant exists for a stencil
    g = torch.Generator().manual_seed(N)
    for _ in range(3):
        x2 = torch.rand(x.shape, dtype=x.dtype, generator=g) * 3 - 1
        got = op.values(x2)
        assert torch.equal(got, _reference(f, x2, mode=mode))
        dense = torch.func.jacrev(f)(x2)
        torch.testing.assert_close(op(x2).to_dense(), dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["folded", "pushed"])
def test_each_variant_alone_is_exact(monkeypatch, variant):
    """Whichever variant the timing picks, its values are the transforms' at other points."""
    timed = {}

    def seconds(fn, x, seeds):
        timed[fn] = True
        return 0.0 if fn.variant == variant else 1.0

    monkeypatch.setattr(replay, "_seconds", seconds)
    f, x = brusselator(9), brusselator_input(9)
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    r = _settled(op, x)
    assert r.chosen == variant and r.fast.variant == variant, (r.timings, r.notes)
    assert len(timed) == 3
    for seed in range(3):
        x2 = torch.rand(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(op.values(x2), _reference(f, x2, mode="forward"))


def test_recording_gradients_replays_the_recorded_graph():
    """A call that records an autograd graph (x requires grad) runs the recorded operations, and
    its gradient is the transforms' one."""
    f, x = brusselator(6), brusselator_input(6)
    op = asd.prepare_jacobian(f, x, mode="reverse", check=False)
    r = _settled(op, x)
    calls = {"plain": 0}
    plain = r.plain

    def counted(*a):
        calls["plain"] += 1
        return plain(*a)

    r.plain = counted
    xg = x.clone().requires_grad_(True)
    v = op.values(xg)
    assert calls["plain"] == 1 and v.requires_grad
    w = torch.randn(v.shape, dtype=v.dtype)
    (grad,) = torch.autograd.grad((v * w).sum(), xg)
    ref_op = asd.prepare_jacobian(f, x, mode="reverse", trace=False, check=False)
    xr = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad((ref_op.values(xr) * w).sum(), xr)
    torch.testing.assert_close(grad, ref, rtol=1e-12, atol=1e-14)


def _edit_candidates(monkeypatch, edit):
    """Every specialized candidate rewritten by ``edit`` after it passed specialize's own checks."""
    from asd.backends import specialize

    real = specialize.candidates

    def edited(*a, **kw):
        specs, notes = real(*a, **kw)
        for spec in specs:
            edit(spec.gm)
        return specs, notes

    monkeypatch.setattr(specialize, "candidates", edited)


def test_a_variant_that_is_not_bit_exact_is_refused(monkeypatch):
    _edit_candidates(monkeypatch, scale_output)
    f, x = brusselator(5), brusselator_input(5)
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    r = _settled(op, x)
    assert r.chosen == "recorded" and set(r.timings) <= {"recorded"}
    assert any("bits" in n for n in r.notes), r.notes
    assert torch.equal(op.values(x), _reference(f, x, mode="forward"))


def test_folded_constants_respect_the_memory_cap(monkeypatch):
    monkeypatch.setattr(replay, "MAX_EAGER_EXTRA_BYTES", -(1 << 40))
    f, x = brusselator(6), brusselator_input(6)
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    r = _settled(op, x)
    assert r.chosen == "recorded" and r.fast is r.plain
    assert torch.equal(op.values(x), _reference(f, x, mode="forward"))


def test_hessian_replay_is_exact_at_new_points():
    x = torch.randn(40, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, check=False, hvp="forward_over_reverse")
    r = _settled(op, x)
    # every stored entry is a product and little reads only the seeds: not worth specializing
    assert r.chosen == "recorded" and any(n.startswith("not specialized") for n in r.notes), r.notes
    ref = asd.prepare_hessian(rosenbrock, x, check=False, hvp="forward_over_reverse", trace=False)
    for seed in range(3):
        x2 = torch.randn(40, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(op.values(x2), ref.values(x2))
        torch.testing.assert_close(op(x2).to_dense(), torch.func.hessian(rosenbrock)(x2), rtol=1e-12, atol=1e-12)


def test_unsafe_index_becomes_index_select_for_eager_replay():
    def g(a, i):
        return torch.ops.aten._unsafe_index.Tensor(a.reshape(-1), [i])

    a = torch.randn(3, 4, dtype=torch.float64)
    i = torch.tensor([0, 5, 11, 5])
    gm = make_fx(g)(a, i)
    replay._index_select(gm)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.index_select.default in targets
    assert torch.ops.aten._unsafe_index.Tensor not in targets
    assert torch.equal(gm(a, i), a.reshape(-1)[i])


def test_a_variant_reading_wrong_elements_is_refused_at_a_symmetric_example(monkeypatch):
    """Prepared at x = ones, a variant that reads x reversed gives the recorded bits there; the
    second, random point refuses it."""
    _edit_candidates(monkeypatch, read_input_reversed)
    f = brusselator(5)
    x = torch.ones(50, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    r = _settled(op, x)
    assert r.chosen == "recorded" and any("bits" in n for n in r.notes), r.notes
    x2 = brusselator_input(5)
    assert torch.equal(op.values(x2), _reference(f, x2, mode="forward"))


def test_products_that_are_not_finite_at_the_example_are_not_specialized():
    """NaN or inf products at the check points could hide a variant reading wrong elements."""
    N = 5

    def f(x):
        u = x.reshape(N, N)
        lap = torch.roll(u, 1, 0) + torch.roll(u, -1, 1) - 2 * u
        return (torch.log(u) * lap).reshape(-1)  # d log(u) = 1/u: inf where u = 0

    x = brusselator_input(N)[: N * N].clone()
    x[3] = 0.0
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    r = _settled(op, x)
    assert r.chosen == "recorded" and any("not finite" in n for n in r.notes), r.notes
    x2 = x + 0.5
    assert torch.equal(op.values(x2), _reference(f, x2, mode="forward"))


def test_seed_rows_written_in_place_are_not_met_with_stale_folded_constants():
    """The graph key holds the seeds' version: after a write into them the graph is recorded (and
    specialized) again, so the folded constants follow the new seeds (the products are linear in
    them: doubled seeds give exactly doubled values)."""
    f, x = brusselator(7), brusselator_input(7)
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    r = _settled(op, x)
    assert r.chosen != "recorded" or len(r.timings) > 1, r.notes
    before = op.values(x).clone()
    op.state.fused.seeds.mul_(2.0)
    assert torch.equal(op.values(x), 2 * before)
