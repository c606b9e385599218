"""Compiled operators: the recorded products specialized on the operator's constants
(asd.backends.specialize), compiled by Inductor without Dynamo and cached on disk
(asd.backends.compile_cache). The results equal dense AD, a changed function is never answered
by a stale graph, and a second process loads what the first compiled."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import asd
from asd.backends import compile_cache, traced
from asd.backends.specialize import _blocked, functional, lift, specialize
from asd.problems import brusselator, brusselator_input, rosenbrock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch, request):
    monkeypatch.setenv("ASD_CACHE_DIR", str(tmp_path / "asd-cache"))
    monkeypatch.setattr(compile_cache, "_MEMORY", {})
    if request.node.get_closest_marker("aoti") is None:
        # Inductor's own artifacts: the same graphs, keys, guards and checks, without AOTInductor's
        # C++ wrapper (about 15 s of g++ per graph here). Tests marked aoti compile packages, the CPU
        # default, where the package format is what they check.
        monkeypatch.setattr(compile_cache, "AOTI", False)
    return tmp_path / "asd-cache" / "compiled"


AOTI = pytest.mark.aoti


def _tracing(op):
    state = op.state
    return (getattr(state, "fused", None) or state.products).tracing


def _stencil(x):
    u = x.reshape(6, 6)
    lap = torch.roll(u, 1, 0) + torch.roll(u, -1, 0) + torch.roll(u, 1, 1) + torch.roll(u, -1, 1) - 4 * u
    return (u ** 2 * torch.sin(u) + 3.0 * lap).reshape(-1)


def _padded(x):
    y = torch.nn.functional.pad(x[1:] * x[:-1], (1, 2), value=0.5)
    return torch.cat([y * 2, torch.tanh(x[::2])]) + torch.where(y.sum() > 0, 1.0, -1.0)


def _softmax_cumsum(x):
    return torch.softmax(x.reshape(4, 9), dim=1).cumsum(1).reshape(-1) * x


def _captured():
    W = torch.randn(36, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    return lambda x: torch.tanh(x * W)[1:] - x[:-1] ** 3


# Every case runs Inductor (seconds each): the default suite keeps the reverse-mode stencil (Inductor's
# artifacts) and the forward-mode Brusselator (with its fused gather, as an AOTInductor package), the
# rest run under -m slow.
_SLOW = pytest.mark.slow
JACOBIANS = [pytest.param("stencil", _stencil, "forward", id="stencil", marks=_SLOW),
             pytest.param("stencil-rev", _stencil, "reverse", id="stencil-rev"),
             pytest.param("padded", _padded, "forward", id="padded", marks=_SLOW),
             pytest.param("padded-rev", _padded, "reverse", id="padded-rev", marks=_SLOW),
             pytest.param("softmax-cumsum", _softmax_cumsum, "forward", id="softmax-cumsum", marks=_SLOW),
             pytest.param("captured", _captured(), "forward", id="captured", marks=_SLOW),
             pytest.param("brusselator", brusselator(6), "forward", id="brusselator", marks=AOTI)]


@pytest.mark.parametrize("name,f,mode", JACOBIANS)
def test_compiled_jacobians_equal_dense_ad(name, f, mode, monkeypatch):
    x = torch.randn(72 if name == "brusselator" else 36, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, mode=mode, compile=True)
        for seed in (1, 2, 3):
            z = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(op(z).to_dense(), torch.func.jacrev(f)(z), rtol=1e-10, atol=1e-10)
    tracing = _tracing(op)
    assert tracing.compiled is not None and not tracing.disabled, tracing.error
    _lean_path_gives_the_full_paths_bits(op, z, monkeypatch)


def _lean_path_gives_the_full_paths_bits(op, z, monkeypatch):
    """A settled compiled operator's next call replays its products by the lean path
    (``_SparseOperator._steady_values``), with the bits the full path gives."""
    from asd.operators import _SparseOperator

    answered = []
    real = _SparseOperator._steady_values

    def steady(self, x):
        out = real(self, x)
        answered.append(out is not None)
        return out

    monkeypatch.setattr(_SparseOperator, "_steady_values", steady)
    lean = op.values(z)
    monkeypatch.setattr(_SparseOperator, "_steady_values", lambda self, x: None)
    assert answered == [True] and torch.equal(lean, op.values(z))


# star in the default suite: its products go through both CPU rewrites (padded sums as segments, the
# gather after the kernels); acyclic (the same products, then substitution) under -m slow
@AOTI
@pytest.mark.parametrize("coloring", ["star", pytest.param("acyclic", marks=_SLOW)])
def test_compiled_hessians_equal_dense_ad(coloring, monkeypatch):
    x = torch.rand(30, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    h = lambda z: rosenbrock(z) + (torch.sin(z[::3]) ** 2).sum()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_hessian(h, x, coloring=coloring, compile=True)
        for z in (x, x * 1.5 - 0.3):
            torch.testing.assert_close(op(z).to_dense(), torch.func.hessian(h)(z), rtol=1e-10, atol=1e-10)
    compiled = _tracing(op).compiled
    assert compiled is not None
    _lean_path_gives_the_full_paths_bits(op, x * 0.5, monkeypatch)
    notes = " ".join(compiled.notes)
    assert "segments" in notes, notes
    if coloring == "star":
        assert "gather after the kernels" in notes and compiled.gather is not None, notes


def test_kernels_for_two_threads_keep_the_gather(monkeypatch):
    """Kernels generated for two threads gather the stored entries themselves (a gather after them
    would run on one thread, reading what the other thread wrote): the same Hessian."""
    x = torch.rand(30, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op = asd.prepare_hessian(rosenbrock, x, coloring="star", compile=True)
            for z in (x, x * 1.5 - 0.3):
                torch.testing.assert_close(op(z).to_dense(), torch.func.hessian(rosenbrock)(z), rtol=1e-10, atol=1e-10)
        compiled = _tracing(op).compiled
        assert compiled is not None
        _lean_path_gives_the_full_paths_bits(op, x * 0.5, monkeypatch)
    finally:
        torch.set_num_threads(threads)
    notes = " ".join(compiled.notes)
    assert "gather in the kernels (2 threads)" in notes and "gather after" not in notes, notes
    assert compiled.gather is None


def test_the_brusselator_gather_is_pushed_into_the_products():
    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x, mode="forward", compile=True)
    J = op(x)
    torch.testing.assert_close(J.to_dense(), torch.func.jacfwd(f)(x))
    notes = " ".join(_tracing(op).compiled.notes)
    assert "pushed" in notes, notes


def test_changed_closure_values_are_seen():
    p = {"scale": 2.0}
    f = lambda x: torch.roll(x, 1) * x * p["scale"]  # noqa: E731
    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, compile=True)
    for s in (2.0, 5.0, -1.0):
        p["scale"] = s
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))


def test_captured_tensors_are_read_by_reference():
    state = {"W": torch.rand(12, dtype=torch.float64)}
    f = lambda x: torch.tanh(x * state["W"]) + torch.roll(x, 1) ** 2  # noqa: E731
    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode="forward", compile=True)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    state["W"].mul_(3.0)  # in place: neither folded nor baked into the compiled graph
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    state["W"] = torch.rand(12, dtype=torch.float64)  # rebound: the fingerprint changes
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))


def test_results_of_a_constant_jacobian_are_not_shared():
    A = torch.randn(5, 8, dtype=torch.float64)
    f = lambda x: A @ x  # noqa: E731 - linear: every product folds into a constant
    x = torch.rand(8, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, compile=True)
        v = op.values(x)
        v.mul_(0.0)  # the caller owns the values it got
        torch.testing.assert_close(op(x).to_dense(), A)


def test_inputs_that_require_grad_are_evaluated_by_the_transforms():
    f = lambda x: torch.roll(x, 1) * x  # noqa: E731
    x = torch.rand(10, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x.detach(), compile=True)
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x.detach()))


# -- the specialization pass on its own -------------------------------------------------------------

def _recorded(f, x, seeds, index):
    def fn(a, s):
        products = torch.func.vmap(lambda t: torch.func.jvp(f, (a,), (t,))[1])(s)
        return products.reshape(-1).index_select(0, index)
    return make_fx(fn)(x, seeds)


@pytest.mark.parametrize("f", [_stencil, _padded, _softmax_cumsum], ids=["stencil", "padded", "softmax"])
def test_specialized_graphs_compute_what_the_recorded_ones_do(f):
    x = torch.randn(36, dtype=torch.float64)
    m = f(x).numel()
    seeds = torch.zeros(4, 36, dtype=torch.float64)
    seeds[torch.arange(36) % 4, torch.arange(36)] = 1.0
    index = torch.randperm(4 * m)[: 3 * m // 2].sort().values
    gm = functional(_recorded(f, x, seeds, index), [x, seeds])
    spec = specialize(gm, [x, seeds], constant_inputs=[1], owned=[index])
    assert spec.runtime == [0]  # the seeds are folded away
    for z in (x, torch.randn(36, dtype=torch.float64)):
        want, got = gm(z, seeds), spec.gm(*spec.arguments([z, seeds]))
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_a_rewriting_that_reads_wrong_elements_is_refused_at_a_symmetric_example(monkeypatch):
    """At x = ones a rewritten graph reading x reversed agrees with the recorded one; the check at a
    random point near the example refuses it (the recorded graph is kept, lifted)."""
    from asd.backends import specialize as spec_module
    from graph_edits import read_input_reversed

    real = spec_module._candidate

    def reversed_input(rw, root, push):
        spec = real(rw, root, push)
        read_input_reversed(spec.gm)
        return spec

    monkeypatch.setattr(spec_module, "_candidate", reversed_input)
    x = torch.ones(36, dtype=torch.float64)
    seeds = torch.zeros(4, 36, dtype=torch.float64)
    seeds[torch.arange(36) % 4, torch.arange(36)] = 1.0
    index = torch.arange(0, 4 * 34, 3)
    gm = functional(_recorded(_stencil, x, seeds, index), [x, seeds])
    spec = specialize(gm, [x, seeds], constant_inputs=[1], owned=[index])
    assert spec.runtime == [0, 1] and any("disagrees" in n for n in spec.notes), spec.notes
    z = torch.randn(36, dtype=torch.float64)
    torch.testing.assert_close(spec.gm(*spec.arguments([z, seeds])), gm(z, seeds), rtol=0, atol=0)


def test_graphs_that_write_in_place_are_only_lifted():
    def fn(a, s):
        y = a * 2
        y.add_(1.0)
        return (y * s).sum(1)
    x, s = torch.rand(5, dtype=torch.float64), torch.eye(5, dtype=torch.float64)
    spec = specialize(make_fx(fn)(x, s), [x, s], constant_inputs=[1])
    assert spec.runtime == [0, 1] and any("in-place" in n for n in spec.notes)
    torch.testing.assert_close(spec.gm(*spec.arguments([x, s])), fn(x, s))


def test_lift_makes_attribute_tensors_inputs_read_by_reference():
    W = torch.rand(4, dtype=torch.float64)
    gm = make_fx(lambda a: a * W)(torch.rand(4, dtype=torch.float64))
    spec = lift(gm, [torch.rand(4)])
    assert not any(n.op == "get_attr" for n in spec.gm.graph.nodes)
    assert spec.extras[0] is W


# -- the on-disk cache ------------------------------------------------------------------------------

def _graph(scale=2.0, n=6):
    x = torch.rand(n, dtype=torch.float64)
    gm = make_fx(lambda a: torch.sin(a) * scale + a.roll(1))(x)
    return gm, [x]


def test_keys_follow_the_graph_and_the_inputs():
    gm, inputs = _graph()
    assert compile_cache.graph_key(gm, inputs) == compile_cache.graph_key(_graph()[0], inputs)
    assert compile_cache.graph_key(_graph(scale=3.0)[0], inputs) != compile_cache.graph_key(gm, inputs)
    assert compile_cache.graph_key(gm, [torch.rand(6, dtype=torch.float32)]) != compile_cache.graph_key(gm, inputs)
    strided = torch.rand(12, dtype=torch.float64)[::2]
    assert compile_cache.graph_key(gm, [strided]) != compile_cache.graph_key(gm, inputs)


def test_kernels_without_index_tensors_are_vectorized_past_the_tiling_heuristic(monkeypatch):
    # the pushed Brusselator graph broadcasts each row's value over its entries (u[i // 6]):
    # Inductor's heuristic made that kernel a scalar loop (49 us instead of 27 at N=64)
    import torch._inductor.config as inductor_config
    from torch._inductor.codegen import cpp as inductor_cpp

    seen, heuristics = [], []
    real, real_tiling = compile_cache.compile_graph, inductor_cpp.TilingSelect.select_tiling

    def spy(gm, args, **kw):
        seen.append(gm)
        return real(gm, args, **kw)

    def tiling(self, *args, **kw):  # what Inductor's code generation reads
        heuristics.append(inductor_config.cpp.enable_tiling_heuristics)
        return real_tiling(self, *args, **kw)

    monkeypatch.setattr(compile_cache, "compile_graph", spy)
    monkeypatch.setattr(inductor_cpp.TilingSelect, "select_tiling", tiling)
    f, x = brusselator(8), brusselator_input(8)
    with inductor_config.patch(force_disable_caches=True):  # generated here, not read from Inductor's cache
        op = asd.prepare_jacobian(f, x, mode="forward", compile=True)
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    assert seen and compile_cache.kernel_options(seen[-1]) == {"cpp.enable_tiling_heuristics": False}
    assert heuristics and not any(heuristics)  # applied while compiling
    assert inductor_config.cpp.enable_tiling_heuristics  # and restored
    # a gather through an index tensor keeps Inductor's own choice
    gathering = make_fx(lambda v, i: v.index_select(0, i) * 2.0)(torch.rand(5, dtype=torch.float64),
                                                                   torch.tensor([0, 2, 4]))
    assert compile_cache.kernel_options(gathering) == {}
    # the options are part of the key
    gm, inputs = seen[-1], [x.reshape(-1)] + list(_tracing(op).compiled.extras)
    key = compile_cache.graph_key(gm, inputs)
    monkeypatch.setattr(compile_cache, "kernel_options", lambda g: {})
    assert compile_cache.graph_key(gm, inputs) != key


@AOTI
def test_artifacts_are_saved_loaded_and_checked(private_cache):
    gm, inputs = _graph()
    first = compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))
    assert first.source == "compiled" and os.path.isfile(first.path)
    assert first.path.endswith(".pt2" if compile_cache._aoti_available() else ".bin")
    compile_cache._MEMORY.clear()
    second = compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))
    assert second.source == "loaded" and second.key == first.key
    z = torch.rand(6, dtype=torch.float64)
    torch.testing.assert_close(second(z), gm(z))
    assert compile_cache.compile_graph(gm, inputs).source == "memory"


@AOTI
@pytest.mark.parametrize("damage", ["garbage", pytest.param("truncated", marks=_SLOW), pytest.param("empty", marks=_SLOW)])
def test_a_corrupt_artifact_is_compiled_again(private_cache, damage):
    gm, inputs = _graph(scale=1.25)
    if damage == "truncated":
        path = compile_cache.compile_graph(gm, inputs).path
        data = open(path, "rb").read()
    else:  # no good artifact needed first: the file the key names holds the damage
        private_cache.mkdir(parents=True)
        ext = ".pt2" if compile_cache._aoti_available() else ".bin"
        path, data = str(private_cache / f"{compile_cache.graph_key(gm, inputs)}{ext}"), b""
    with open(path, "wb") as fh:
        fh.write({"garbage": b"not an artifact" * 10, "truncated": data[: len(data) // 2], "empty": b""}[damage])
    compile_cache._MEMORY.clear()
    again = compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))
    assert again.source == "compiled" and again.note and "not used" in again.note
    torch.testing.assert_close(again(*inputs), gm(*inputs))
    compile_cache._MEMORY.clear()
    assert compile_cache.compile_graph(gm, inputs).source == "loaded"  # replaced by a good one


@pytest.mark.parametrize("fmt", ["inductor", pytest.param("aoti", marks=[AOTI, _SLOW])])
def test_an_artifact_computing_something_else_is_not_served(private_cache, monkeypatch, fmt):
    gm, inputs = _graph(scale=0.5)
    stored = compile_cache.compile_graph(gm, inputs).path
    assert stored.endswith(".pt2" if fmt == "aoti" and compile_cache._aoti_available() else ".bin")
    compile_cache._MEMORY.clear()
    for loader in ("_load", "_aoti_load"):  # whichever format was stored, it now computes f + 1
        real = getattr(compile_cache, loader)
        monkeypatch.setattr(compile_cache, loader,
                            lambda path, real=real: (lambda art: (lambda *a: art(*a) + 1.0))(real(path)))
    again = compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))
    assert again.source == "compiled" and "not used" in again.note
    torch.testing.assert_close(again(*inputs), gm(*inputs))


def test_an_empty_cache_dir_turns_the_disk_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv("ASD_CACHE_DIR", "")
    assert compile_cache.cache_dir() is None
    gm, inputs = _graph(scale=0.75)
    c = compile_cache.compile_graph(gm, inputs)
    assert c.source == "compiled" and c.path is None


def test_a_failing_compiler_falls_back_to_eager_with_a_warning(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("compiler exploded")

    monkeypatch.setattr(compile_cache, "compile_graph", broken)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (lambda *a, **k: broken()))
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True)
    with pytest.warns(RuntimeWarning, match="not compiled"):
        J = op(x)
    torch.testing.assert_close(J.to_dense(), torch.func.jacrev(f)(x))
    assert "compiler exploded" in _tracing(op).error and "compiler exploded" in _tracing(op).compile_refused


def test_compiled_products_failing_at_a_later_call_are_evaluated_by_the_transforms(monkeypatch):
    """A compiled graph that answered its first call and raises at a later one: the caller got
    the exception. Now that call and the later ones go to the plain transforms, with one warning."""
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True)
    op(x)
    tracing = _tracing(op)
    assert tracing.compiled is not None and tracing.graphs

    def broken(self, *a):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(compile_cache.CompiledProducts, "__call__", broken)
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile was used"))
    x2 = brusselator_input(4, seed=3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        J = op(x2)
    # one warning (there were two, the second saying the products were not compiled)
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == [
        "asd: the compiled graph failed at a later call (RuntimeError: kernel failed); evaluating them without "
        "compilation"]
    torch.testing.assert_close(J.to_dense(), torch.func.jacfwd(f)(x2))
    assert tracing.disabled and tracing.failed_later and not tracing.unrecordable
    assert tracing.compile_refused == "RuntimeError: kernel failed" and tracing.compiled is None and not tracing.graphs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))


def test_a_compiler_error_without_a_message_is_reported_by_its_type(monkeypatch):
    def broken(*a, **k):
        raise AssertionError

    monkeypatch.setattr(compile_cache, "compile_graph", broken)
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True)
    with pytest.warns(RuntimeWarning, match=r"not compiled \(AssertionError\)"):
        J = op(x)  # the handler itself raised IndexError on the empty message
    torch.testing.assert_close(J.to_dense(), torch.func.jacfwd(f)(x))
    assert _tracing(op).compile_refused == "AssertionError"


def test_refused_compiled_products_are_evaluated_without_torch_compile(monkeypatch):
    """Compiled products that fail or are refused (their check, a tensor Inductor would read wrong)
    are evaluated by the plain transforms with a warning: torch.compile of the transforms runs
    Inductor's kernels too, and shares what made them wrong."""
    def never(*a, **k):
        raise AssertionError("torch.compile was used after the compiled products were refused")

    monkeypatch.setattr(torch, "compile", never)
    monkeypatch.setattr(compile_cache, "compile_graph",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("its result differs")))
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True)
    with pytest.warns(RuntimeWarning, match="not compiled"):
        J = op(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # warned once
        for _ in range(2):
            torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    torch.testing.assert_close(J.to_dense(), torch.func.jacrev(f)(x))


def test_a_failing_graph_pass_after_recording_is_not_taken_for_an_unrecordable_function(monkeypatch):
    """The products were recorded; asd's own pass over the graph failed: that is no reason to hand
    the function to torch.compile (kept for functions that cannot be recorded)."""
    from asd.backends import graph_passes

    def never(*a, **k):
        raise AssertionError("torch.compile was used")

    monkeypatch.setattr(torch, "compile", never)
    monkeypatch.setattr(graph_passes, "simplify", lambda gm: (_ for _ in ()).throw(RuntimeError("pass failed")))
    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile=True)
    with pytest.warns(RuntimeWarning, match="not compiled"):
        J = op(x)
    torch.testing.assert_close(J.to_dense(), torch.func.jacfwd(f)(x))
    assert not _tracing(op).unrecordable and "pass failed" in _tracing(op).compile_refused


def test_a_tensor_with_the_negation_bit_is_not_compiled():
    """``conj().imag`` is a view with PyTorch's lazy negation bit, which Inductor's kernels (and
    torch.compile's) ignored: the compiled Jacobian had the wrong sign at every call."""
    g = torch.Generator().manual_seed(0)
    B = torch.randn(6, dtype=torch.complex128, generator=g).conj().imag
    assert B.is_neg()
    f = lambda x: torch.sin(x) * B  # noqa: E731
    x = torch.randn(6, dtype=torch.float64, generator=g)
    op = asd.prepare_jacobian(f, x, compile=True)
    with pytest.warns(RuntimeWarning, match="negation"):
        J = op(x)
    torch.testing.assert_close(J.to_dense(), torch.func.jacfwd(f)(x), rtol=0, atol=0)
    torch.testing.assert_close(op(x * 2.0).to_dense(), torch.func.jacfwd(f)(x * 2.0), rtol=0, atol=0)
    assert "negation" in _tracing(op).compile_refused and _tracing(op).compiled is None
    assert compile_cache.tensor_layout(B) != compile_cache.tensor_layout(B.resolve_neg())


def test_a_call_recording_gradients_is_not_sent_to_torch_compile(monkeypatch):
    """A compiled operator evaluates a call whose input requires grad by the transforms (compiled
    kernels record no gradient), not by torch.compile of them, whose kernels ignored the negation
    bit as Inductor's do (a wrong first Jacobian, without a warning)."""
    def never(*a, **k):
        raise AssertionError("torch.compile was used")

    monkeypatch.setattr(torch, "compile", never)
    g = torch.Generator().manual_seed(1)
    B = torch.randn(6, dtype=torch.complex128, generator=g).conj().imag
    f = lambda x: torch.sin(x) * B  # noqa: E731
    x = torch.randn(6, dtype=torch.float64, generator=g)
    op = asd.prepare_jacobian(f, x, compile=True)
    J = op(x.clone().requires_grad_())
    assert J.values().requires_grad
    torch.testing.assert_close(J.to_dense().detach(), torch.func.jacfwd(f)(x), rtol=0, atol=0)


def test_torch_compile_products_are_checked_at_their_first_call():
    """Where compile=True goes through torch.compile (trace=False; a Hessian's value and gradient
    with its products), the first compiled result is checked against the uncompiled one: a tensor
    with the negation bit gave the wrong sign at every call."""
    g = torch.Generator().manual_seed(2)
    B = torch.randn(6, dtype=torch.complex128, generator=g).conj().imag
    x = torch.randn(6, dtype=torch.float64, generator=g)
    f = lambda x: torch.sin(x) * B  # noqa: E731
    op = asd.prepare_jacobian(f, x, compile=True, trace=False)
    with pytest.warns(RuntimeWarning, match="differ from the uncompiled"):
        J = op(x)
    torch.testing.assert_close(J.to_dense(), torch.func.jacfwd(f)(x))
    torch.testing.assert_close(op(x * 2.0).to_dense(), torch.func.jacfwd(f)(x * 2.0))
    h = lambda z: (torch.sin(z) * B).sum() + (z ** 3).sum()  # noqa: E731
    H = asd.prepare_hessian(h, x, compile=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for z in (x, x, x * 0.5):
            value, grad, hess = H.value_grad_hessian(z)
            torch.testing.assert_close(hess.to_dense(), torch.func.hessian(h)(z))
            torch.testing.assert_close(grad, torch.func.grad(h)(z))


def test_results_are_compared_at_their_precision_and_scale():
    """A compiled result is checked against the graph's up to rounding, bfloat16 at its 8 bits,
    relative to the result's own scale (the inputs' could hide a wrong kernel: a result that cancels
    to rounding noise is refused and evaluated uncompiled)."""
    b = torch.linspace(-3, 3, 64, dtype=torch.float64).to(torch.bfloat16)
    assert compile_cache._close(b * (1 + 2 ** -8), b)
    assert not compile_cache._close(-b, b) and not compile_cache._close(b.roll(1), b)  # wrong kernels
    assert not compile_cache._close(b.double() * (1 + 1e-5), b.double())
    assert compile_cache._close(torch.tensor([2.0, 1e-9]), torch.tensor([2.0, 0.0]))
    assert not compile_cache._close(torch.tensor([2e-4, 0.0]), torch.zeros(2))


_CHILD = textwrap.dedent("""
    import json, sys, time, warnings
    import torch
    import asd
    from asd.problems import brusselator, brusselator_input
    from asd.backends import compile_cache
    from asd.backends.compile_cache import STATS
    compile_cache.AOTI = sys.argv[1] == "aoti"
    f, x = brusselator(5), brusselator_input(5)
    op = asd.prepare_jacobian(f, x, compile=True)
    values = op.values(x)
    state = op.state
    tracing = (getattr(state, "fused", None) or state.products).tracing
    print(json.dumps(dict(source=tracing.compiled.compiled.source, stats=STATS.as_dict(),
                          values=values.tolist())))
""")


# the CPU default (AOTInductor packages, about 15 s of g++ per graph) under -m slow; test_artifacts_are_
# saved_loaded_and_checked loads a package
@pytest.mark.parametrize("fmt", ["inductor", pytest.param("aoti", marks=_SLOW)])
def test_a_second_process_loads_what_the_first_compiled(tmp_path, fmt):
    env = dict(os.environ, ASD_CACHE_DIR=str(tmp_path / "shared"), PYTHONPATH=ROOT)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CHILD, fmt], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["source"] == "compiled" and runs[0]["stats"]["compiled"] == 1
    assert runs[1]["source"] == "loaded" and runs[1]["stats"]["compiled"] == 0
    assert runs[0]["values"] == runs[1]["values"]


def test_inductor_artifacts_where_aotinductor_is_off(private_cache, monkeypatch):
    monkeypatch.setattr(compile_cache, "AOTI", False)
    gm, inputs = _graph(scale=1.5)
    first = compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))
    assert first.source == "compiled" and first.path.endswith(".bin")
    compile_cache._MEMORY.clear()
    second = compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))
    assert second.source == "loaded"
    torch.testing.assert_close(second(*inputs), gm(*inputs))


def test_inductor_artifacts_of_a_graph_reading_storage_offsets_are_compiled_afresh(private_cache):
    """Inductor's FX-graph and AOTAutograd caches key inputs by shape and strides, not storage
    offset: the kernels of ``as_strided(w, ..., 0)`` compiled for ``w`` at offset 0 were served to
    the same graph with ``w`` at offset 2, and read the wrong window (a wrong Jacobian, silently)."""
    buf = torch.rand(16, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    fn = lambda w: torch.as_strided(w, (6,), (1,), 0) * 2.0 + w  # noqa: E731
    gm = make_fx(fn)(buf[0:6])
    assert compile_cache.reads_storage_offsets(gm) and not compile_cache.reads_storage_offsets(_graph()[0])
    for start in (0, 2, 5):
        w = buf[start:start + 6]
        c = compile_cache.compile_graph(gm, [w], expected=gm(w))
        assert c.source == "compiled" and c.path is None and "caches off" in c.note
        torch.testing.assert_close(c(w), fn(w), rtol=0, atol=0)


def test_an_inductor_kernel_computing_something_else_is_compiled_afresh(private_cache, monkeypatch):
    """A freshly compiled Inductor artifact must reproduce the graph on the example inputs, as a
    loaded one must: one served wrong by Inductor's caches is compiled again with them off, and
    one that is still wrong raises (the operator then falls back to its uncompiled products)."""
    gm, inputs = _graph(scale=0.25)
    real = compile_cache._inductor
    calls = []

    def wrong_from_cache(gm, example_inputs, caches=True):
        calls.append(caches)
        art = real(gm, example_inputs, caches=caches)
        return (lambda *a: art(*a) + 1.0) if caches else art

    monkeypatch.setattr(compile_cache, "_inductor", wrong_from_cache)
    c = compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))
    assert calls == [True, False] and "computed something else" in c.note and c.path is None
    torch.testing.assert_close(c(*inputs), gm(*inputs), rtol=0, atol=0)
    compile_cache._MEMORY.clear()
    monkeypatch.setattr(compile_cache, "_inductor",
                        lambda gm, ex, caches=True: (lambda art: (lambda *a: art(*a) + 1.0))(real(gm, ex, caches=caches)))
    with pytest.raises(RuntimeError, match="something else"):
        compile_cache.compile_graph(gm, inputs, expected=gm(*inputs))

# -- recording without make_fx ----------------------------------------------------------------------

def test_recording_reproduces_the_transforms_bit_for_bit():
    from asd.backends.record import record

    W = torch.randn(36, dtype=torch.float64)
    f = lambda x: _softmax_cumsum(x) * W + _stencil(x)  # noqa: E731
    x = torch.randn(36, dtype=torch.float64)
    seeds = torch.eye(36, dtype=torch.float64)[:5]
    fns = {"jvp": lambda a, s: torch.func.vmap(lambda t: torch.func.jvp(f, (a,), (t,))[1])(s),
           "vjp": lambda a, s: torch.func.vmap(torch.func.vjp(f, a)[1])(s)[0],
           "hvp": lambda a, s: torch.func.vmap(lambda t: torch.func.jvp(torch.func.grad(lambda z: f(z).sum()),
                                                                         (a,), (t,))[1])(s)}
    for name, fn in fns.items():
        gm = record(fn, x, seeds)
        assert not any(n.op == "call_function" and "dynamo" in str(n.target) for n in gm.graph.nodes)
        z = torch.randn(36, dtype=torch.float64)
        assert torch.equal(gm(z, seeds), fn(z, seeds)), name
        assert any(getattr(gm, n.target) is W for n in gm.graph.nodes if n.op == "get_attr"), name  # by reference


def test_recording_refuses_values_baked_into_the_graph():
    from asd.backends.record import RecordingError, record

    with pytest.raises(RecordingError):
        record(lambda a: a * a.sum().item(), torch.rand(4))
    with pytest.raises(RecordingError):
        record(lambda a: a * float(a.max()), torch.rand(4))
    with pytest.raises(RecordingError):
        record(lambda a: a[: int(torch.nonzero(a > 0.5).shape[0])].sum() * a, torch.rand(4))


def test_the_cache_evicts_the_least_recently_used(private_cache, monkeypatch):
    import time as _time

    monkeypatch.setattr(compile_cache, "AOTI", False)  # small, quick artifacts
    paths = []
    for scale in (1.1, 1.2, 1.3):
        gm, inputs = _graph(scale=scale)
        paths.append(compile_cache.compile_graph(gm, inputs).path)
        _time.sleep(0.05)
    size = os.path.getsize(paths[0])
    os.utime(paths[0])  # used again: the second one is now the oldest
    monkeypatch.setenv("ASD_CACHE_MAX_MB", str(2.5 * size / (1 << 20)))
    gm, inputs = _graph(scale=1.4)
    newest = compile_cache.compile_graph(gm, inputs).path
    assert os.path.isfile(newest) and os.path.isfile(paths[0])
    assert not os.path.isfile(paths[1]) and not os.path.isfile(paths[2])


@pytest.mark.slow  # Inductor compiles twice (about 11 s)
def test_chunks_of_seed_rows_share_one_compiled_graph():
    x = torch.rand(24, dtype=torch.float64)
    g = lambda z: (z[1:] * z[:-1]).exp().sum() + z.cumsum(0).sin().sum()  # noqa: E731 - dense Hessian
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_hessian(g, x, compile=True, batch_size=5)  # 24 colors: chunks of 5 and one of 4
        z = torch.rand(24, dtype=torch.float64)
        torch.testing.assert_close(op(z).to_dense(), torch.func.hessian(g)(z))
    assert len(_tracing(op).graphs) == 2  # one per chunk shape, not one per chunk


def test_the_key_follows_settings_changed_between_compilations():
    """Inductor's configuration and the float32 matmul precision may change during a program: the
    key is read again each time, so an artifact built under other settings is not served."""
    import torch._inductor.config as inductor_config

    from asd.backends.compile_cache import graph_key
    from torch.fx.experimental.proxy_tensor import make_fx

    a = torch.rand(3, dtype=torch.float64)
    gm = make_fx(lambda v: v.sin() * 2)(a)
    k0 = graph_key(gm, [a])
    assert graph_key(gm, [a]) == k0
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium" if old != "medium" else "high")
        assert graph_key(gm, [a]) != k0
    finally:
        torch.set_float32_matmul_precision(old)
    assert graph_key(gm, [a]) == k0
    with inductor_config.patch(max_autotune=not inductor_config.max_autotune):
        assert graph_key(gm, [a]) != k0
    assert graph_key(gm, [a]) == k0


def test_aotinductor_only_where_its_loader_was_seen_to_work(monkeypatch):
    """On torch 2.11, in a process that had used CUDA, AOTInductor's package loader killed the
    process (H200 machine, benchmarks/gpu.py): there Inductor's own artifact is stored."""
    if not (hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "AOTIModelPackageLoader")):
        pytest.skip("this torch has no AOTInductor loader")
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert compile_cache._aoti_available()
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert not compile_cache._aoti_available()
    monkeypatch.setattr(torch, "__version__", "2.14.1")
    assert compile_cache._aoti_available()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not compile_cache._aoti_available()


def test_reduce_overhead_on_the_cpu_is_compile():
    """compile="reduce-overhead" captures CUDA graphs on a GPU only (tests/test_gpu.py); on the
    CPU it is compile=True."""
    from asd.backends.cudagraph import graphed

    f, x = brusselator(4), brusselator_input(4)
    op = asd.prepare_jacobian(f, x, compile="reduce-overhead")
    tracing = _tracing(op)
    assert tracing.compile and tracing.cuda_graphs
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    assert tracing.compiled is not None and tracing.cuda_graph_error is None
    fn = lambda a, b: a  # noqa: E731
    assert graphed(fn, x, x[None], constant_seeds=True) == (fn, "not a CUDA input")


def test_parameters_that_require_grad_keep_their_gradient():
    """Compiled kernels record no autograd graph: with a parameter of f that requires grad the
    products go through the transforms, and the result carries the parameter's gradient (it was
    silently dropped: values that did not require grad)."""
    w = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)

    def f(x):
        return torch.sin(x) * w + x.roll(1) * x

    x = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, mode="forward", compile=True)
        for _ in range(3):
            J = op(x)
    assert J.values().requires_grad
    got, = torch.autograd.grad(J.to_dense().sum(), w)
    want, = torch.autograd.grad(torch.autograd.functional.jacobian(f, x, create_graph=True).sum(), w)
    torch.testing.assert_close(got, want)
    with torch.no_grad():  # no gradient wanted: the compiled kernels
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    assert _tracing(op).compiled is not None


def test_a_captured_tensor_whose_strides_change_is_compiled_anew():
    """Compiled kernels are specialized on the strides of the tensors they read: W.t_() keeps the
    tensor object, address and shape (the value guard sees nothing), so the operator must compile
    again, not run the old kernels (a wrong Jacobian, silently) nor switch strategy."""
    W = torch.rand(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def f(x):
        return torch.tanh(W @ x) + x.roll(1) * x

    x = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    op = asd.prepare_jacobian(f, x, mode="forward", compile=True)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    strategy = op.strategy
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        W.t_()
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
        W.data = W.data.t().contiguous().t()  # other strides again, under the same object
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    assert op.strategy == strategy and _tracing(op).compiled is not None


@pytest.mark.parametrize("mode", ["forward", pytest.param("reverse", marks=_SLOW)])
def test_a_parameter_moved_to_another_storage_offset(mode):
    """``as_strided`` counts from the storage, compiled kernels from the pointer they are given: a
    parameter rebound to other windows of one buffer must be compiled again (then, when it moves
    at every call, evaluated by the plain transforms: torch.compile's guards miss it as well)."""
    buf = torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    w = buf[0:12].clone()

    def f(x):
        return torch.sin(x) * w.as_strided((12,), (1,), 0) + x.roll(1) * x

    x = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, mode=mode, compile=True)
        w.data = buf[0:12]
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
        w.data = buf[2:14]  # compiled again
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
        assert not _tracing(op).layout_unstable
        _tracing(op).relayouts = traced.MAX_MISSES  # as after more moves: the next one ends tracing
        for k in (4, 5, 8):
            w.data = buf[k:k + 12]
            torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    assert _tracing(op).layout_unstable


def _view_gather(flat: torch.Tensor, start: int, block) -> torch.Tensor:
    """The view ``specialize`` builds for a gather ``_blocked`` recognizes (see its ``_gather``)."""
    m, r, tiled = block
    part = flat[start:start + m]
    return (part.reshape(1, m).expand(r, m) if tiled else part.reshape(m, 1).expand(m, r)).reshape(-1)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.booleans(), st.integers(0, 3),
       st.lists(st.integers(-1, 2), max_size=2))
def test_blocked_gathers_are_views_reading_the_same_elements(m, r, tiled, start, edits):
    """A gather whose index repeats each element (or the whole run) is read as a broadcast view;
    an index that is not exactly such a run (edited at random places) is left a gather."""
    rel = torch.arange(m).repeat(r) if tiled else torch.arange(m).repeat_interleave(r)
    for e in edits:
        k = abs(e * 7 + m) % rel.numel()
        rel[k] = max(int(rel[k]) + e, 0)
    if int(rel.min()) != 0:
        return
    flat = torch.randn(start + m + 4, dtype=torch.float64)
    block = _blocked(rel)
    if block is None:
        exact = (torch.arange(m).repeat(r), torch.arange(m).repeat_interleave(r))
        assert not any(torch.equal(rel, e) for e in exact) or rel.numel() < 2 or int(rel.max()) == 0
        return
    assert torch.equal(_view_gather(flat, start, block), flat[start + rel])


def test_the_brusselator_reads_its_input_without_an_index(monkeypatch):
    """Every CSR row of the Brusselator's Jacobian reads its own grid point: the compiled values read
    u and v as broadcast views (no index per value: 17% of the kernel) and give dense AD's values."""
    graphs = []
    compile_graph = compile_cache.compile_graph

    def spy(gm, example_inputs, **kw):
        graphs.append(gm)
        return compile_graph(gm, example_inputs, **kw)

    monkeypatch.setattr(compile_cache, "compile_graph", spy)
    f, x = brusselator(8), brusselator_input(8)
    op = asd.prepare_jacobian(f, x, mode="forward", compile=True)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    c = _tracing(op).compiled
    assert c.watched == () and c.layouts == []  # no tensor of f's: nothing to watch per call
    (gm,) = graphs
    targets = {n.target for n in gm.graph.nodes}
    assert torch.ops.aten.expand.default in targets
    assert not targets & {torch.ops.aten._unsafe_index.Tensor, torch.ops.aten.index.Tensor,
                          torch.ops.aten.index_select.default}


@pytest.mark.parametrize("fn", [lambda x, s: x[2:7], lambda x, s: s[0, 1:9], lambda x, s: s[1:],
                                lambda x, s: x.reshape(2, 5)[:, :1].expand(2, 3).reshape(-1),
                                lambda x, s: torch.as_strided(x, (5,), (2,)),
                                lambda x, s: torch.split(x, 4)[1]],
                         ids=["slice", "seed-row", "seed-rows", "repeated", "as_strided", "split"])
def test_a_specialized_graph_never_returns_a_view_of_its_inputs(fn):
    """A result that reads a run of an input (a slice, a broadcast: views since gathers of
    consecutive or repeated elements are) is a fresh tensor: the caller owns what it gets."""
    x, s = torch.randn(10, dtype=torch.float64), torch.randn(3, 10, dtype=torch.float64)
    for constant in ([], [1]):
        spec = specialize(make_fx(fn)(x, s), [x, s], constant_inputs=constant)
        out = spec.gm(*spec.arguments([x, s]))
        torch.testing.assert_close(out, fn(x, s).reshape(out.shape), rtol=0, atol=0)
        ptr = out.untyped_storage().data_ptr()
        assert ptr not in (x.untyped_storage().data_ptr(), s.untyped_storage().data_ptr())


def test_only_the_tensors_f_reads_are_watched_per_call():
    """A compiled call checks the layout and requires_grad of the tensors f reads (parameters), not
    of the constants the specialization folded (the operator's own, read by nothing else)."""
    W = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    f = lambda x: torch.tanh(x * W) + torch.roll(x, 1) ** 2  # noqa: E731
    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode="forward", compile=True)
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacfwd(f)(x))
    c = _tracing(op).compiled
    assert len(c.watched) == 1 and c.watched[0] is W
    assert len(c.extras) > 1  # folded constants besides W, not watched
    W.requires_grad_(True)  # after compiling: this call records W's gradient through the transforms
    J = op(x)
    want = torch.func.jacfwd(f)(x)
    torch.testing.assert_close(J.to_dense(), want.detach())
    (g,) = torch.autograd.grad(J.values().sum(), W)
    torch.testing.assert_close(g, torch.autograd.grad(want.sum(), W)[0])


def test_a_watched_matrix_transposed_in_place_is_compiled_anew():
    """The watched parameter of a specialized (not only lifted) graph, a matrix, changes strides
    under the same object: the next calls give the new Jacobian."""
    W = torch.rand(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    f = lambda x: torch.tanh(W @ x) * x.roll(1)  # noqa: E731
    x = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, mode="reverse", compile=True)
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
        assert any(t is W for t in _tracing(op).compiled.watched)
        W.t_()
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
        W.t_()
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))


def test_the_kernels_thread_count_is_inductors():
    """Review: the gather's placement and the cache key follow the thread count Inductor generates
    kernels for, its ``cpp.threads`` where a user set it, PyTorch's otherwise."""
    import torch._inductor.config as inductor_config

    before = inductor_config.cpp.threads
    with inductor_config.patch({"cpp.threads": -1}):
        assert compile_cache.kernel_threads() == torch.get_num_threads()
    with inductor_config.patch({"cpp.threads": torch.get_num_threads() + 1}):
        assert compile_cache.kernel_threads() == torch.get_num_threads() + 1
    assert inductor_config.cpp.threads == before
