"""Ops that address their input's storage: ``as_strided`` (and ``as_strided_``), ``as_strided_copy``
and ``as_strided_scatter`` count positions from the storage of ``self``, not from its first element.

On a view (an offset, other strides) they read or write elements outside it. Detection ran
``as_strided_copy`` and ``as_strided_scatter`` on ids of ``self``'s own elements and named other
elements (an unsound pattern); and PyTorch's derivatives of these ops are wrong in every AD mode
(plain reverse included) in the cases listed in :mod:`asd.detection.ad_gaps`, so operators refuse
such functions. Every reference here is central finite differences, not PyTorch's derivative."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import asd
from asd.detection import hessian_sparsity, jacobian_sparsity

N = 12


def _x(seed=0):
    return torch.rand(N, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5


def _central(f, x, eps=1e-6):
    cols = []
    for j in range(x.numel()):
        e = torch.zeros_like(x)
        e[j] = eps
        cols.append(((f(x + e) - f(x - e)) / (2 * eps)).reshape(-1))
    return torch.stack(cols, dim=1).numpy()


def _pattern_is_exact(f, x):
    fd = np.abs(_central(f, x)) > 1e-6
    for local in (False, True):
        P = jacobian_sparsity(f, x, local=local).toarray()
        assert P.shape == fd.shape
        assert not (fd & ~P).any(), f"unsound (local={local}): entries {np.argwhere(fd & ~P)[:5].tolist()}"
        assert not (P & ~fd).any(), f"imprecise (local={local}): entries {np.argwhere(P & ~fd)[:5].tolist()}"


# a view of an intermediate (its storage: 12 elements), the window on that storage
VIEWS = {"whole": lambda y: y, "offset": lambda y: y[2:], "head": lambda y: y[:6],
         "transposed": lambda y: y.reshape(3, 4).t(), "strided": lambda y: y[1::2]}
# (``None``: the storage offset left out, which means the input's own)
WINDOWS = [((3,), (2,), 0), ((3,), (2,), 1), ((3,), (2,), 3), ((2, 2), (4, 1), 5), ((4,), (3,), 0),
           ((3,), (2,), None)]


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("size,stride,offset", WINDOWS)
def test_as_strided_copy_reads_the_storage_of_its_input(view, size, stride, offset):
    v = VIEWS[view]
    _pattern_is_exact(lambda x: torch.as_strided_copy(v(x * 1.5), size, stride, offset).reshape(-1), _x())


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("size,stride,offset", WINDOWS)
def test_as_strided_view_reads_the_storage_of_its_input(view, size, stride, offset):
    v = VIEWS[view]
    _pattern_is_exact(lambda x: torch.as_strided(v(x * 1.5), size, stride, offset).reshape(-1) * 2.0, _x())


@pytest.mark.parametrize("view", ["whole", "offset", "head"])
@pytest.mark.parametrize("size,stride,offset", [w for w in WINDOWS if (w[2] or 2) + (w[0][0] - 1) * w[1][0] < 10])
def test_as_strided_scatter_writes_the_storage_of_its_input(view, size, stride, offset):
    v = VIEWS[view]
    k = int(np.prod(size))

    def f(x):
        src = (x[-k:] * 3.0).reshape(size)
        return torch.as_strided_scatter(v(x * 1.5), src, size, stride, offset).reshape(-1)

    _pattern_is_exact(f, _x())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 6), st.integers(1, 4), st.integers(1, 3), st.integers(0, 4), st.booleans())
def test_windows_on_random_views(start, length, step, offset, scatter):
    """Any window that stays within the 12-element storage, on a slice ``y[start::step]``."""
    if offset + (length - 1) * step >= N:
        return

    def f(x):
        base = (x * 1.5)[start::step]
        if scatter:
            if base.numel() < 1 or start + (base.numel() - 1) * step >= N:
                return base * 1.0
            return torch.as_strided_scatter(base, x[:length] * 3.0, (length,), (step,), offset)
        return torch.as_strided_copy(base, (length,), (step,), offset)

    try:
        f(_x())
    except RuntimeError:  # a window PyTorch refuses for this view
        return
    _pattern_is_exact(f, _x())


# -- PyTorch's derivatives: the table's entries still show their gap, and operators refuse them --------

GAP_CASES = {
    "as_strided_copy before the view": lambda x: torch.as_strided_copy((x * 1.5)[2:], (3,), (2,), 0),
    "as_strided after the view": lambda x: torch.as_strided((x * 1.5)[:6], (3,), (2,), 4) * 2.0,
    "as_strided_ before the view": lambda x: (x * 1.5)[2:].as_strided_((3,), (2,), 1) * 2.0,
    "as_strided_scatter": lambda x: torch.as_strided_scatter(x * 1.5, x[:3] * 2.0, (3,), (2,), 0),
    "as_strided_scatter, constant source": lambda x: torch.as_strided_scatter(
        x * 1.5, torch.ones(3, dtype=x.dtype), (3,), (2,), 1),
}
FINE_CASES = {
    "as_strided_copy within a transposed view": lambda x: torch.as_strided_copy(
        (x * 1.5).reshape(3, 4).t(), (3,), (2,), 1),
    "as_strided within the view": lambda x: torch.as_strided((x * 1.5)[2:], (3,), (2,), 3) * 2.0,
    "as_strided_scatter into a constant": lambda x: torch.as_strided_scatter(
        torch.zeros(N, dtype=x.dtype), x[:3] * 2.0, (3,), (2,), 1),
}


@pytest.mark.parametrize("name", sorted(GAP_CASES))
def test_the_gap_entries_still_show_their_gap(name):
    """PyTorch's plain reverse mode disagrees with finite differences (else the table entry is stale)."""
    f, x = GAP_CASES[name], _x()
    plain = torch.autograd.functional.jacobian(f, x, vectorize=False).reshape(-1, N).numpy()
    assert np.abs(plain - _central(f, x)).max() > 1e-3


@pytest.mark.parametrize("name", sorted(GAP_CASES))
def test_operators_refuse_a_function_no_ad_mode_differentiates(name):
    f, x = GAP_CASES[name], _x()
    _pattern_is_exact(f, x)  # detection alone is right
    for mode in ("forward", "reverse"):
        with pytest.raises(asd.ADGapError, match="every AD mode"):
            asd.sparse_jacobian(f, x, mode=mode)
    with pytest.raises(asd.ADGapError):
        asd.prepare_jacobian(f, x, pattern=jacobian_sparsity(f, x))
    with pytest.raises(asd.ADGapError):
        asd.sparse_hessian(lambda z: (f(z) ** 2).sum(), x)


@pytest.mark.parametrize("name", sorted(FINE_CASES))
def test_windows_whose_derivative_pytorch_gets_right_are_evaluated(name):
    f, x = FINE_CASES[name], _x()
    _pattern_is_exact(f, x)
    want = _central(f, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mode in ("forward", "reverse"):
            J = asd.sparse_jacobian(f, x, mode=mode).to_dense().numpy()
            np.testing.assert_allclose(J, want, atol=1e-7)
        H = asd.sparse_hessian(lambda z: (f(z) ** 2).sum(), x).to_dense()
        torch.testing.assert_close(H, torch.autograd.functional.hessian(lambda z: (f(z) ** 2).sum(), x))
        assert hessian_sparsity(lambda z: (f(z) ** 2).sum(), x).nnz >= int((H != 0).sum())


# -- what the review of the first version found ------------------------------------------------------

def test_in_place_view_ops_on_a_tensor_that_owns_its_storage():
    """``t_`` / ``as_strided_`` on the tensor owning a storage change its metadata, not the layout
    the storage's sets follow."""
    def restrided(x):
        y = x * 1.5
        y.as_strided_((3,), (3,), 1)
        return y * 2.0

    def transposed_then_window(x):
        y = x.reshape(3, 4) * 1.5
        y.t_()
        return torch.as_strided(y, (3,), (1,), 1) * 2.0 + torch.as_strided_copy(y, (2,), (4,), 2).sum()

    for f in (restrided, transposed_then_window):
        _pattern_is_exact(f, _x())
        J = asd.sparse_jacobian(f, _x(), mode="reverse").to_dense().numpy()
        np.testing.assert_allclose(J, _central(f, _x()), atol=1e-7)


def test_a_window_off_constant_elements_into_traced_storage():
    """The view's own elements are constants; the window reads traced elements before it (PyTorch's
    derivative gives them zero: refused) or constant ones (PyTorch is right: evaluated)."""
    into_traced = lambda x: torch.cat([torch.zeros(2, dtype=x.dtype), x * 1.5])[:2].as_strided((3,), (1,), 0) * 2.0  # noqa: E731
    off_constants = lambda x: torch.cat([torch.ones(4, dtype=x.dtype), x[4:] * 1.5])[2:].as_strided((3,), (2,), 0) * 2.0  # noqa: E731
    for f in (into_traced, off_constants):
        _pattern_is_exact(f, _x())
    with pytest.raises(asd.ADGapError):
        asd.sparse_jacobian(into_traced, _x())
    np.testing.assert_allclose(asd.sparse_jacobian(off_constants, _x()).to_dense().numpy(),
                               _central(off_constants, _x()), atol=1e-7)


def test_a_scatter_of_traced_values_into_a_constant_view_is_refused():
    """With respect to ``src`` PyTorch's derivative is wrong where ``self`` is a view off its
    storage's start (the Hessian came out wrong without a warning)."""
    f = lambda x: torch.as_strided_scatter(torch.zeros(N, dtype=x.dtype)[2:], x[:3] ** 2, (3,), (2,), 1)  # noqa: E731
    _pattern_is_exact(f, _x())
    plain = torch.autograd.functional.jacobian(f, _x(), vectorize=False).numpy()
    assert np.abs(plain - _central(f, _x())).max() > 1e-3  # the gap is still there
    with pytest.raises(asd.ADGapError):
        asd.sparse_hessian(lambda z: (f(z) ** 2).sum(), _x())
    with pytest.raises(asd.ADGapError):
        asd.sparse_jacobian(f, _x())


def test_a_window_on_a_reinterpreting_view_is_refused():
    """After ``view_as_real`` a window counts real elements of a complex storage: not traced (it
    was traced as positions of the complex storage, missing every entry)."""
    def f(x):
        z = torch.view_as_complex(x.reshape(6, 2)) * (1 + 2j)
        return torch.view_as_real(z).as_strided((3,), (1,), 1) * 2.0

    with pytest.raises(asd.TracingError, match="element size"):
        jacobian_sparsity(f, _x())


def test_windows_off_a_captured_constant_view_are_not_refused():
    """A constant captured from outside ``f`` is a view of a larger tensor: a window before it reads
    constants, which PyTorch differentiates right (it was refused)."""
    big = torch.rand(20, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    # the slice inside f: the tracer holds the view as a constant whose storage is the view
    for f in (lambda x: x * torch.as_strided(big[3:], (N,), (1,), 0),
              lambda x: x * torch.as_strided_copy(big[3:], (N,), (1,), 1)):
        _pattern_is_exact(f, _x())
        for mode in ("forward", "reverse"):
            J = asd.sparse_jacobian(f, _x(), mode=mode).to_dense().numpy()
            np.testing.assert_allclose(J, _central(f, _x()), atol=1e-7)


def test_a_scatter_addressed_from_the_views_own_start_is_evaluated():
    """``storage_offset`` left out: the window starts at the (contiguous) view's own first element,
    where PyTorch's derivative with respect to the source is right."""
    f = lambda x: torch.as_strided_scatter(torch.zeros(N, dtype=x.dtype)[2:], x[:3] ** 2, (3,), (2,))  # noqa: E731
    _pattern_is_exact(f, _x())
    np.testing.assert_allclose(asd.sparse_jacobian(f, _x()).to_dense().numpy(), _central(f, _x()), atol=1e-7)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_with_a_whole_dimension(accumulate):
    """ATen's ``None`` index in ``index_put`` is a whole dimension (``y[:, idx] = v``); it was read as
    Python's new axis (an unsound pattern, a wrong Jacobian)."""
    idx = torch.tensor([2, 0])

    def f(x):
        y = x.reshape(3, 4) * 1.5
        return torch.ops.aten.index_put_(y, [None, idx], x[:6].reshape(3, 2) ** 2, accumulate).reshape(-1)

    _pattern_is_exact(f, _x())
    np.testing.assert_allclose(asd.sparse_jacobian(f, _x()).to_dense().numpy(), _central(f, _x()), atol=1e-7)


@pytest.mark.parametrize("offset, stride", [(1, 2), (0, 3), (2, 1)])
@pytest.mark.parametrize("write", ["copy_", "add_"])
def test_a_write_through_a_window_of_a_fresh_constant_reaches_it(offset, stride, write):
    """``as_strided`` of a buffer made inside ``f`` (no index sets yet) was traced as a copy, so a
    write through the window never reached the buffer: an empty pattern and a zero Jacobian and
    Hessian, without a word."""
    n = 4

    def f(x):
        a = torch.zeros(offset + stride * (n - 1) + 3, dtype=x.dtype)
        getattr(a.as_strided((n,), (stride,), offset), write)(x[:n] ** 2)
        return a * 1 + a.roll(1)

    x = _x()
    _pattern_is_exact(f, x)
    for mode in ("forward", "reverse"):
        torch.testing.assert_close(asd.sparse_jacobian(f, x, mode=mode).to_dense(), torch.func.jacrev(f)(x),
                                   rtol=1e-12, atol=1e-12)

    def g(x):
        a = torch.zeros(offset + stride * (n - 1) + 1, dtype=x.dtype)
        getattr(a.as_strided((n,), (stride,), offset), write)(x[:n])
        return (a[1:] * a[:-1]).sum() + (a ** 3).sum()

    H = asd.sparse_hessian(g, x).to_dense()
    torch.testing.assert_close(H, torch.func.hessian(g)(x), rtol=1e-12, atol=1e-12)
    assert H.abs().sum() > 0


def test_a_write_through_a_window_beyond_a_captured_view_is_refused():
    """A window off a captured view (``big[3:]``) that reaches the larger tensor behind it is read as
    a copy of constants; a write through it would not reach the view that ``f`` then reads (a zero
    Jacobian where ``b[1]`` is ``x[2]``): refused with a TracingError."""
    big = torch.zeros(12, dtype=torch.float64)

    def f(x):
        b = big[3:]
        b.as_strided((3,), (2,), 0).copy_(x[:3])  # writes big[0], big[2], big[4]: b[1] is x[2]
        return b * 1

    with pytest.raises(asd.TracingError, match="as_strided"):
        asd.sparse_jacobian(f, _x())
