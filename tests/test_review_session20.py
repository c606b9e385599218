"""Review of session 20's commits (eager replay variants, fingerprint fast path, issue-16 fixes):
defects found by the reviewer, each fixed; a test per defect."""

import enum
import sys
import warnings

import numpy as np
import pytest
import torch

import asd
import asd.scipy
from asd.backends import replay, traced


# -- eager replay: what the variants must keep ------------------------------------------------------

@pytest.mark.parametrize("variant", ["folded", "pushed"])
def test_replay_variants_read_captured_tensors_by_reference(monkeypatch, variant):
    """A captured float tensor updated in place (an optimizer step) is seen by every variant."""
    monkeypatch.setattr(replay, "_seconds", lambda fn, a, b: 0.0 if fn.variant == variant else 1.0)
    N = 8
    g = torch.Generator().manual_seed(0)
    W = torch.rand(N * N, dtype=torch.float64, generator=g) + 0.5

    def f(x):
        u = x.reshape(N, N)
        lap = torch.roll(u, 1, 0) + torch.roll(u, -1, 1) - 2 * u
        return (torch.where(u > 0.3, u * u, -u) * lap).reshape(-1) * W

    x = torch.rand(N * N, dtype=torch.float64, generator=g) - 0.2
    op = asd.prepare_jacobian(f, x, mode="forward", check=False)
    for _ in range(traced.CALLS_BEFORE_TRACING + 2):
        op.values(x)
    r = (getattr(op.state, "fused", None) or op.state.products).tracing.replay
    assert r.chosen == variant, (r.timings, r.notes)
    W.mul_(1.7)
    x2 = torch.rand(N * N, dtype=torch.float64, generator=g) - 0.5
    ref = asd.prepare_jacobian(f, x, mode="forward", check=False, trace=False)
    assert torch.equal(op.values(x2), ref.values(x2))
    torch.testing.assert_close(op(x2).to_dense(), torch.func.jacrev(f)(x2), rtol=1e-12, atol=1e-12)


def test_same_bits_distinguishes_inf_from_the_largest_float():
    a = torch.tensor([float("inf"), float("nan")], dtype=torch.float64)
    b = torch.tensor([torch.finfo(torch.float64).max, float("nan")], dtype=torch.float64)
    assert not replay._same(a, b)
    assert not replay._same(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert replay._same(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    one = torch.tensor([1.0])
    assert not replay._same(torch.complex(one, one * 0.0), torch.complex(one, one * -0.0))


# -- fingerprint fast path ---------------------------------------------------------------------------

class _Flag(enum.IntEnum):
    A = 1


class _Str(str):
    pass


@pytest.mark.parametrize("leaf", [np.float64(1.5), b"ab", _Flag.A, _Str("a")], ids=["np.float64", "bytes", "IntEnum", "str-subclass"])
def test_fingerprint_scalars_below_the_depth_limit(leaf):
    from asd.cache import _Fingerprint, value_fingerprint

    obj = [[[[[leaf]]]]]  # the leaf at depth 5, where the general chain answers scalars by value
    summary, complete = value_fingerprint(obj)
    assert complete
    for values in (True, False):
        fp = _Fingerprint(values=values)
        inner = fp(obj)[2][2][2][2][2]
        assert fp.complete and not (isinstance(inner, tuple) and inner[:1] == ("deep",)), inner


# -- numpy inputs to operators -----------------------------------------------------------------------

def test_numpy_input_of_another_shape_is_refused():
    def f(x):
        return torch.sin(x) * torch.roll(x, 1, 0)

    op = asd.prepare_jacobian(f, torch.rand(3, 4, dtype=torch.float64), check=False)
    with pytest.raises(asd.InputError):
        op.values(np.random.default_rng(0).random((4, 3)))


def test_flat_numpy_input_is_reshaped():
    def f(x):
        return torch.sin(x) * torch.roll(x, 1, 0)

    x = torch.rand(3, 4, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x, check=False)
    z = np.random.default_rng(0).random(12)
    assert torch.equal(op.values(z), op.values(torch.as_tensor(z).reshape(3, 4)))


# -- SciPy adapters ----------------------------------------------------------------------------------

def _scaled(z, data):
    d = data[0] if isinstance(data, (list, tuple)) else data
    return (z * z).sum() * torch.as_tensor(d, dtype=z.dtype).sum()


@pytest.mark.parametrize("wrap", [list, tuple])
def test_scipy_grad_sees_a_changed_array_inside_a_container(wrap):
    x = np.linspace(0.1, 1.0, 5)
    big1 = np.ones(2000)
    big2 = big1.copy()
    big2[1000] = 5.0
    g = asd.scipy.grad(_scaled, x, args=(wrap([big1]),))
    g(x, wrap([big1]))
    np.testing.assert_allclose(g(x, wrap([big2])), 2 * x * big2.sum(), rtol=1e-12)


def test_scipy_hess_accepts_a_sparse_tensor_argument():
    n = 6
    A = (2 * torch.eye(n, dtype=torch.float64)).to_sparse_csr()

    def f(z, A):
        return (z * (A @ z)).sum() + (z ** 4).sum()

    x = np.linspace(0.1, 1, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        H = asd.scipy.hess(f, x, args=(A,))(x, A)
    np.testing.assert_allclose(H.toarray(), np.diag(4 + 12 * x ** 2), rtol=1e-12)


# -- Newton's runaway rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["on", "off"])
def test_undamped_newton_that_climbs_then_converges(monkeypatch, rule):
    """An undamped run whose residual climbs for a while, then converges (step 147): the runaway
    rule must not stop it (with the rule off it converges the same way)."""
    from asd.solvers import newton

    if rule == "off":
        monkeypatch.setattr(sys.modules["asd.solvers.newton"], "DIVERGING_STEPS", 10 ** 9)
    c = (-0.32251198, 0.3133258, -0.24502364)

    def f(x):
        return torch.atan(c[0] * x + c[1]) + c[2] * torch.sin(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = newton(f, torch.tensor([4.324614010284018], dtype=torch.float64), damping=False, maxiter=300)
    assert res.converged and abs(float(f(res.x))) < 1e-12, (res.status, res.iterations)
