"""Review of prepared operators and the cache (session 30): per-call arguments on cache hits, and
functions that write into their input. Each test failed before its fix."""

from __future__ import annotations

import warnings

import pytest
import torch

import asd
from asd.backends.autograd_loop import AutogradLoop
from asd.errors import StalePatternWarning

N = 6


def _asd_warnings(record):
    return [w for w in record if w.category.__module__.startswith("asd")]


def _f_structure_follows_c(z, c):
    y = z ** 2 + torch.cat([z[:1] * z[1:2], z.new_zeros(N - 1)])
    if c > 0:  # entry (2, 1) exists only for c > 0
        y = y + c * torch.cat([z.new_zeros(2), z[1:2], z.new_zeros(N - 3)])
    return y


@pytest.mark.parametrize("how", ["args", "kwargs"])
def test_a_cache_hit_is_checked_with_this_calls_arguments(how):
    """The cached operator (prepared with c = 0) misses entry (2, 1) at c = 5: the hit's check
    must run with c = 5 (it ran with the arguments the operator was prepared with)."""
    asd.clear_cache()
    x = torch.randn(N, dtype=torch.float64)
    f = _f_structure_follows_c if how == "args" else (lambda z, *, c: _f_structure_follows_c(z, c))

    def call(c):
        opts = dict(args=(c,)) if how == "args" else dict(kwargs={"c": c})
        return asd.sparse_jacobian(f, x, mode="forward", **opts).to_dense()

    call(0.0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        J = call(5.0)
    want = torch.func.jacrev(lambda z: _f_structure_follows_c(z, 5.0))(x)
    torch.testing.assert_close(J, want)
    assert any(issubclass(r.category, StalePatternWarning) for r in w)


def test_float_arguments_that_keep_the_structure_hit_the_cache_quietly():
    asd.clear_cache()
    x = torch.randn(N, dtype=torch.float64)
    f = lambda z, c: c * z.sin() * z.roll(1)  # noqa: E731
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for c in (1.0, 2.0, 3.0, 4.0):
            J = asd.sparse_jacobian(f, x, args=(c,)).to_dense()
            torch.testing.assert_close(J, torch.func.jacrev(lambda z: f(z, c))(x))
    assert not _asd_warnings(w), [str(r.message) for r in _asd_warnings(w)]


def _writes_mul(z):
    z.mul_(2.0)
    return z.sin() * z.roll(1)


def _writes_view(z):
    z[2:4].mul_(3.0)
    return torch.tanh(z) * z.roll(-1)


_RELU_LINEAR = torch.nn.Sequential(torch.nn.ReLU(inplace=True), torch.nn.Linear(N, N)).double()


def _relu_inplace(z):
    return _RELU_LINEAR(z)


def _reference(f, x):
    return torch.func.jacrev(lambda z: f(z.clone()))(x.clone())


# more calls than the operator evaluates before it records and replays its products (50)
CALLS = 60


@pytest.mark.parametrize("f", [_writes_mul, _writes_view, _relu_inplace], ids=["mul_", "view_add_", "relu_inplace"])
@pytest.mark.parametrize("mode", ["forward", "reverse", "auto"])
def test_a_function_writing_into_its_input_gets_the_right_jacobian_at_every_call(f, mode):
    """``f`` writes into its input: under forward mode into the tangents, the operator's seed rows
    reused by every later call (the second call on was wrong, 2x, 4x, ... the truth)."""
    torch.manual_seed(0)
    x0 = torch.randn(N, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x0, mode=mode)
    for i in range(CALLS):
        x = torch.randn(N, dtype=torch.float64)
        keep = x.clone()
        J = op(x).to_dense()
        assert torch.equal(x, keep)  # the caller's x is never written
        torch.testing.assert_close(J, _reference(f, x), msg=f"call {i + 1}")
    assert op.check(x).ok


def test_the_autograd_loop_gives_every_color_the_same_point():
    """The autograd loop's forward products share one point: ``f`` writing into it moved the
    point of every later color."""
    x = torch.randn(N, dtype=torch.float64)
    op = asd.prepare_jacobian(_writes_mul, x, mode="forward", backend=AutogradLoop())
    for _ in range(3):
        x = torch.randn(N, dtype=torch.float64)
        torch.testing.assert_close(op(x).to_dense(), _reference(_writes_mul, x))


def test_the_cross_mode_check_leaves_x_alone():
    x = torch.randn(N, dtype=torch.float64)
    op = asd.prepare_jacobian(_writes_mul, x, mode="reverse")
    values = op.values(x)
    keep = x.clone()
    assert op.check(x, values).ok
    assert torch.equal(x, keep)


def test_a_float_argument_that_changes_the_structure_is_checked():
    """A Python float compared by ``if`` and a float tensor compared by ``torch.where``: another
    value of either changes the pattern, which the operator used without a check."""
    x = torch.randn(N, dtype=torch.float64)
    op = asd.prepare_jacobian(_f_structure_follows_c, x, args=(0.0,), mode="forward")
    with pytest.raises(asd.CheckError):
        op(x, 5.0)
    g = lambda z, M: torch.where(M > 0, z.sin(), z.roll(1) ** 2)  # noqa: E731
    M = torch.tensor([1., -1, 1, -1, 1, -1], dtype=torch.float64)
    op = asd.prepare_jacobian(g, x, args=(M,))
    with pytest.raises(asd.CheckError):
        op(x, -M)
    torch.testing.assert_close(op(x, M.clone()).to_dense(), torch.func.jacrev(lambda z: g(z, M))(x))


def test_argument_values_nested_or_written_in_place_are_checked():
    x = torch.randn(N, dtype=torch.float64)
    deep = asd.prepare_jacobian(lambda z, box: _f_structure_follows_c(z, box[0][0][0][0]), x, args=([[[[0.0]]]],),
                                mode="forward")
    with pytest.raises(asd.CheckError):  # past the depth the snapshot walks: checked, not trusted
        deep(x, [[[[5.0]]]])
    M = torch.tensor(0.0, dtype=torch.float64)
    op = asd.prepare_jacobian(lambda z, c: _f_structure_follows_c(z, float(c)), x, args=(M,), mode="forward")
    M.fill_(5.0)  # the prepared argument itself, changed in place: a call without arguments uses it
    with pytest.raises(asd.CheckError):
        op(x)


def test_an_unchanged_argument_holding_nan_is_not_probed_again():
    x = torch.randn(N, dtype=torch.float64)
    f = lambda z, w: z.sin() * torch.nan_to_num(w) + z.roll(1)  # noqa: E731
    w = torch.tensor([1.0, float("nan"), 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, args=(w.clone(),))
    for _ in range(3):  # other tensor objects with the same bits (a NaN equals itself): nothing to check
        op(x, w.clone())
    assert op.last_check is None


@pytest.mark.parametrize("start", [0, 5])
def test_a_reverse_operator_survives_f_starting_to_write_into_its_input(start):
    """Reverse mode hands f a leaf that requires grad: autograd refuses the write, which reached the
    user as f's own error once the operator had settled."""
    writes = {"on": False}

    def f(z):
        if writes["on"]:
            z.mul_(2.0)
        return z.sin() * z.roll(1)
    x = torch.randn(N, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, mode="reverse")
    for i in range(8):
        writes["on"] = i >= start
        x = torch.randn(N, dtype=torch.float64)
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(lambda z: f(z.clone()))(x))


@pytest.mark.parametrize("hvp", ["auto", "forward_over_reverse", "reverse_over_forward"])
def test_a_hessian_of_a_function_writing_into_its_input(hvp):
    def f(z):
        z.mul_(2.0)
        return (z.sin() * z.roll(1)).sum()
    x = torch.randn(N, dtype=torch.float64)
    op = asd.prepare_hessian(f, x, hvp=hvp)
    for _ in range(3):
        x = torch.randn(N, dtype=torch.float64)
        torch.testing.assert_close(op(x).to_dense(), torch.func.hessian(lambda z: f(z.clone()))(x))


def test_a_sparse_argument_is_compared_by_content():
    """A sparse argument was compared by identity and version count: another object (which may take
    a freed one's id) with other values went unchecked."""
    x = torch.randn(N, dtype=torch.float64)
    f = lambda z, A: torch.where(A.to_dense().diagonal() > 0, z.sin(), z.roll(1) ** 2)  # noqa: E731
    A = torch.eye(N, dtype=torch.float64).to_sparse()  # COO (a CSR argument is probed at every call)
    op = asd.prepare_jacobian(f, x, args=(A,))
    op(x, A)  # the prepared argument itself, unchanged: nothing to check
    assert op.last_check is None
    with pytest.raises(asd.CheckError):
        op(x, (-torch.eye(N, dtype=torch.float64)).to_sparse())
    A.mul_(-1.0)  # the prepared argument itself, changed in place: a call without arguments uses it
    with pytest.raises(asd.CheckError):
        op(x)
