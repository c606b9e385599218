"""A call whose cross-mode check is due (check=True, local=True, or extra arguments that differ from
the prepared ones) inside a torch.func transform raises an InputError that names the fix; with
check=False the values follow the transform (batched or differentiated over f's extra arguments)."""

from __future__ import annotations

import warnings

import pytest
import torch

import asd

N = 10


def f(z, th):
    return torch.sin(z * th) * z.roll(1) + th.roll(-1) * z ** 3


def _dense_values(op, z, th):
    """Dense AD's Jacobian at the operator's stored entries."""
    indptr, col = (torch.as_tensor(a) for a in (op.pattern.indptr, op.pattern.indices))
    rows = torch.repeat_interleave(torch.arange(N), indptr[1:] - indptr[:-1])
    return torch.func.jacrev(f)(z, th)[rows, col]


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_a_check_due_inside_a_transform_raises_a_clear_error(mode):
    torch.manual_seed(0)
    x0, th0, x = (torch.randn(N, dtype=torch.float64) for _ in range(3))
    op = asd.prepare_jacobian(f, x0, args=(th0,), mode=mode)
    with pytest.raises(asd.InputError, match="check=False"):
        torch.vmap(lambda q: op.values(x, q))(torch.randn(3, N, dtype=torch.float64))
    with pytest.raises(asd.InputError, match="check=False"):
        torch.func.jacrev(lambda q: op.values(x, q))(torch.randn(N, dtype=torch.float64))
    local = asd.prepare_jacobian(lambda z: f(z, th0), x0, local=True)
    with pytest.raises(asd.InputError, match="outside the transform"):
        torch.func.grad(lambda z: local.values(z).sum())(x0)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_with_check_false_the_values_follow_the_transform(mode):
    torch.manual_seed(1)
    x0, th0, x = (torch.randn(N, dtype=torch.float64) for _ in range(3))
    op = asd.prepare_jacobian(f, x0, args=(th0,), mode=mode, check=False)
    ths = torch.randn(3, N, dtype=torch.float64)
    got = torch.vmap(lambda q: op.values(x, q))(ths)
    want = torch.stack([_dense_values(op, x, q) for q in ths])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    th = torch.randn(N, dtype=torch.float64)
    got = torch.func.jacrev(lambda q: op.values(x, q))(th)
    want = torch.func.jacfwd(lambda q: _dense_values(op, x, q))(th)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_detection_inside_a_transform_raises_a_clear_error():
    # (an AttributeError of the traced stand-in before: the transform's layers wrap it)
    torch.manual_seed(2)
    x, th = (torch.randn(N, dtype=torch.float64) for _ in range(2))
    asd.clear_cache()
    with pytest.raises(asd.InputError, match="outside torch.func transforms"):
        torch.func.grad(lambda q: asd.sparse_jacobian(f, x, args=(q,), cache=False).values().sum())(th)
    with pytest.raises(asd.InputError, match="outside torch.func transforms"):
        torch.vmap(lambda z: asd.jacobian_sparsity(lambda w: f(w, th), z).nnz)(torch.randn(2, N, dtype=torch.float64))


def test_a_cache_hit_inside_a_transform_raises_a_clear_error():
    # (a StalePatternWarning, a second preparation and then an error before: the probe validating a hit
    # cannot run inside a transform)
    torch.manual_seed(3)
    x, th = (torch.randn(N, dtype=torch.float64) for _ in range(2))
    g = lambda z: f(z, th)  # noqa: E731
    asd.clear_cache()
    asd.sparse_jacobian(g, x)  # the entry, prepared outside
    with warnings.catch_warnings():
        warnings.simplefilter("error", asd.StalePatternWarning)
        with pytest.raises(asd.InputError, match="prepare the operator outside"):
            torch.vmap(lambda z: asd.sparse_jacobian(g, x).values() * z.sum())(torch.randn(3, N, dtype=torch.float64))


def test_another_threads_forward_ad_level_refuses_no_call():
    """Forward-mode AD's level is the process's: another thread's ``dual_level`` (asd's own
    cross-mode check among them) made a cache hit, a checked call and a prepared call with a due
    check raise ``InputError`` (eight threads of ``sparse_jacobian`` failed now and then)."""
    import threading

    import torch.autograd.forward_ad as fwAD

    f = lambda x: torch.sin(x[1:]) * x[:-1]  # noqa: E731
    x = torch.rand(50, dtype=torch.float64)
    want = torch.func.jacfwd(f)(x)
    asd.clear_cache()
    asd.sparse_jacobian(f, x, mode="forward")
    op = asd.prepare_jacobian(f, x, mode="forward", check=True)
    calls = [lambda: asd.sparse_jacobian(f, x, mode="forward"),
             lambda: asd.sparse_jacobian(f, x, mode="forward", check=True),
             lambda: op(x)]
    got = []

    def work(call):
        try:
            got.append(call().to_dense())
        except Exception as exc:  # noqa: BLE001
            got.append(exc)

    with fwAD.dual_level():
        for call in calls:
            t = threading.Thread(target=work, args=(call,))
            t.start()
            t.join()
    assert len(got) == 3
    for g in got:
        assert isinstance(g, torch.Tensor), g
        torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)
    # in this thread, x carrying a tangent is still refused
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(asd.InputError):
            asd.sparse_jacobian(f, dual, mode="forward")


def test_detection_inside_the_callers_dual_level_with_a_captured_dual_tensor():
    """``f`` capturing a dual tensor, prepared inside the caller's ``dual_level``: detection's
    stand-ins met the tangent and PyTorch crashed the process (SIGSEGV); detection now traces the
    primal computation, and the values carry the tangent of the captured tensor."""
    import subprocess
    import sys

    code = (
        "import torch, asd\n"
        "import torch.autograd.forward_ad as fwAD\n"
        "with fwAD.dual_level():\n"
        "    cp = torch.rand(8, dtype=torch.float64)\n"
        "    c = fwAD.make_dual(cp, torch.ones(8, dtype=torch.float64))\n"
        "    op = asd.prepare_jacobian(lambda x: x * c, torch.rand(8, dtype=torch.float64))\n"
        "    p, t = fwAD.unpack_dual(op.values(torch.rand(8, dtype=torch.float64)))\n"
        "    assert op.pattern.nnz == 8 and torch.equal(p, cp) and torch.equal(t, torch.ones(8, dtype=torch.float64))\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


def test_another_threads_dual_level_does_not_switch_the_strategy(monkeypatch):
    """A forward-mode operator's products meet another thread's ``dual_level`` ("Nested forward
    mode AD"): a passing clash, evaluated by another strategy for that call only. Where that level
    had ended before the operator looked (here: ``under_transform`` answering False), it gave up
    its strategy for good, with a warning."""
    import threading

    import torch.autograd.forward_ad as fwAD

    import asd.operators as operators

    f = lambda x: torch.sin(x[1:]) * x[:-1]  # noqa: E731
    x = torch.rand(50, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    op.values(x)
    strategy = op.strategy
    monkeypatch.setattr(operators, "under_transform", lambda x: False)
    got = []

    def work():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got.append((op.values(x), [str(w.message) for w in caught if "asd" in str(w.message)]))

    with fwAD.dual_level():
        t = threading.Thread(target=work)
        t.start()
        t.join()
    (values, warned), = got
    assert op.strategy == strategy and not warned, (op.strategy, warned)
    torch.testing.assert_close(values, op.values(x), rtol=1e-12, atol=1e-12)
    assert op.strategy == strategy
