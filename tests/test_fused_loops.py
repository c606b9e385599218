"""Recorded products graphs as one generated Numba loop nest (asd/backends/fused_loops.py): the
graph's bits, or no kernel at all."""

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import asd
from asd.backends import fused_loops, replay, traced
from asd.backends.fused_loops import fused_runner, kernel_source
from asd.backends.replay import _same
from asd.problems import brusselator, brusselator_input

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _runner(fn, args, constant, **kw):
    gm = make_fx(fn)(*args)
    run = fused_runner(gm, list(args), constant=set(constant), fallback=gm.forward, **kw)
    return gm, run


def _bits_agree(gm, run, args):
    with torch.no_grad():
        want, got = gm(*args), run(*args)
    assert _same(got, want), (got - want).abs().max()


# ------------------------------------------------------------------ random elementwise graphs
_UNARY = [
    lambda a: -a,
    lambda a: torch.abs(a) * 0.5,
    lambda a: torch.square(a),
    lambda a: a ** 2,
    lambda a: torch.reciprocal(torch.abs(a) + 1.5),
    lambda a: torch.abs(a),
    lambda a: a.to(a.dtype, copy=True) - a.clone(),
]
_BINARY = [torch.add, torch.sub, torch.mul, lambda a, b: a / (torch.abs(b) + 0.75)]


@st.composite
def _programs(draw):
    """A random elementwise program over u, v (halves of x, (4, 5)), constants of (3, 4, 5),
    (4, 5), (1, 5) and a scalar, as a list of instructions; the last two values are joined."""
    n_ops = draw(st.integers(2, 9))
    ops = []
    for _ in range(n_ops):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "view", "scalar"]))
        ops.append((kind, draw(st.integers(0, 10 ** 6)), draw(st.integers(0, 10 ** 6)),
                    draw(st.sampled_from([0.5, -3.0, 2, 1e-3, 7.25]))))
    join = draw(st.sampled_from(["stack0", "stack1", "stack-1", "cat0", "cat2", "single"]))
    gather = draw(st.booleans())
    return ops, join, gather


def _program_fn(program, dtype):
    ops, join, gather = program

    def fn(x, c3, c2, c1, idx):
        X = x.view(2, 4, 5)
        u, v = X.unbind(0)
        vals = [u, v, c3, c2, c1, X[1].t().t(), x[20:].view(4, 5)]
        for kind, i, j, s in ops:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if kind == "unary":
                vals.append(_UNARY[j % len(_UNARY)](a))
            elif kind == "binary":
                vals.append(_BINARY[j % len(_BINARY)](a, b))
            elif kind == "scalar":
                vals.append(a * s + s if i % 2 else s - a / s)
            elif a.dim() == 2 and a.shape == (4, 5):  # views of a computed (or input) value
                vals.append([a.unsqueeze(0).expand(3, 4, 5), a.t().unsqueeze(-1).squeeze(-1).t(),
                             torch.stack([a, -a], 1).unbind(1)[j % 2], a[1:].select(0, 1).expand(4, 5)][j % 4])
            else:
                vals.append(a.permute(0, 2, 1).transpose(1, 2) if a.dim() == 3 else a)
        p, q = (t.expand(3, 4, 5) if t.shape != (3, 4, 5) else t for t in vals[-2:])
        if join == "single":
            out = p + q
        elif join.startswith("stack"):
            out = torch.stack([p, q], int(join[5:]))
        else:
            out = torch.cat([p, q], int(join[3:]))
        if gather:
            return torch.index_select(out.reshape(-1), 0, idx)
        return out

    return fn


def _program_args(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.rand(*s, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)  # noqa: E731
    idx = torch.randperm(3 * 4 * 5 * 2, generator=g)[:70]
    return [r(40), r(3, 4, 5), r(4, 5), r(1, 5), idx]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=_programs(), dtype=st.sampled_from([torch.float64, torch.float32]), seed=st.integers(0, 99))
def test_random_elementwise_programs_give_the_graphs_bits(program, dtype, seed):
    fn = _program_fn(program, dtype)
    args = _program_args(dtype, seed)
    if program[1] == "single" and program[2]:
        args[4] = args[4] % 60
    gm, run = _runner(fn, args, {1, 2, 3, 4})
    assert run is not None, program  # every operation of the program is one the loop writes
    _bits_agree(gm, run, args)
    other = _program_args(dtype, seed + 1000)
    _bits_agree(gm, run, [other[0], *args[1:]])  # the same constants, another point


_COMPUTED_VIEWS = {
    "transpose": lambda y, w: y.transpose(0, 2) * w.transpose(0, 2),
    "t": lambda y, w: y[0].t() + w[1].t(),
    "permute": lambda y, w: y.permute(2, 0, 1) - w.permute(2, 0, 1),
    "negative dims": lambda y, w: y.transpose(-1, -3) * 2.0 + w.permute(-1, -3, -2).transpose(1, 2),
    "slice": lambda y, w: y[:, 1:, 2:] + w[:, :-1, :3],
    "slice step": lambda y, w: y[:, ::2, 1::3] * w[:, 1::2, ::3],
    "select": lambda y, w: y.select(1, -1) + w.select(1, 0),
    "unbind": lambda y, w: y.unbind(2)[3] - w.unbind(2)[-1],
    "expand": lambda y, w: y[:, :1].expand(3, 4, 5) + w[:1].expand(3, 4, 5),
    "unsqueeze": lambda y, w: y[1].unsqueeze(1).squeeze(1) * w[2],
    "stack item": lambda y, w: torch.stack([y, w], 1)[:, 1] - torch.stack([w, y], 0)[0],
    "cat item": lambda y, w: torch.cat([y, w], 2)[:, :, 7] + torch.cat([w[:1], y], 0)[2, :, 0],
    "copy": lambda y, w: y.to(y.dtype, copy=True) * w.clone(),
}


@pytest.mark.parametrize("view", sorted(_COMPUTED_VIEWS))
def test_each_view_of_a_computed_value_gives_the_graphs_bits(view):
    """Each view the loop maps onto a computed value's index (not read off an input's strides),
    on values that differ everywhere: a wrong map reads another element."""
    body = _COMPUTED_VIEWS[view]

    def fn(x, c):
        y = x.view(3, 4, 5) * c + 1.5
        w = c / (x.view(3, 4, 5) + 3.0)
        return torch.stack([body(y, w), -body(w, y)])

    g = torch.Generator().manual_seed(7)
    x, c = torch.rand(60, generator=g, dtype=torch.float64), torch.rand(3, 4, 5, generator=g, dtype=torch.float64)
    gm, run = _runner(fn, [x, c], {1})
    assert run is not None, view
    _bits_agree(gm, run, [x, c])
    _bits_agree(gm, run, [torch.rand(60, generator=g, dtype=torch.float64), c])


def test_kernel_source_is_one_loop_nest_per_joined_part():
    x = brusselator_input(8)

    def fn(x, c):
        u, v = x.view(2, 8, 8).unbind(0)
        return torch.stack([c * u * v + u, c - v * v], 1)

    c = torch.rand(3, 8, 8, dtype=torch.float64)
    gm = make_fx(fn)(x, c)
    source, leaves, gather, root, _, layout = kernel_source(gm, [x, c], constant={1})
    assert gather is None and layout.pad == 0
    assert source.count("for i0 in range(3):") == 2 and "np.empty" not in source
    assert "a0[8 * i1 + i2 + 64]" in source  # v, read off x by its own offset and strides


# ------------------------------------------------------------------------------ what is refused
@pytest.mark.parametrize("body", [
    lambda x, c: torch.exp(x) * c,            # ATen's vectorized exp rounds differently
    lambda x, c: torch.sin(x) + c,
    lambda x, c: torch.sqrt(x) * c,           # (an ulp off the correctly rounded root here)
    lambda x, c: (x * c).sum(0),             # a reduction
    lambda x, c: x * c + torch.rand_like(c),  # a draw
    lambda x, c: torch.add(x, c, alpha=2.0),
    lambda x, c: torch.div(x, c, rounding_mode="floor"),
    lambda x, c: (x * c).to(torch.float32),
    lambda x, c: x.view(4, 5).t().reshape(20) * c.view(20),  # a reshape that moves elements
    lambda x, c: x[torch.tensor([3, 1])] * c[:2],
    lambda x, c: torch.stack([x * c, c], 0).t() * 2,  # a join read along its joined dimension
])
def test_graphs_the_loop_does_not_write_are_left_to_aten(body):
    x, c = torch.rand(20, dtype=torch.float64), torch.rand(20, dtype=torch.float64) + 1
    gm = make_fx(body)(x, c)
    assert fused_runner(gm, [x, c], constant={1}, fallback=gm.forward) is None


def test_mixed_dtypes_integer_inputs_and_gathers_by_a_runtime_index_are_refused():
    x = torch.rand(20, dtype=torch.float64)
    c32 = torch.rand(20, dtype=torch.float32)

    def mixed(x, c):
        return x * c

    gm = make_fx(mixed)(x, c32)
    assert fused_runner(gm, [x, c32], constant={1}, fallback=gm.forward) is None
    idx = torch.tensor([0, 5, 7])

    def gathered(x, i):
        return torch.index_select((x * 2).reshape(-1), 0, i)

    gm = make_fx(gathered)(x, idx)
    assert fused_runner(gm, [x, idx], constant=set(), fallback=gm.forward) is None  # i may be f's own
    assert fused_runner(gm, [x, idx], constant={1}, fallback=gm.forward) is not None


def test_small_graphs_are_not_compiled(monkeypatch):
    compiled = []
    monkeypatch.setattr(fused_loops, "_compile", lambda s: compiled.append(s))
    x = torch.rand(20, dtype=torch.float64)
    gm = make_fx(lambda x: x * x + 1)(x)
    assert fused_runner(gm, [x], constant=set(), fallback=gm.forward, min_elements=21) is None
    assert not compiled


# -------------------------------------------------------------------------- calls off the example
def test_inputs_of_another_layout_type_or_grad_go_to_the_fallback():
    calls = []

    def fn(x, c):
        return x * c + x

    x, c = torch.rand(30, dtype=torch.float64), torch.rand(30, dtype=torch.float64)
    gm = make_fx(fn)(x, c)

    def fallback(*a):
        calls.append(a)
        return gm(*a)

    run = fused_runner(gm, [x, c], constant=set(), fallback=fallback)
    assert run is not None
    _bits_agree(gm, run, [x, c])
    assert not calls
    strided = torch.rand(60, dtype=torch.float64)[::2]
    assert torch.equal(run(strided, c), fn(strided, c)) and len(calls) == 1
    xg = x.clone().requires_grad_()
    out = run(xg, c)
    assert out.requires_grad and len(calls) == 2
    (g,) = torch.autograd.grad(out.sum(), xg)
    assert torch.equal(g, c + 1)
    with torch.no_grad():  # no gradient to record: the loop reads the tensor's values
        assert torch.equal(run(xg, c), fn(x, c)) and len(calls) == 2
    assert torch.equal(run(x.float(), c.float()), fn(x.float(), c.float())) and len(calls) == 3
    negated = x.neg()._neg_view()  # x, stored negated with the lazy negation bit
    assert negated.is_neg() and torch.equal(run(negated, c), fn(x, c)) and len(calls) == 4


def test_division_by_zero_gives_infinities_as_aten_does():
    x = torch.tensor([0.0, -0.0, 1.0, 0.0] * 5, dtype=torch.float64)
    c = torch.tensor([1.0, 1.0, 0.0, 0.0] * 5, dtype=torch.float64)

    def fn(x, c):
        return torch.stack([c / x, x / c, torch.reciprocal(x)])

    gm = make_fx(fn)(x, c)
    run = fused_runner(gm, [x, c], constant=set(), fallback=gm.forward)
    got, want = run(x, c), fn(x, c)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
    assert torch.isinf(got).any()


def test_zero_dimensional_inputs_and_the_default_device(monkeypatch):
    x, c = torch.rand(64, dtype=torch.float64), torch.tensor(2.5, dtype=torch.float64)

    def fn(x, c):
        return torch.stack([x * c, x - c])

    gm, run = _runner(fn, [x, c], {1})
    with torch.device("meta"):  # the loops' result is on the CPU whatever the default device
        got = run(x, c)
    assert got.device.type == "cpu" and _same(got, fn(x, c))


def test_float32_scalars_round_to_float32_as_aten_does():
    x = torch.rand(50, dtype=torch.float32) * 3

    def fn(x):
        return torch.stack([x * 0.1 + 1e-3, 0.3 - x / 7.0, x * x * 1.1])

    gm, run = _runner(fn, [x], set())
    _bits_agree(gm, run, [x])
    assert run(x).dtype == torch.float32


# --------------------------------------------------------------------------- the kernel cache
def test_kernels_are_written_once_and_loaded_by_another_process(tmp_path, monkeypatch):
    monkeypatch.setenv("ASD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fused_loops, "_KERNELS", {})
    x = torch.rand(64, dtype=torch.float64)
    salt = 0.123456789  # a source no other test compiles

    def fn(x):
        return torch.stack([x * salt, x + x])

    gm, run = _runner(fn, [x], set())
    _bits_agree(gm, run, [x])
    files = os.listdir(tmp_path / "fused")
    assert len([f for f in files if f.endswith(".py")]) == 1
    code = ("import torch, asd.backends.fused_loops as F\n"
            "from torch.fx.experimental.proxy_tensor import make_fx\n"
            f"salt = {salt!r}\n"
            "fn = lambda x: torch.stack([x * salt, x + x])\n"
            "x = torch.rand(64, dtype=torch.float64)\n"
            "gm = make_fx(fn)(x)\n"
            "run = F.fused_runner(gm, [x], constant=set(), fallback=gm.forward)\n"
            "assert torch.equal(run(x), fn(x))\n"
            "(k,) = F._KERNELS.values()\n"
            "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ASD_CACHE_DIR": str(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0"]  # loaded from Numba's cache, not compiled


def test_no_cache_dir_compiles_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("ASD_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # (where the default folder would be)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(fused_loops, "_KERNELS", {})
    monkeypatch.chdir(tmp_path)
    x = torch.rand(64, dtype=torch.float64)
    gm, run = _runner(lambda x: torch.stack([x * 0.987654321, x - 1]), [x], set())
    _bits_agree(gm, run, [x])
    assert not os.listdir(tmp_path)


def test_a_kernel_file_of_other_content_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("ASD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fused_loops, "_KERNELS", {})
    x = torch.rand(64, dtype=torch.float64)
    gm = make_fx(lambda x: torch.stack([x * 0.5551, x]))(x)
    source = kernel_source(gm, [x], constant=set())[0]
    import hashlib

    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    os.makedirs(tmp_path / "fused")
    (tmp_path / "fused" / f"k_{digest}.py").write_text(source.replace("a0[i1]", "a0[0]"))  # corrupted
    run = fused_runner(gm, [x], constant=set(), fallback=gm.forward)
    _bits_agree(gm, run, [x])


# ---------------------------------------------------------------------------------- end to end
def _settled(op, x):
    for _ in range(traced.CALLS_BEFORE_TRACING + 2):
        op.values(x)
    products = getattr(op.state, "fused", None) or op.state.products
    return products.tracing.replay


def _prefer_fused(monkeypatch):
    monkeypatch.setattr(replay, "_seconds", lambda fn, x, seeds: 0.0 if fn.variant == "fused" else 1.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_brusselator_operator_replays_the_loop_nest_with_the_transforms_bits(monkeypatch, dtype, mode):
    _prefer_fused(monkeypatch)
    f, x = brusselator(32), brusselator_input(32).to(dtype)
    op = asd.prepare_jacobian(f, x, mode=mode, check=False)
    r = _settled(op, x)
    assert r.chosen == "fused", (r.timings, r.notes)
    reference = asd.prepare_jacobian(f, x, mode=mode, trace=False, check=False)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x2 = (torch.rand(x.shape, generator=g, dtype=torch.float64) * 3 - 1).to(dtype)
        got = op.values(x2)
        assert _same(got, reference.values(x2))
    if dtype == torch.float64:
        torch.testing.assert_close(op(x2).to_dense(), torch.func.jacfwd(f)(x2), rtol=1e-12, atol=1e-12)


def test_a_parameter_read_by_the_loop_is_read_at_each_call(monkeypatch):
    _prefer_fused(monkeypatch)
    monkeypatch.setattr(replay, "FUSED_MIN_ELEMENTS", 0)
    n = 256
    w = torch.nn.Parameter(torch.rand(2, n, dtype=torch.float64))

    def f(x):
        u, v = x.view(2, n).unbind(0)
        return torch.cat([w[0] * u * v + u * u, w[1] * v - u * v])

    x = torch.rand(2 * n, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, check=False)
    r = _settled(op, x)
    assert r.chosen == "fused", (r.timings, r.notes)
    products = getattr(op.state, "fused", None) or op.state.products
    with torch.no_grad():
        w.mul_(3.0)  # in place
        assert _same(r.fast(x, products.seeds), r.plain(x, products.seeds))
        w.data = w.data * 0.5 + 1.0  # another storage under the same parameter
        assert _same(r.fast(x, products.seeds), r.plain(x, products.seeds))
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x), rtol=1e-12, atol=1e-12)


def test_no_variant_is_built_for_a_graph_the_loop_cannot_hold(monkeypatch):
    """A graph whose work does not fold and whose operations (the Rosenbrock Hessian's
    ``slice_backward``) no loop nest holds builds no variant: folding one costs up to a second."""
    from asd.backends import specialize
    from asd.problems import rosenbrock

    built = []
    real = specialize.candidates
    monkeypatch.setattr(specialize, "candidates", lambda *a, **k: built.append(1) or real(*a, **k))
    x = torch.rand(20000, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, check=False)
    r = _settled(op, x)
    assert not built and set(r.timings) <= {"recorded"}, r.notes


def test_a_kernel_that_fails_at_its_first_call_costs_only_its_own_variant(monkeypatch):
    """Numba compiles at a kernel's first call, the variant's check: its failure must leave the
    other variants (and the replay) as they are, not disable the recording."""
    _prefer_fused(monkeypatch)

    def broken(source):
        def kernel(*arrays):
            raise TypeError("no kernel")
        return kernel

    monkeypatch.setattr(fused_loops, "_compile", broken)
    f, x = brusselator(32), brusselator_input(32)
    op = asd.prepare_jacobian(f, x, check=False)
    r = _settled(op, x)
    products = getattr(op.state, "fused", None) or op.state.products
    assert r is not None and not products.tracing.disabled
    assert "fused" not in r.timings and "folded" in r.timings, (r.timings, r.notes)
    assert any(n.startswith("fused: TypeError") for n in r.notes), r.notes
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x), rtol=1e-12, atol=1e-12)


def test_seeds_that_are_an_input_move_at_the_second_check_point(monkeypatch):
    """Seeds the variants read at each call (not constants they fold) are moved at the second
    check point as the point is: 0/1 rows would hide a variant reading the wrong ones."""
    seen = []
    real = replay._runner

    def spy(spec, example):
        run = real(spec, example)

        def wrapped(x, s):
            seen.append(s.clone())
            return run(x, s)

        wrapped.gm = run.gm
        return wrapped

    monkeypatch.setattr(replay, "_runner", spy)
    n = 4096
    idx = torch.arange(0, 3 * n, 2)

    def g(x, s):
        return torch.index_select((s * x + s).reshape(-1), 0, idx)

    x = torch.rand(n, dtype=torch.float64)
    s = (torch.rand(3, n, generator=torch.Generator().manual_seed(1)) < 0.5).double()
    gm = make_fx(g)(x, s)
    owned = tuple(t for t in replay.held_tensors(gm) if t.dtype == torch.int64)
    replay.eager_replay(gm, x, s, constant_seeds=False, owned=owned)
    assert len(seen) >= 2, "no variant was built"
    assert torch.equal(seen[0], s) and not torch.equal(seen[1], s)


def test_a_damaged_numba_cache_file_is_compiled_again(tmp_path, monkeypatch):
    """A truncated cache file raised at the kernel's first call in every process that loaded it
    (the variant lost for good); it is dropped and the kernel compiled again."""
    monkeypatch.setenv("ASD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fused_loops, "_KERNELS", {})
    x = torch.rand(64, dtype=torch.float64)

    def fn(x):
        return torch.stack([x * 0.314159, x + 2.0])

    gm, run = _runner(fn, [x], set())
    _bits_agree(gm, run, [x])
    cache = tmp_path / "fused" / "__pycache__"
    damaged = [cache / name for name in os.listdir(cache) if name.endswith(".nbc")]
    assert damaged
    for path in damaged:
        path.write_bytes(path.read_bytes()[:100])
    monkeypatch.setattr(fused_loops, "_KERNELS", {})  # as in another process
    for name in [m for m in sys.modules if m.startswith("asd_fused_")]:
        monkeypatch.delitem(sys.modules, name)
    gm, run = _runner(fn, [x], set())
    assert run is not None
    _bits_agree(gm, run, [x])
    assert all(path.stat().st_size > 100 for path in damaged if path.exists())
