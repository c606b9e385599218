"""Prepared operators and traces are freed by reference counting: a reference cycle keeps their
arrays (hundreds of MB at 10^6 unknowns) until the garbage collector runs, and every allocation
meanwhile faults in fresh memory (a one-off 10^6-unknown Hessian took half as long again)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import asd
from asd.detection import torch_tracer
from asd.problems import brusselator, brusselator_input, rosenbrock


@pytest.fixture
def no_gc():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _scaled(z, a, *, b=1.0):
    return (a * z[1:] * z[:-1]).sum() + (b * z ** 3).sum()


def _tracers(monkeypatch) -> list:
    made = []
    real = torch_tracer.Tracer.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        made.append(weakref.ref(self))

    monkeypatch.setattr(torch_tracer.Tracer, "__init__", init)
    return made


@pytest.mark.parametrize("case", ["jacobian", "jacobian-reverse", "hessian", "hessian-args"])
def test_an_operator_and_its_trace_are_freed_without_the_garbage_collector(case, no_gc, monkeypatch):
    tracers = _tracers(monkeypatch)
    if case.startswith("jacobian"):
        x = brusselator_input(4)
        op = asd.prepare_jacobian(brusselator(4), x, mode="reverse" if case.endswith("reverse") else "forward")
        call = lambda: op(x)  # noqa: E731
    elif case == "hessian":
        x = torch.rand(30, dtype=torch.float64)
        op = asd.prepare_hessian(rosenbrock, x)
        call = lambda: op.value_grad_hessian(x)  # noqa: E731
    else:
        x = torch.rand(30, dtype=torch.float64)
        op = asd.prepare_hessian(_scaled, x, args=(2.0,), kwargs={"b": 3.0})
        call = lambda: op(x, 0.5, b=1.5)  # noqa: E731
    call()
    call()
    refs = [weakref.ref(o) for o in (op, op.state, op.decompressor)]
    assert tracers and all(t() is None for t in tracers)  # the trace ended: its tracer is gone
    del op, call
    assert all(r() is None for r in refs)


def _uses():
    from asd import scipy as asp
    from asd.solvers.newton import newton

    x, f = brusselator_input(4), brusselator(4)
    xh = torch.rand(40, dtype=torch.float64)
    for mode in ("forward", "reverse"):
        asd.sparse_jacobian(f, x, mode=mode, cache=False)
    for coloring in ("star", "acyclic"):
        asd.sparse_hessian(rosenbrock, xh, coloring=coloring, cache=False)
    asd.gradient_and_hessian(rosenbrock, xh, cache=False)
    op = asd.prepare_jacobian(f, x, check=True)
    op(x)
    op.check(x)
    newton(lambda z: z ** 3 - 1 + 0.1 * torch.roll(z, 1), torch.ones(10, dtype=torch.float64))
    asp.jac(f, x.numpy())(x.numpy())
    asp.hess(rosenbrock, xh.numpy())(xh.numpy())


def test_a_one_off_leaves_nothing_for_the_garbage_collector(no_gc):
    _uses()  # the first calls import and fill the memos
    gc.collect()
    _uses()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept in gc.garbage
    try:
        gc.collect()
        cyclic = [type(o).__qualname__ for o in gc.garbage
                  if str(getattr(type(o), "__module__", "")).startswith("asd.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not cyclic


def test_a_rebound_operator_reads_its_own_call_arguments(no_gc):
    """rebind gives the new operator its own box of call arguments: evaluating one never changes
    what the other's f reads."""
    x = torch.rand(20, dtype=torch.float64)
    op = asd.prepare_hessian(_scaled, x, args=(2.0,))
    new = op.rebind(lambda z, a, *, b=1.0: _scaled(z, a, b=b))
    assert new._args is not op._args
    H_new = new(x, 5.0).to_dense()
    assert op._call_args == ((2.0,), {})  # the new operator's call did not reach the old one's box
    H_old = op(x).to_dense()
    torch.testing.assert_close(H_old, torch.func.hessian(lambda z: _scaled(z, 2.0))(x))
    torch.testing.assert_close(H_new, torch.func.hessian(lambda z: _scaled(z, 5.0))(x))
    torch.testing.assert_close(op(x).to_dense(), H_old)


def test_jax_operators_are_freed_without_the_garbage_collector(no_gc):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import asd.jax as aj

    jax.config.update("jax_enable_x64", True)

    def f(v):
        return jnp.sum(100 * (v[1:] - v[:-1] ** 2) ** 2 + (1 - v[:-1]) ** 2)

    def g(v):
        return v[1:] * v[:-1] + jnp.sin(v[1:])

    x = jnp.linspace(0.0, 1.0, 20)
    for make, call in ((lambda: aj.prepare_hessian(f, x), lambda op: op.value_grad_hessian(x)),
                       (lambda: aj.prepare_jacobian(g, x), lambda op: op(x))):
        op = make()
        call(op)
        ref = weakref.ref(op)
        del op
        assert ref() is None


def test_a_substitution_plan_used_level_by_level_is_freed(no_gc):
    """The level-wise kernel's prepared tensors are kept weakly per plan and do not hold the plan;
    a plan sorted by level is its own ``leveled`` without caching itself (both would be cycles or
    immortal entries)."""
    from dataclasses import replace

    import scipy.sparse as sp

    import asd.coloring as C
    from asd.decompression.device import substitute

    A = sp.random(60, 60, density=0.08, random_state=0, format="csr")
    res = C.color((A + A.T + sp.identity(60)).tocsr(), "acyclic")
    B = torch.zeros(res.plan.compressed_size, dtype=torch.float64)
    sequential = replace(res.plan, step_pos=res.plan.step_pos.copy())
    leveled = replace(res.plan.leveled, step_pos=res.plan.leveled.step_pos.copy())
    refs = [weakref.ref(sequential), weakref.ref(leveled)]
    for plan in (sequential, leveled):
        substitute(plan, B, fast=False)  # the level-wise path: prepared(plan) -> plan.leveled
        assert plan.leveled.is_leveled
    del sequential, leveled, plan
    assert all(r() is None for r in refs)
