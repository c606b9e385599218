"""Session 43's adversarial hunt: a settled operator replaying its recorded graph (or compiled
kernels on the lean path) after something ``f`` reads changed in a way the guards missed. Each
gave a silent wrong matrix before its fix; each result is compared with dense ``jacrev``."""

import numpy as np
import pytest
import torch

import asd
from asd.backends.traced import CALLS_BEFORE_TRACING, Tracing

N = 10


def _settled(f, **options):
    op = asd.prepare_jacobian(f, torch.rand(N, dtype=torch.float64), **options)
    for _ in range(CALLS_BEFORE_TRACING + 5):
        op(torch.rand(N, dtype=torch.float64))
    return op


def _assert_jacrev(op, f, x):
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x.clone()), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compare", [torch.equal, torch.allclose], ids=["equal", "allclose"])
def test_a_branch_on_a_bool_computed_from_tensor_values_is_not_recorded(compare):
    """``torch.equal``/``torch.allclose`` hand back a Python bool without ``.item()``: the branch
    taken was kept in the recorded graph, and a float tensor changed in place is not part of the
    fingerprint (values follow it in a graph): the old branch answered."""
    gain = torch.ones(N, dtype=torch.float64)
    unit = torch.ones(N, dtype=torch.float64)

    def f(z):
        return torch.sin(z) if compare(gain, unit) else gain * torch.sin(z)

    op = _settled(f)
    gain.mul_(3.0)
    _assert_jacrev(op, f, torch.rand(N, dtype=torch.float64))


def test_a_tensor_read_through_dlpack_is_not_recorded():
    """numpy reading a captured tensor through ``__dlpack__`` bypasses dispatch like ``.numpy()``."""
    w = torch.ones(N, dtype=torch.float64)

    def f(z):
        return torch.from_numpy(np.from_dlpack(w).copy()) * torch.sin(z)

    op = _settled(f)
    w.fill_(3.0)
    _assert_jacrev(op, f, torch.rand(N, dtype=torch.float64))


def test_a_shape_source_written_through_data_is_seen():
    """A size read from a data-dependent shape (``mask.nonzero().shape[0]``) holds while the mask
    is unwritten; a write through ``.data`` moves no version counter, so its contents are compared."""
    mask = torch.zeros(N, dtype=torch.float64)
    mask[:2] = 1.0

    def f(z):
        return mask * torch.sin(z) / mask.nonzero().shape[0] + z ** 2

    op = _settled(f)
    mask.data[:5] = 1.0
    x = torch.rand(N, dtype=torch.float64)
    _assert_jacrev(op, f, x)
    _assert_jacrev(op, f, x + 1.0)


def _lazily_negated():
    z = torch.randn(N // 2, dtype=torch.complex128)
    x = z.conj().imag.as_strided((N,), (1,), 0)  # public ops: a contiguous, offset-0 view with the bit
    assert x.is_neg() and x.is_contiguous() and x.storage_offset() == 0
    return x


def _f(z):
    return torch.sin(z) * z.roll(1) + z.roll(-2) ** 2


def test_the_lean_path_copies_a_point_with_a_lazy_negation_bit(monkeypatch):
    """Compiled kernels read memory without PyTorch's lazy negation bit: the lean path must not
    hand them such a point as it is (a copy resolves the bit)."""
    seen = []
    real = Tracing._replay
    monkeypatch.setattr(Tracing, "_replay", lambda self, key, graph, xf, seeds: seen.append(xf) or real(
        self, key, graph, xf, seeds))
    op = _settled(_f)
    x = _lazily_negated()
    seen.clear()
    _assert_jacrev(op, _f, x)
    assert seen and all(not s.is_neg() and s.data_ptr() != x.data_ptr() for s in seen)


def test_compiled_kernels_get_a_point_with_a_lazy_negation_bit_resolved(tmp_path, monkeypatch):
    monkeypatch.setenv("ASD_CACHE_DIR", str(tmp_path))
    op = _settled(_f, compile=True)
    _assert_jacrev(op, _f, _lazily_negated())


@pytest.mark.parametrize("base", [float, int])
def test_a_number_subclass_of_the_users_own_is_not_taken_by_its_value(base):
    """A float (int) subclass whose arithmetic reads an attribute: the fingerprint keyed it by its
    value, so a changed attribute met the recorded graph. Its class is the user's and adds
    behaviour: nothing is recorded. (A subclass that adds nothing is still taken by its value.)"""
    class Scale(base):
        def __mul__(self, other):
            return other * (float(self) * self.factor)

        __rmul__ = __mul__

    s = Scale(1)
    s.factor = 1.0

    def f(z):
        return s * torch.sin(z)

    op = _settled(f)
    s.factor = 3.0
    _assert_jacrev(op, f, torch.rand(N, dtype=torch.float64))


def test_a_hessian_computed_in_float32_on_a_float64_input_defaults_to_star():
    """Acyclic substitution accumulates the products' rounding; the default took it where the
    input was float64, even when ``f`` computes in float32 (a float32 model on float64
    parameters), whose rounding its bound then took for float64's: entries 19-50% off, silently
    (found in asd.jax by an adversarial review). The trace's dtypes now count."""
    def chain(z):
        return ((z[1:] - z[:-1] ** 2) ** 2).sum()

    x = torch.rand(50, dtype=torch.float64)
    inside32 = asd.prepare_hessian(lambda z: chain(z.float()).double() + (z ** 2).sum(), x)
    assert type(inside32.coloring).__name__ == "StarColoring"
    assert torch.float32 in inside32.trace_info.float_dtypes
    assert type(asd.prepare_hessian(chain, x).coloring).__name__ == "AcyclicColoring"
