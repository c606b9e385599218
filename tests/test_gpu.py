"""The Jacobian and Hessian paths on a CUDA device, against dense torch.func on the same device.

Skipped without CUDA (``-m gpu`` selects them; tests/conftest.py adds the skip). The linear
algebra's CUDA tests are in tests/test_linalg_device.py.
"""

import warnings

import numpy as np
import pytest
import torch

import asd
from asd.problems import brusselator, brusselator_input

pytestmark = pytest.mark.gpu
F64 = torch.float64
CUDA = "cuda"


def chained_rosenbrock(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def _dense_jacobian(f, x):
    return torch.func.jacfwd(f)(x).reshape(-1, x.numel())


def _on_cuda(t: torch.Tensor) -> None:
    assert t.device.type == "cuda"
    if t.layout == torch.sparse_csr:
        assert t.crow_indices().device.type == "cuda" and t.col_indices().device.type == "cuda"
        assert t.values().device.type == "cuda"


def _x(N: int, seed: int) -> torch.Tensor:
    return brusselator_input(N, seed=seed).to(CUDA)


def test_detection_of_a_cuda_input_matches_the_host():
    f = brusselator(6)
    P_gpu = asd.jacobian_sparsity(f, _x(6, 0))
    P_cpu = asd.jacobian_sparsity(f, brusselator_input(6))
    assert (P_gpu != P_cpu).nnz == 0


@pytest.mark.parametrize("coloring", ["column", "row", "bidirectional"])
def test_jacobian_on_cuda_matches_dense(coloring):
    f = brusselator(8)
    x = _x(8, 1)
    J = asd.sparse_jacobian(f, x, coloring=coloring)
    _on_cuda(J)
    torch.testing.assert_close(J.to_dense(), _dense_jacobian(f, x))
    op = asd.prepare_jacobian(f, x, coloring=coloring)
    for seed in (2, 3):
        z = _x(8, seed)
        Jz = op(z)
        _on_cuda(Jz)
        torch.testing.assert_close(Jz.to_dense(), _dense_jacobian(f, z))


@pytest.mark.parametrize("coloring", ["star", "acyclic"])
def test_hessian_on_cuda_matches_dense(coloring):
    x = torch.rand(40, dtype=F64, device=CUDA)
    H = asd.sparse_hessian(chained_rosenbrock, x, coloring=coloring)
    _on_cuda(H)
    torch.testing.assert_close(H.to_dense(), torch.func.hessian(chained_rosenbrock)(x))
    op = asd.prepare_hessian(chained_rosenbrock, x, coloring=coloring)
    z = torch.rand(40, dtype=F64, device=CUDA)
    torch.testing.assert_close(op(z).to_dense(), torch.func.hessian(chained_rosenbrock)(z))


def test_prepared_call_keeps_matching_once_its_products_are_recorded():
    """Past the recording threshold the products replay a graph of ATen ops on the GPU."""
    f = brusselator(6)
    op = asd.prepare_jacobian(f, _x(6, 0), mode="forward")
    for i in range(60):
        z = _x(6, 100 + i)
        Jz = op(z)
    torch.testing.assert_close(Jz.to_dense(), _dense_jacobian(f, z))
    tracing = (getattr(op.state, "fused", None) or op.state.products).tracing
    assert tracing is not None and tracing.graphs, "the products were not recorded"


@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_compiled_jacobian_on_cuda(compile):
    f = brusselator(8)
    op = asd.prepare_jacobian(f, _x(8, 0), compile=compile)
    results = []
    for seed in (4, 5, 6):
        z = _x(8, seed)
        Jz = op(z)
        _on_cuda(Jz)
        results.append((z, Jz))
    for z, Jz in results:  # a later call leaves the earlier results as they were
        torch.testing.assert_close(Jz.to_dense(), _dense_jacobian(f, z))
    tracing = (getattr(op.state, "fused", None) or op.state.products).tracing
    assert tracing.compiled is not None, tracing.error
    if compile == "reduce-overhead":
        from asd.backends.cudagraph import CudaGraphed

        assert tracing.cuda_graph_error is None
        assert any(isinstance(g, CudaGraphed) for g in tracing.graphs.values())


def _graphed(op):
    from asd.backends.cudagraph import CudaGraphed

    tracing = (getattr(op.state, "fused", None) or op.state.products).tracing
    return [g for g in tracing.graphs.values() if isinstance(g, CudaGraphed)], tracing


def test_cuda_graph_sees_parameter_updates_and_moved_memory():
    """A replayed CUDA graph reads f's parameters by address: an in-place update is seen; a
    parameter whose memory or strides change under the same tensor (p.data = q, W.t_()) is
    captured again, never read stale."""
    w = torch.rand(30, dtype=F64, device=CUDA)
    W = torch.rand(30, 30, dtype=F64, device=CUDA)

    def f(x):
        return torch.sin(x) * w + torch.tanh(W @ x) + x.roll(1) * x

    x = torch.rand(30, dtype=F64, device=CUDA)
    op = asd.prepare_jacobian(f, x, compile="reduce-overhead")
    op(x)
    graphed, tracing = _graphed(op)
    assert len(graphed) == 1, tracing.cuda_graph_error
    strategy = op.strategy
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to another strategy
        w.mul_(3.0)  # in place: same address
        torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x))
        w.data = torch.rand(30, dtype=F64, device=CUDA)  # new memory under the same tensor
        torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x))
        W.t_()  # same memory, other strides: compiled and captured anew
        z = torch.rand(30, dtype=F64, device=CUDA)
        torch.testing.assert_close(op(z).to_dense(), _dense_jacobian(f, z))
    assert op.strategy == strategy
    graphed, tracing = _graphed(op)
    assert graphed and all(g.error is None for g in graphed), tracing.cuda_graph_error


def test_cuda_graph_after_a_call_that_needed_grad():
    """Compiled at a call whose parameters require grad (the transforms evaluate it), the products
    are captured at the first call that does not."""
    w = torch.rand(20, dtype=F64, device=CUDA, requires_grad=True)

    def f(x):
        return torch.sin(x) * w

    x = torch.rand(20, dtype=F64, device=CUDA)
    op = asd.prepare_jacobian(f, x, compile="reduce-overhead")
    assert op(x).values().requires_grad
    with torch.no_grad():
        torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x).detach())
    graphed, tracing = _graphed(op)
    assert graphed, tracing.cuda_graph_error


@pytest.mark.parametrize("coloring", ["star", "acyclic"])
def test_compiled_hessian_on_cuda_graph(coloring):
    x = torch.rand(200, dtype=F64, device=CUDA)
    op = asd.prepare_hessian(chained_rosenbrock, x, coloring=coloring, compile="reduce-overhead")
    for _ in range(3):
        z = torch.rand(200, dtype=F64, device=CUDA)
        torch.testing.assert_close(op(z).to_dense(), torch.func.hessian(chained_rosenbrock)(z))
    graphed, tracing = _graphed(op)
    assert graphed and tracing.cuda_graph_error is None


def test_cuda_graph_with_seed_chunks():
    """batch_size < ncolors: the seed rows of each chunk are copied into the captured buffer."""
    f = brusselator(8)
    op = asd.prepare_jacobian(f, _x(8, 0), mode="forward", batch_size=4, compile="reduce-overhead")
    for seed in (1, 2):
        z = _x(8, seed)
        torch.testing.assert_close(op(z).to_dense(), _dense_jacobian(f, z))
    graphed, tracing = _graphed(op)
    assert graphed and all(not g.constant_seeds for g in graphed), tracing.cuda_graph_error


def test_cuda_graph_on_two_streams():
    f = brusselator(8)
    op = asd.prepare_jacobian(f, _x(8, 0), compile="reduce-overhead")
    op(_x(8, 0))
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    z1, z2 = _x(8, 11), _x(8, 12)
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        torch.cuda._sleep(10**8)  # s1 stays busy: unordered, s2's copy into the graph's input would overtake it
        J1 = op(z1)
    with torch.cuda.stream(s2):
        J2 = op(z2)
    torch.cuda.synchronize()
    torch.testing.assert_close(J1.to_dense(), _dense_jacobian(f, z1))
    torch.testing.assert_close(J2.to_dense(), _dense_jacobian(f, z2))


def test_cuda_graph_refuses_a_cpu_scalar_tensor():
    """A CPU scalar tensor read by the products would be baked into a captured graph."""
    alpha = torch.tensor(2.0, dtype=F64)

    def f(x):
        return torch.sin(x) * alpha

    x = torch.rand(20, dtype=F64, device=CUDA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, compile="reduce-overhead")
        op(x)
        alpha.fill_(3.0)
        torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x))
    graphed, _ = _graphed(op)
    assert not graphed


def test_cuda_graph_after_a_changed_global():
    """The value guard drops the graph when a number f reads changes; a new one is captured."""
    state = {"scale": 2.0}

    def f(x):
        return torch.sin(x) * state["scale"]

    x = torch.rand(20, dtype=F64, device=CUDA)
    op = asd.prepare_jacobian(f, x, compile="reduce-overhead")
    op(x)
    state["scale"] = 5.0
    torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x))
    assert _graphed(op)[0]


def test_batch_size_auto_on_cuda():
    f = brusselator(8)
    x = _x(8, 0)
    op = asd.prepare_jacobian(f, x, batch_size="auto")
    assert op.batch_size is None or op.batch_size >= 1
    torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x))


def test_float32_on_cuda():
    f = brusselator(8)
    x = _x(8, 0).float()
    J = asd.prepare_jacobian(f, x)(x)
    assert J.dtype == torch.float32
    torch.testing.assert_close(J.to_dense(), _dense_jacobian(f, x))


def test_to_cupy_shares_the_values():
    cupy = pytest.importorskip("cupy", reason="to_cupy needs CuPy (pip install asd[cuda])")
    f = brusselator(6)
    x = _x(6, 0)
    J = asd.sparse_jacobian(f, x)
    C = asd.to_cupy(J)
    assert C.shape == tuple(J.shape) and C.nnz == J.values().numel()
    np.testing.assert_allclose(cupy.asnumpy(C.toarray()), J.to_dense().cpu().numpy())
    C.data[0] = 123.0
    assert float(J.values()[0]) == 123.0  # DLPack: the same memory
    with pytest.raises(asd.InputError, match="CUDA tensor"):
        asd.to_cupy(J.cpu())


def test_cuda_result_matches_finite_differences():
    """An independent check of the GPU derivative: central differences on the device."""
    f = brusselator(6)
    x = _x(6, 7)
    J = asd.sparse_jacobian(f, x).to_dense()
    v = torch.randn(x.numel(), dtype=F64, device=CUDA)
    eps = 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fd = (f(x + eps * v) - f(x - eps * v)) / (2 * eps)
    torch.testing.assert_close(J @ v, fd.reshape(-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_a_cuda_parameter_moved_to_another_storage_offset(compile):
    """On CUDA, compiled products are Inductor's own artifacts, whose caches key inputs by shape
    and strides, not storage offset; ``as_strided`` counts from the storage. A parameter rebound
    to other windows of one buffer must never be served kernels compiled for another offset."""
    buf = torch.rand(64, dtype=F64, device=CUDA)
    w = buf[0:12].clone()

    def f(x):
        return torch.sin(x) * w.as_strided((12,), (1,), 0) + x.roll(1) * x

    x = torch.rand(12, dtype=F64, device=CUDA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, compile=compile)
        for k in (0, 2, 5, 2):
            w.data = buf[k:k + 12]
            torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x))


def test_inductor_artifacts_of_a_cuda_graph_reading_storage_offsets(tmp_path, monkeypatch):
    """Compiled afresh (the caches off) for each offset, and never returned computing something
    else: Inductor's CUDA kernels of this graph were seen to read the wrong window at a nonzero
    offset (torch 2.11, H100), which the check against the graph's result refuses."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from asd.backends import compile_cache

    monkeypatch.setenv("ASD_CACHE_DIR", str(tmp_path / "asd-cache"))
    monkeypatch.setattr(compile_cache, "_MEMORY", {})
    buf = torch.rand(16, dtype=F64, device=CUDA)
    fn = lambda w: torch.as_strided(w, (6,), (1,), 0) * 2.0 + w  # noqa: E731
    gm = make_fx(fn)(buf[0:6])
    assert compile_cache.reads_storage_offsets(gm)
    outcomes = {}
    for start in (0, 2, 5):
        w = buf[start:start + 6]
        try:
            c = compile_cache.compile_graph(gm, [w], expected=gm(w))
        except RuntimeError as exc:
            assert "computes something else" in str(exc)
            outcomes[start] = "refused"
            continue
        assert c.source == "compiled" and c.path is None and "caches off" in c.note
        torch.testing.assert_close(c(w), fn(w), rtol=0, atol=0)
        outcomes[start] = "compiled"
    print("compiled or refused, by storage offset:", outcomes)


@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_a_cuda_tensor_with_the_negation_bit_is_not_compiled(compile):
    """Inductor's kernels ignored the lazy negation bit (``conj().imag``): a wrong sign."""
    B = torch.randn(6, dtype=torch.complex128, device=CUDA).conj().imag
    assert B.is_neg()
    f = lambda x: torch.sin(x) * B  # noqa: E731
    x = torch.randn(6, dtype=F64, device=CUDA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, compile=compile)
        for z in (x, x * 2.0, x - 1.0):
            torch.testing.assert_close(op(z).to_dense(), _dense_jacobian(f, z), rtol=0, atol=0)


def test_as_strided_reading_outside_its_cuda_input_is_refused():
    """PyTorch differentiates such a window wrongly in every mode (checked by finite differences
    on the CPU): the operator raises instead of returning a wrong matrix."""
    def f(x):
        return torch.as_strided(x[2:], (4,), (1,), 0) * x[:4]

    x = torch.rand(8, dtype=F64, device=CUDA)
    with pytest.raises(asd.ADGapError):
        asd.sparse_jacobian(f, x)


def _drawing(n):
    """A function whose Jacobian depends on the CUDA generator's draws."""
    def f(x):
        return x * x * torch.rand(n, dtype=F64, device=x.device) + torch.roll(x, 1)

    return f


def test_cuda_draws_in_the_autograd_loop():
    """The forward-mode loop evaluates ``f`` once per seed: each evaluation draws the same CUDA
    numbers, and the call leaves the generator where one evaluation does."""
    from asd.backends.autograd_loop import AutogradLoop

    n = 12
    f = _drawing(n)
    x = torch.rand(n, dtype=F64, device=CUDA)
    op = asd.prepare_jacobian(f, x, mode="forward", backend=AutogradLoop())
    for i in range(3):
        torch.manual_seed(i)
        got = op(x).to_dense()
        after = torch.cuda.get_rng_state()
        torch.manual_seed(i)
        want = torch.func.jacrev(f)(x)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        assert torch.equal(torch.cuda.get_rng_state(), after)


@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_cuda_draws_of_a_compiled_operator(compile):
    """Inductor's kernels draw other numbers than eager PyTorch: the recorded products disagree
    with the transforms and are not compiled from; every call is one evaluation's Jacobian."""
    n = 10
    f = _drawing(n)
    x = torch.rand(n, dtype=F64, device=CUDA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = asd.prepare_jacobian(f, x, compile=compile)
        for i in range(4):
            torch.manual_seed(100 + i)
            got = op(x).to_dense()
            torch.manual_seed(100 + i)
            torch.testing.assert_close(got, torch.func.jacrev(f)(x), rtol=1e-12, atol=1e-12, msg=f"call {i}")
