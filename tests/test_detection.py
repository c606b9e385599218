"""Jacobian sparsity detection: soundness and exactness per rule family, buffers and in-place
writes, several inputs, modules, local mode, verify, and errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from asd.detection import jacobian_sparsity
from asd.detection.verify import verify
from asd.errors import InputError, TracingError, UnsupportedOpError



@pytest.fixture(autouse=True)
def _float64_default():
    """float64 by default inside this module only (a module-level set would leak into other tests)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(saved)
SETTINGS = settings(max_examples=8, deadline=None)


def dense_union(f, x, points=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    acc = None
    for k in range(points):
        xp = x if k == 0 else torch.randn(x.shape, generator=gen)
        J = torch.autograd.functional.jacobian(lambda z: f(z).reshape(-1), xp).reshape(-1, x.numel())
        finite = J[torch.isfinite(J)]
        floor = 64 * torch.finfo(J.dtype).eps * finite.abs().max() if finite.numel() else 0.0
        nz = (J.abs() > floor).numpy()  # below the floor: rounding residue of a backward formula
        acc = nz if acc is None else acc | nz
    return acc


def check(f, x, exact=True, local=False):
    P = jacobian_sparsity(f, x, local=local).toarray()
    U = dense_union(f, x, points=1 if local else 3)
    assert P.shape == U.shape
    missed = U & ~P
    assert not missed.any(), f"missed {np.argwhere(missed)[:5].tolist()}"
    if exact:
        assert (P == U).all(), f"extra {np.argwhere(P & ~U)[:5].tolist()}"
    return P


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3)


# -- families on random shapes ---------------------------------------------------------------------------

@SETTINGS
@given(shapes, st.sampled_from([torch.sin, torch.exp, torch.tanh, lambda t: t * t, lambda t: 2 * t + 1,
                                 torch.sigmoid, lambda t: t.pow(3), F.softplus, F.gelu, F.silu, F.elu]))
def test_elementwise_unary(shape, fn):
    check(fn, torch.randn(shape))


@SETTINGS
@given(shapes, st.integers(0, 2))
def test_elementwise_broadcast(shape, k):
    c = torch.randn(shape[k % len(shape):])
    check(lambda t: t * c + t / (1 + c * c), torch.randn(shape))
    check(lambda t: t[..., :1] * t, torch.randn(shape))


@SETTINGS
@given(shapes, st.data())
def test_reductions(shape, data):
    x = torch.randn(shape)
    d = data.draw(st.integers(-len(shape), len(shape) - 1))
    for fn in (lambda t: t.sum(d), lambda t: t.mean(d, keepdim=True), lambda t: t.prod(d),
               lambda t: t.var(d) if t.shape[d] > 1 else t.sum(d), lambda t: t.norm(dim=d),
               lambda t: torch.logsumexp(t, d), lambda t: torch.softmax(t, d),
               lambda t: torch.log_softmax(t, d), lambda t: torch.cumsum(t, d), lambda t: torch.cumprod(t, d),
               lambda t: t.std(d) if t.shape[d] > 1 else t.sum(d), lambda t: torch.linalg.vector_norm(t, 3, dim=d)):
        check(fn, x, exact=shape[d] > 1)  # softmax over one element is constant


@SETTINGS
@given(shapes, st.data())
def test_selections_global_sound_local_exact(shape, data):
    x = torch.randn(shape)
    d = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, shape[d]))
    fns = [lambda t: t.amax(d), lambda t: t.amin(d), lambda t: t.max(d).values, lambda t: t.sort(d).values,
           lambda t: t.topk(k, d).values, lambda t: torch.relu(t), lambda t: t.abs(), lambda t: t.clamp(-0.5, 0.5),
           lambda t: torch.where(t > 0, t, 0.0), lambda t: torch.maximum(t, -t.flip(d))]
    for fn in fns:
        check(fn, x, exact=False)
        check(fn, x, local=True)


def test_local_sparser_than_global():
    x = torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
    for fn in (torch.relu, lambda t: t.amax(1), lambda t: t.sort(1).values[:, -1:], lambda t: t.clamp(max=2.0),
               lambda t: torch.where(t > 0, t, 0.0), lambda t: F.max_pool1d(t[None], 2)):
        g = jacobian_sparsity(fn, x).toarray()
        loc = check(fn, x, local=True)
        assert loc.sum() < g.sum()


@SETTINGS
@given(st.integers(3, 6), st.integers(0, 1), st.sampled_from(["constant", "reflect", "replicate", "circular"]))
def test_pad_modes(n, p, mode):
    check(lambda t: F.pad(t, (p, p + 1), mode=mode), torch.randn(1, 2, n))
    check(lambda t: F.pad(t, (p, 1, 1, p), mode=mode), torch.randn(1, 2, n, n))


@SETTINGS
@given(st.sampled_from([1, 2, 3]), st.integers(1, 2), st.integers(0, 1), st.integers(1, 2), st.integers(1, 2))
def test_convolutions(d, stride, padding, dilation, groups):
    x = torch.randn((1, 2 * groups) + (5,) * d)
    w = torch.randn((2 * groups, 2, ) + (2,) * d)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[d]
    check(lambda t: conv(t, w, stride=stride, padding=padding, dilation=dilation, groups=groups), x)
    check(lambda t: conv(x, t, stride=stride, padding=padding, dilation=dilation, groups=groups), w)


def test_conv_transpose_and_bias():
    x = torch.randn(1, 2, 4, 4)
    w = torch.randn(2, 3, 3, 3)
    check(lambda t: F.conv_transpose2d(t, w, stride=2, padding=1), x)
    check(lambda t: F.conv2d(x, w.transpose(0, 1), t), torch.randn(3))


@pytest.mark.parametrize("fn", [
    lambda t: F.max_pool2d(t, 2), lambda t: F.avg_pool2d(t, 3, stride=1, padding=1),
    lambda t: F.adaptive_avg_pool2d(t, 3), lambda t: F.max_pool1d(t.flatten(2), 3, stride=2),
    lambda t: F.avg_pool3d(t[None], (1, 2, 2)), lambda t: F.unfold(t, 2, stride=2), lambda t: F.pixel_shuffle(t, 2),
    lambda t: F.fold(F.unfold(t, 2, stride=2), (4, 4), 2, stride=2), lambda t: F.fold(F.unfold(t, 2), (4, 4), 2), lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"),
    lambda t: F.interpolate(t, size=(3, 5), mode="bicubic", align_corners=True),
    lambda t: F.interpolate(t, scale_factor=1.5, mode="nearest"),
    lambda t: F.grid_sample(t, torch.rand(1, 3, 3, 2) * 2 - 1, align_corners=False),
])
def test_spatial(fn):
    names = fn.__code__.co_names
    check(fn, torch.randn(1, 4, 4, 4), exact="grid_sample" not in names and "max_pool2d" not in names
          and "max_pool1d" not in names)


@pytest.mark.parametrize("fn", [
    lambda t: t.index_select(0, torch.tensor([2, 0, 2])), lambda t: t.index_add(0, torch.tensor([0, 0, 1]), t[:3] * 2),
    lambda t: t.index_put((torch.tensor([0, 0]),), t[1:3], accumulate=True),
    lambda t: t.index_put((torch.tensor([0, 1]),), t[2:4]),
    lambda t: t.scatter(0, torch.tensor([[1, 0, 2]]), t[3:4]),
    lambda t: t.scatter_add(0, torch.tensor([[1, 1, 2]]), t[3:4]),
    lambda t: t.scatter_reduce(0, torch.tensor([[1, 1, 2]]), t[3:4], "amax", include_self=False),
    lambda t: t.masked_fill(torch.tensor([True, False, True]), 0.0),
    lambda t: torch.where(torch.tensor([True, False, True]), t, t.flip(0)),
    lambda t: t.gather(1, torch.tensor([[0, 0], [2, 1], [1, 1], [0, 2]])),
    lambda t: t[torch.tensor([3, 1])], lambda t: t.T.reshape(-1)[::2], lambda t: torch.roll(t, 1, 0),
    lambda t: torch.diff(t, dim=0), lambda t: torch.kron(t[:2, :2], torch.randn(2, 2)),
    lambda t: torch.cross(t[:3], t[1:4], dim=0), lambda t: torch.cdist(t[:2], t[2:]),
])
def test_indexing_and_structured(fn):
    check(fn, torch.randn(4, 3), exact="amax" not in str(fn.__code__.co_consts))


# -- products, including sparse constants ------------------------------------------------------------------

@SETTINGS
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_products(m, k, p):
    A, B = torch.randn(m, k), torch.randn(k, p)
    check(lambda t: t @ B, A)
    check(lambda t: A @ t, B)
    check(lambda t: t @ t.T, A)
    check(lambda t: torch.addmm(torch.randn(m, p), t, B), A)
    check(lambda t: torch.bmm(t[None], B[None]), A)
    check(lambda t: torch.einsum("ij,jk->ik", t, B), A)
    check(lambda t: F.linear(t, B.T, torch.randn(p)), A)
    check(lambda t: torch.matmul(t, B[:, 0]), A)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_constant_operands(layout):
    M = torch.tensor([[1.0, 0, 2], [0, 0, 3], [4, 0, 0]])
    Ms = M.to_sparse() if layout == "coo" else M.to_sparse_csr()
    P = jacobian_sparsity(lambda t: torch.sparse.mm(Ms, t), torch.randn(3, 2)).toarray()
    U = dense_union(lambda t: M @ t, torch.randn(3, 2))
    assert (P == U).all()


# -- normalizations, attention, losses, embeddings, linalg, fft -----------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda t: F.layer_norm(t, (4,)), lambda t: F.group_norm(t, 2), lambda t: F.instance_norm(t),
    lambda t: F.batch_norm(t, None, None, training=True), lambda t: F.rms_norm(t, (4,)),
    lambda t: F.batch_norm(t, torch.zeros(4), torch.ones(4), training=False),
    lambda t: F.scaled_dot_product_attention(t, t, t), lambda t: F.scaled_dot_product_attention(t, t, t, is_causal=True),
    lambda t: F.scaled_dot_product_attention(t, t, t, attn_mask=torch.tril(torch.ones(4, 4, dtype=torch.bool))),
    lambda t: F.cross_entropy(t.reshape(-1, 4), torch.tensor([0, 1, 3, 2, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3][:t.numel() // 4]),
                              reduction="none"),
    lambda t: F.mse_loss(t, torch.zeros_like(t), reduction="none"), lambda t: F.huber_loss(t, t.flip(-1)),
    lambda t: F.embedding(torch.tensor([1, 0, 1]), t.reshape(-1, 4)),
    lambda t: F.embedding_bag(torch.tensor([0, 1, 1, 2]), t.reshape(-1, 4), torch.tensor([0, 1])),
    lambda t: torch.fft.rfft(t, dim=-1).abs(), lambda t: torch.fft.fft2(t).real,
])
def test_nn_ops(fn):
    x = torch.randn(2, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback rule
        check(fn, x, exact=False)


@pytest.mark.parametrize("fn", [
    torch.linalg.inv, torch.linalg.det, lambda t: torch.linalg.solve(t, torch.randn(3, 3, 2)),
    lambda t: torch.linalg.cholesky(t @ t.mT + 3 * torch.eye(3)), lambda t: torch.linalg.qr(t).R,
    lambda t: torch.linalg.eigh(t + t.mT).eigenvalues, lambda t: torch.linalg.solve(torch.randn(3, 3, 3) + 3 * torch.eye(3), t),
])
def test_linalg_batch_blocks(fn):
    x = torch.randn(3, 3, 3) + 3 * torch.eye(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        P = check(fn, x, exact=False)
    # batch b never depends on batch c != b
    rows_per = P.shape[0] // 3
    for b in range(3):
        blk = P[b * rows_per:(b + 1) * rows_per]
        assert not np.delete(blk, np.s_[b * 9:(b + 1) * 9], axis=1).any()


# -- buffers, in-place, views -----------------------------------------------------------------------------

def brusselator_like(u):
    n = u.shape[0]
    r = torch.zeros(n)
    r[1:-1] = u[:-2] - 2 * u[1:-1] + u[2:]
    r[0] = u[0]
    r += 0.1 * u ** 2
    e = torch.empty_like(u)
    e.copy_(u.flip(0))
    a = torch.arange(1, n + 1, dtype=u.dtype)
    return r + e * a


def test_buffers_and_inplace():
    check(brusselator_like, torch.randn(7))


def test_inplace_on_views():
    def f(x):
        y = x.clone()
        v = y[:, 1]
        v.mul_(2)
        y.T[0] += x[:, 2]
        y.view(-1)[0] = 0.0
        return y

    check(f, torch.randn(3, 3))


def test_detach_no_grad_dtype_0d_empty():
    check(lambda t: t * t.detach(), torch.randn(4))
    P = jacobian_sparsity(lambda t: t * t.detach().sum(), torch.randn(4)).toarray()
    assert (P == np.eye(4, dtype=bool)).all()

    def g(t):
        with torch.no_grad():
            s = t.sum()
        return t + s  # no_grad does not cut structural dependence

    check(g, torch.randn(3), exact=False)
    check(lambda t: t.float() * 2, torch.randn(3))
    check(lambda t: t * 2 + torch.ones(3, dtype=torch.float32), torch.randn(3))
    check(lambda t: t.sin(), torch.randn(()))
    assert jacobian_sparsity(lambda t: t * 2, torch.randn(0)).shape == (0, 0)
    assert jacobian_sparsity(lambda t: t.sum(0), torch.randn(0, 3)).shape == (3, 0)


def test_module_parameters_are_constants():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    P = check(lambda t: net(t), torch.randn(4, 3))
    assert P.sum() == 4 * 2 * 3
    bn = torch.nn.BatchNorm1d(3)
    before = bn.running_mean.clone()
    P = jacobian_sparsity(lambda t: bn(t), torch.randn(4, 3)).toarray()
    assert torch.equal(bn.running_mean, before)  # tracing leaves running statistics alone
    assert P.sum() == 3 * 4 * 4  # each output reads its channel over the batch
    check(lambda t: bn(t), torch.randn(4, 3), exact=False)


# -- several inputs, pytrees ------------------------------------------------------------------------------

def test_several_inputs_and_argnums():
    x, y = torch.randn(3), torch.randn(3)
    f = lambda a, b: a * b.roll(1)  # noqa: E731  (out[i] = a[i] * b[i - 1])
    Px, Py = jacobian_sparsity(f, (x, y))
    assert (Px.toarray() == np.eye(3, dtype=bool)).all()
    assert (Py.toarray() == np.roll(np.eye(3, dtype=bool), -1, axis=1)).all()
    Py2 = jacobian_sparsity(f, (x, y), argnums=1)
    assert (Py2.toarray() == Py.toarray()).all()
    (Px2,) = jacobian_sparsity(f, (x, y), argnums=(0,))
    assert (Px2.toarray() == Px.toarray()).all()
    # a non-float input that is not differentiated is allowed
    idx = torch.tensor([2, 0])
    P = jacobian_sparsity(lambda a, i: a[i], (x, idx), argnums=0)
    assert P.toarray().tolist() == [[False, False, True], [True, False, False]]


def test_pytree_outputs():
    f = lambda t: {"b": t[:2] * 2, "a": (t.sum(), [t[2:] ** 2])}  # noqa: E731
    P = jacobian_sparsity(f, torch.randn(4)).toarray()
    # tree_flatten order: dict keys sorted? torch keeps insertion order: b, then a's leaves
    assert P.shape == (2 + 1 + 2, 4)
    assert P[:2].tolist() == [[True, False, False, False], [False, True, False, False]]
    assert P[2].all() and P[3:].tolist() == [[False, False, True, False], [False, False, False, True]]


# -- verify -----------------------------------------------------------------------------------------------

def test_verify():
    f = lambda t: torch.cat([t[1:] - t[:-1], t[:1] ** 2])  # noqa: E731
    x = torch.randn(5)
    rep = verify(f, x)
    assert rep.ok and rep.precision == 1.0 and rep.recall == 1.0
    bad = verify(f, x, sp.identity(5, format="csr"))
    assert not bad.ok and len(bad.missed) == 5 and "MISSES" in str(bad)
    loose = verify(f, x, np.ones((5, 5), dtype=bool))
    assert loose.ok and loose.precision < 1


# -- errors -----------------------------------------------------------------------------------------------

def test_input_errors():
    with pytest.raises(InputError, match="dtype torch.int64"):
        jacobian_sparsity(lambda t: t, torch.arange(3))
    with pytest.raises(InputError, match="complex"):
        jacobian_sparsity(lambda t: t, torch.randn(3, dtype=torch.complex128))
    with pytest.raises(InputError, match="torch.Tensor"):
        jacobian_sparsity(lambda t: t, [1.0, 2.0][0])
    with pytest.raises(InputError, match="returned float"):
        jacobian_sparsity(lambda t: 1.0, torch.randn(3))
    with pytest.raises(InputError, match="dtype torch.bool"):
        jacobian_sparsity(lambda t: t > 0, torch.randn(3))
    with pytest.raises(InputError, match="input 1"):
        jacobian_sparsity(lambda a, b: a, (torch.randn(2), torch.arange(2)))


@pytest.mark.parametrize("fn,what", [
    (lambda t: t * 2 if t.sum() > 0 else t, "control flow"),
    (lambda t: t * t.sum().item(), "Python number"),
    (lambda t: t * t.tolist()[0], ""),
    (lambda t: torch.tensor(np.asarray(t)), ""),
    (lambda t: t[t > 0], ""),
    (lambda t: t.nonzero().double(), ""),
])
def test_global_tracing_errors(fn, what):
    with pytest.raises(TracingError, match=what):
        jacobian_sparsity(fn, torch.randn(4))


def test_local_tracing_handles_values():
    x = torch.tensor([1.0, -1.0, 2.0])
    P = jacobian_sparsity(lambda t: t[t > 0] * 2, x, local=True).toarray()
    assert P.tolist() == [[True, False, False], [False, False, True]]
    P = jacobian_sparsity(lambda t: t * 2 if t.sum() > 0 else t, x, local=True)
    assert P.shape == (3, 3)


def test_strict_raises():
    @torch.library.custom_op("asdtest::twice", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @op.register_fake
    def _(x):
        return torch.empty_like(x)

    with pytest.raises(UnsupportedOpError, match="no sparsity rule"):
        jacobian_sparsity(op, torch.randn(3), strict=True)
    with pytest.warns(UserWarning, match="conservative"):
        P = jacobian_sparsity(op, torch.randn(3))
    assert P.toarray().all()


def test_fill_values_of_movement_ops_carry_no_dependence():
    """Scalar fill values (masked_fill, constant padding, scatter.value) depend on no input."""
    x = torch.randn(6, dtype=torch.float64)
    mask = torch.tensor([True, False, True, False, False, True])
    cases = [
        lambda v: v.masked_fill(mask, 5.0),
        lambda v: torch.nn.functional.pad(v, (2, 3), value=3.0),
        lambda v: torch.scatter(v, 0, torch.tensor([1, 4]), 4.0),
        lambda v: torch.scatter(v[0], 0, torch.tensor(0), 2.5),
    ]
    for f in cases:
        P = jacobian_sparsity(f, x).toarray()
        J = torch.autograd.functional.jacobian(f, x).reshape(P.shape) != 0
        assert (P == J.numpy()).all()


def test_metadata_memo_tells_python_number_types_apart():
    """``+ 1`` and ``+ 1.0`` on an integer tensor have different result dtypes: the memo of the
    tracer's metadata keys on the number's type too."""
    from asd.detection import jacobian_pattern

    def f(x):
        a = (x > 0).long() + 1
        b = (x > 0).long() + 1.0
        assert a.dtype == torch.int64 and b.dtype == torch.get_default_dtype(), (a.dtype, b.dtype)
        return x * b
    jacobian_pattern(f, torch.rand(5))
