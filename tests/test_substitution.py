"""Substitution decompression: numba kernel, level-wise torch kernel (float32/float64,
autograd, device-agnostic), against numpy products."""

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")

import asd.coloring as C  # noqa: E402
from asd.decompression.device import prepared, substitute  # noqa: E402
from asd.errors import DecompressionError  # noqa: E402


def _case(n=60, density=0.08, seed=0, order="natural"):
    A = sp.random(n, n, density=density, random_state=seed, format="csr")
    A = (A + A.T + sp.identity(n)).tocsr()
    res = C.color(A, "acyclic", order)
    v = np.random.default_rng(seed).standard_normal(res.nnz)
    v = v + v[res.pattern.transpose_with_positions[1]]
    H = res.to_scipy(v).toarray()
    B = (H @ res.seeds().T).T
    return res, v, B


@pytest.mark.parametrize("order", ["natural", "smallest_last", "random"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fast", [False, True, None])
def test_substitute_matches(order, dtype, fast):
    for seed in range(3):
        res, v, B = _case(seed=seed, order=order)
        out = substitute(res.plan, torch.tensor(B, dtype=dtype), fast=fast)
        assert out.dtype == dtype and out.shape == (res.nnz,)
        tol = 1e-4 if dtype == torch.float32 else 1e-12
        np.testing.assert_allclose(out.double().numpy(), v, rtol=tol, atol=tol)


def test_levelwise_equals_numba_exactly_on_integers():
    res, _, _ = _case(n=120, seed=4)
    v = np.random.default_rng(0).integers(-9, 9, res.nnz).astype(np.float64)
    v = v + v[res.pattern.transpose_with_positions[1]]
    B = torch.tensor((res.to_scipy(v).toarray() @ res.seeds().T).T)
    a = substitute(res.plan, B, fast=False)
    b = substitute(res.plan, B, fast=True)
    assert torch.equal(a, b)
    np.testing.assert_array_equal(a.numpy(), v)
    np.testing.assert_array_equal(res.decompress(B.numpy()), v)


def test_autograd_and_prepared():
    res, v, B = _case(seed=2)
    Bt = torch.tensor(B, requires_grad=True)
    out = substitute(res.plan, Bt)  # needs grad -> level-wise path
    w = torch.randn(res.nnz, dtype=torch.float64)
    (out * w).sum().backward()
    assert Bt.grad is not None and Bt.grad.shape == Bt.shape
    prep = prepared(res.plan, "cpu")
    assert prepared(res.plan, "cpu") is prep  # one prepared plan per (plan, device)
    np.testing.assert_allclose(substitute(res.plan, torch.tensor(B), fast=False).numpy(), v, rtol=1e-12, atol=1e-12)


def test_wrong_size_raises():
    res, _, B = _case()
    with pytest.raises(DecompressionError):
        substitute(res.plan, torch.zeros(B.size + 1))


def test_banded_deep_levels():
    n = 200
    A = sp.diags([np.ones(n - 1), np.ones(n), np.ones(n - 1)], [-1, 0, 1], format="csr")
    res = C.color(A, "acyclic")
    assert res.ncolors == 2
    v = np.random.default_rng(1).standard_normal(res.nnz)
    v = v + v[res.pattern.transpose_with_positions[1]]
    B = (res.to_scipy(v).toarray() @ res.seeds().T).T
    out = substitute(res.plan, torch.tensor(B), fast=False)
    np.testing.assert_allclose(out.numpy(), v, rtol=1e-9, atol=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda():
    res, v, B = _case(seed=3)
    out = substitute(res.plan, torch.tensor(B, device="cuda"))
    assert out.device.type == "cuda"
    np.testing.assert_allclose(out.cpu().numpy(), v, rtol=1e-10, atol=1e-10)


def test_cpu_decompressor_leaves_the_levelwise_tensors_unbuilt():
    """On the CPU the Numba kernel reads the plan: the level-wise index tensors (one slice per level
    of the elimination tree, tens of thousands on a long chain) are built only for the device path."""
    import asd
    from asd.decompression import device as dev
    from asd.decompression.device import Decompressor
    from asd.problems import rosenbrock

    x = torch.linspace(-1.0, 1.0, 400, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, coloring="acyclic")
    dev.clear_prepared()
    dec = Decompressor(op.coloring, "cpu")
    assert op.coloring.plan not in dev._PREPARED
    H = dec.csr(dec.values(op.compressed(x))).to_dense()
    torch.testing.assert_close(H, torch.func.hessian(rosenbrock)(x))
    assert op.coloring.plan not in dev._PREPARED


def test_a_plan_that_leaves_entries_unwritten_gives_zeros_there():
    """The CPU kernel skips the zero fill only for plans whose steps write every entry (every plan
    of an acyclic coloring): a plan built by hand that drops steps reads zeros, not stale memory."""
    from dataclasses import replace

    res, v, B = _case(n=80, seed=5)
    assert res.plan.writes_every_entry
    plan = res.plan.leveled
    keep = plan.level_ptr[1]  # the first level only: its steps depend on nothing
    cut = replace(plan, step_pos=plan.step_pos[:keep], step_pos_t=plan.step_pos_t[:keep],
                  step_src=plan.step_src[:keep], dep_ptr=plan.dep_ptr[:keep + 1],
                  dep_pos=plan.dep_pos[:plan.dep_ptr[keep]], dep_step=plan.dep_step[:plan.dep_ptr[keep]],
                  level_ptr=plan.level_ptr[:2])
    assert not cut.writes_every_entry
    written = np.zeros(plan.nnz, dtype=bool)
    written[cut.step_pos] = written[cut.step_pos_t] = True
    for _ in range(3):  # fresh buffers of the allocator may hold the previous call's values
        got = substitute(cut, torch.tensor(B), fast=True).numpy()
        np.testing.assert_allclose(got[written], v[written], rtol=1e-12, atol=1e-12)
        assert (got[~written] == 0).all()


def test_a_plan_keeps_its_kernel_arrays_read_only():
    """The plan of an acyclic coloring keeps the arrays its kernels computed without copying them:
    they are sealed read-only, so neither the plan's user nor asd can change a plan in place."""
    res, v, B = _case(seed=4)
    for plan in (res.plan, res.plan.leveled):
        for name in ("step_pos", "step_pos_t", "step_src", "dep_ptr", "dep_pos", "dep_step", "level_ptr"):
            a = getattr(plan, name)
            if a is None:  # the sequential plan has no levels
                assert not plan.is_leveled
                continue
            assert a.dtype == np.int64 and not a.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                a[:1] = 0
        np.testing.assert_allclose(plan.decompress(B), v)


def test_a_plan_is_built_without_copying_its_kernel_arrays(monkeypatch):
    import asd.decompression._substitution_kernels as kernels
    from asd.decompression.plans import substitution_plan

    made, made_sorted = [], []
    real, real_sort = kernels.build_substitution, kernels.sort_steps_by_level
    monkeypatch.setattr(kernels, "build_substitution", lambda *a: made.append(real(*a)) or made[-1])
    monkeypatch.setattr(kernels, "sort_steps_by_level", lambda *a: made_sorted.append(real_sort(*a)) or made_sorted[-1])
    res, _, _ = _case(seed=5)
    plan = substitution_plan(res.pattern, res.colors, res.ncolors)
    assert plan.step_pos is made[0][0] and plan.dep_pos is made[0][4] and not made_sorted
    leveled = plan.leveled
    assert leveled.step_pos is made_sorted[0][0] and leveled.level_ptr is made_sorted[0][-1]


def test_cpu_substitution_never_sorts_by_level(monkeypatch):
    """On the CPU the Numba kernel follows the plan's sequential order: no level sort (a tenth of a
    one-off 10^6-unknown Hessian) is made for preparing or evaluating an operator there."""
    import asd
    import asd.decompression._substitution_kernels as kernels
    from asd.problems import rosenbrock

    def refuse(*a):
        raise AssertionError("sorted by level on the CPU")

    monkeypatch.setattr(kernels, "sort_steps_by_level", refuse)
    x = torch.linspace(-1.0, 1.0, 300, dtype=torch.float64)
    op = asd.prepare_hessian(rosenbrock, x, coloring="acyclic")
    torch.testing.assert_close(op(x).to_dense(), torch.func.hessian(rosenbrock)(x))
    assert not op.coloring.plan.is_leveled


def test_a_plan_sorted_by_level_solves_the_same_values_on_every_path():
    """The level-wise torch kernel (other devices, and the CPU when the values need gradients) uses
    the plan sorted by level; it gives the sequential kernel's values."""
    res, v, B = _case(n=120, seed=7)
    fast = substitute(res.plan, torch.tensor(B), fast=True).numpy()
    levelwise = substitute(res.plan, torch.tensor(B), fast=False).numpy()
    np.testing.assert_allclose(fast, v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(levelwise, v, rtol=1e-12, atol=1e-12)
    assert res.plan.leveled.nlevels == res.plan.nlevels > 1


def test_a_plan_has_both_level_arrays_or_neither():
    from dataclasses import replace

    from asd.errors import DecompressionError

    res, _, _ = _case(seed=3)
    with pytest.raises(DecompressionError, match="dep_step and level_ptr"):
        replace(res.plan, level_ptr=np.zeros(1, dtype=np.int64))


def test_colors_a_substitution_cannot_use_are_refused():
    """Adjacent vertices of one color, a color at or past ncolors (the kernels index color pairs
    without bounds checks) and a color array of the wrong length raise ColoringError."""
    from asd.decompression.plans import substitution_plan
    from asd.errors import ColoringError

    res, _, _ = _case(seed=6)
    colors = np.asarray(res.colors).copy()
    i, j = next((int(r), int(c)) for r, c in zip(res.pattern.rows, res.pattern.indices) if r != c)
    clash = colors.copy()
    clash[j] = clash[i]
    with pytest.raises(ColoringError, match="distance-1"):
        substitution_plan(res.pattern, clash, res.ncolors)
    with pytest.raises(ColoringError, match="below ncolors"):
        substitution_plan(res.pattern, colors, int(colors.max()))
    with pytest.raises(ColoringError, match="one color per vertex"):
        substitution_plan(res.pattern, colors[:-1], res.ncolors)
    with pytest.raises(ColoringError, match="neutral"):
        substitution_plan(res.pattern, np.where(np.arange(len(colors)) == 0, -1, colors), res.ncolors)
    with pytest.raises(ColoringError, match="below ncolors=0"):
        substitution_plan(res.pattern, np.zeros(len(colors), dtype=np.int64), 0)
    substitution_plan(res.pattern, colors, res.ncolors)  # the coloring itself is fine


def test_a_pattern_that_is_not_symmetric_is_refused():
    """The substitution kernels read every entry's mirror position: a one-sided pattern (an
    AcyclicColoring built by hand) raises instead of reading out of bounds, and a directed cycle,
    whose symmetrization is a two-colored cycle, is not given a plan."""
    from asd.coloring.result import AcyclicColoring
    from asd.decompression.plans import substitution_plan
    from asd.errors import ColoringError
    from asd.patterns import as_pattern

    upper = as_pattern(sp.csr_array(np.array([[1, 1, 0], [0, 1, 1], [0, 0, 1]])), name="pattern")
    with pytest.raises(ColoringError, match="symmetric"):
        substitution_plan(upper, np.array([0, 1, 2]), 3)
    cycle = as_pattern(sp.csr_array(np.roll(np.eye(4), 1, axis=1)), name="pattern")
    with pytest.raises(ColoringError, match="symmetric"):
        substitution_plan(cycle, np.array([0, 1, 0, 1]), 2)
    res = AcyclicColoring(as_pattern(sp.csr_array(np.eye(3)), name="pattern"), "natural", np.zeros(3, int), 0)
    with pytest.raises(ColoringError, match="below ncolors"):
        res.decompress(np.zeros(0))


def test_the_plan_kernels_give_the_same_steps_with_int32_and_int64_scratch():
    """The plan's scratch is int32 where every vertex and position fits (int64 beyond): both give
    the same steps (the per-vertex XORs of neighbours and positions stay within the type)."""
    import asd.decompression._substitution_kernels as kernels

    res, _, _ = _case(n=150, density=0.1, seed=8, order="smallest_last")
    P = res.pattern
    colors = np.asarray(res.colors, dtype=np.int64)
    _, tpos = P.transpose_with_positions
    n, nnz = P.shape[0], P.nnz
    out = []
    for dt in (np.int32, np.int64):
        perm, gstart, clash = kernels.group_by_pair(P.rows, P.indices, colors, res.ncolors, np.empty(nnz, dtype=dt))
        assert not clash
        *steps, ok = kernels.build_substitution(P.indptr, P.indices, tpos, P.rows, colors, perm, gstart, n,
                                                np.zeros((n, 5), dtype=dt), np.empty(n, dtype=dt))
        assert ok
        out.append(steps)
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def test_a_plan_built_by_hand_is_checked_before_a_kernel_reads_it():
    """The CPU kernel and the level sort read a plan unchecked: a plan built by hand with indices
    out of range, arrays of mismatched lengths, or a dependency not written before it is read
    (an uninitialized entry) raises DecompressionError; the library's own plans are not re-checked."""
    from dataclasses import replace

    from asd.decompression.plans import SubstitutionPlan

    res, v, B = _case(n=50, seed=9)
    plan, L = res.plan, res.plan.leveled
    assert replace(plan).decompress(B) is not None and replace(L).decompress(B) is not None  # valid ones pass
    I = np.int64
    bad = [
        dict(step_pos_t=plan.step_pos_t[:1]),  # lengths differ
        dict(step_pos=np.where(np.arange(len(plan.step_pos)) == 3, plan.nnz, plan.step_pos)),
        dict(step_src=np.where(np.arange(len(plan.step_src)) == 0, plan.compressed_size, plan.step_src)),
        dict(dep_pos=np.full_like(plan.dep_pos, -1)),
        dict(dep_ptr=np.concatenate([[0], plan.dep_ptr[1:] + 1])),
    ]
    for change in bad:
        with pytest.raises(DecompressionError):
            replace(plan, **change)
        with pytest.raises(DecompressionError):
            replace(L, **change)
    with pytest.raises(DecompressionError):
        SubstitutionPlan((1, 3), 3, np.array([0, 1, 2], I), np.array([0], I), np.array([0, 1, 2], I),
                         np.array([0, 0], I), np.zeros(0, I))  # the reviewer's: lengths 3, 1, 3 and 2
    # the steps reversed: a step reads entries that later steps write
    k = int(np.flatnonzero(np.diff(plan.dep_ptr) > 0)[0])  # a step with a dependency
    order = np.r_[k, np.delete(np.arange(len(plan.step_pos)), k)]
    deps = [plan.dep_pos[plan.dep_ptr[s]:plan.dep_ptr[s + 1]] for s in order]
    with pytest.raises(DecompressionError, match="earlier step"):
        SubstitutionPlan(plan.compressed_shape, plan.nnz, plan.step_pos[order], plan.step_pos_t[order],
                         plan.step_src[order], np.r_[0, np.cumsum([len(d) for d in deps])].astype(I),
                         np.concatenate(deps).astype(I))
    # a leveled plan with every step in one level: dependencies of the same level
    with pytest.raises(DecompressionError, match="earlier level"):
        replace(L, level_ptr=np.array([0, len(L.step_pos)], I))
    with pytest.raises(DecompressionError, match="dep_step"):
        replace(L, dep_step=np.zeros_like(L.dep_step) + len(L.step_pos) + 5)
