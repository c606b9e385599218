"""Random compositions of PyTorch ops: asd's sparse derivatives against dense float64 autograd.

Each example composes 2-6 ops from :data:`POOL` (elementwise, binary, complex, reductions, indexing,
scatter, cumulative, matmul, conv, norms, softmax, sort/topk, cdist, linalg, in place) plus a final
op, on a 1-D float64 input of 4..12 elements, and samples the derivative and its options: a
Jacobian (``mode`` forward / reverse / auto or ``coloring="bidirectional"``, an order from
:data:`asd.coloring.ORDERS`, ``batch_size``), or a Hessian of ``f(x).sum()`` or ``(f(x)**2).sum()``
(``coloring`` star / acyclic / default, both HVP flavours); global or ``local`` patterns.

An example fails when asd returns a wrong value (beyond ``1e-8`` of the reference's scale; the
reference is plain reverse-mode autograd whatever mode asd used, for Hessians reverse-over-reverse
unless central differences side with another flavour, see :func:`_adjudicated_hessian`), a pattern that misses a nonzero of the dense derivative (at the point and, for global
patterns, at a second random point), or raises an exception that is not one of asd's own errors
("crash"). Rejected, not failed: asd refusing with an :class:`asd.AsdError` (a ``TracingError``
under global tracing, a ``CheckError`` of the cross-mode probe), a dense reference that fails or
is not finite, a point where forward- and reverse-mode dense autograd disagree (a tie or kink: the
derivative is not defined there), a crash where PyTorch itself lacks the formula of asd's AD mode
(``torch_limitation``, e.g. no forward AD of ``cdist``), and entries of :data:`KNOWN_FAILURES`
(each also an ``xfail(strict=True)`` test that turns red once fixed).

``test_fuzz_default`` runs 300 derandomized examples in the default suite, ``test_fuzz_slow`` 5,000
(``-m slow``). Run as a script for a tally of every outcome over many random examples::

    .venv/bin/python tests/test_fuzz.py --examples 2000 [--seed 0]
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import asd
from asd.coloring import ORDERS
from asd.errors import AsdError, CheckError

SIZES = (4, 6, 8, 12)  # input sizes
MAX_SIZE = 24  # largest intermediate size
RTOL = 1e-8  # value tolerance, relative to the reference's largest entry
NONZERO = 1e-10  # a dense entry above this (relative to the scale) must be in the pattern


# -- the op pool -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """``fn`` maps a 1-D float64 tensor of ``n`` elements, for every ``n`` with ``accepts(n)``, to a
    1-D tensor whose size depends only on ``n`` (see :func:`out_size`)."""

    name: str
    family: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    accepts: Callable[[int], bool]


POOL: dict[str, Op] = {}


def _add(family: str, name: str, fn: Callable, div: int = 1, min_n: int = 2, accepts: Callable | None = None):
    if name in POOL:
        raise ValueError(f"duplicate op {name}")
    ok = accepts or (lambda n: n % div == 0 and n >= min_n)
    POOL[name] = Op(name, family, lambda t: fn(t).reshape(-1), ok)


@lru_cache(maxsize=None)
def const(tag: str, *shape: int) -> torch.Tensor:
    """A deterministic float64 constant of ``shape``, the same on every call."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{tag}{shape}".encode()))
    return torch.randn(*shape, generator=g, dtype=torch.float64)


@lru_cache(maxsize=None)
def perm(n: int) -> torch.Tensor:
    """A fixed permutation of ``range(n)``."""
    g = torch.Generator().manual_seed(1000 + n)
    return torch.randperm(n, generator=g)


@lru_cache(maxsize=None)
def dup_index(n: int, m: int) -> torch.Tensor:
    """A fixed index vector of ``n`` entries into ``range(m)`` with repetitions."""
    return torch.tensor([(3 * i + 1) % m for i in range(n)])


@lru_cache(maxsize=None)
def mask(n: int) -> torch.Tensor:
    """A fixed boolean mask of ``n`` entries, neither all true nor all false."""
    return torch.tensor([(i * 7 + 3) % 5 < 2 for i in range(n)])


def _rows(t, k=2):  # (k, n/k)
    return t.reshape(k, -1)


def _pairs(t):  # (n/2, 2)
    return t.reshape(-1, 2)


def _blocks(t):  # (n/4, 2, 2)
    return t.reshape(-1, 2, 2)


def _cpairs(t):
    return torch.view_as_complex(_pairs(t).contiguous())


def _eye_blocks(t):
    return torch.eye(2, dtype=t.dtype).expand(t.numel() // 4, 2, 2)


def _half(t):
    h = t.numel() // 2
    return t[:h], t[h:]


def _square(n):
    return n >= 4 and math.isqrt(n) ** 2 == n


def _sq(t):  # (k, k) for k * k elements
    return t.reshape(math.isqrt(t.numel()), -1)


# elementwise unary
E = "elementwise"
_add(E, "sin", torch.sin)
_add(E, "cos", torch.cos)
_add(E, "exp", lambda t: torch.exp(0.5 * t))
_add(E, "tanh", torch.tanh)
_add(E, "sigmoid", torch.sigmoid)
_add(E, "softplus", F.softplus)
_add(E, "log1p_abs", lambda t: torch.log1p(t.abs()))
_add(E, "sqrt_abs", lambda t: torch.sqrt(t.abs() + 0.1))
_add(E, "erf", torch.erf)
_add(E, "relu", torch.relu)
_add(E, "elu", F.elu)
_add(E, "gelu", F.gelu)
_add(E, "silu", F.silu)
_add(E, "abs", torch.abs)
_add(E, "square", lambda t: t * t)
_add(E, "recip", lambda t: 1 / (1 + t**2))
_add(E, "clamp", lambda t: torch.clamp(t, -0.7, 0.7))
_add(E, "where_pos", lambda t: torch.where(t > 0, t**2, torch.sin(t)))
_add(E, "maximum_roll", lambda t: torch.maximum(t, torch.roll(t, 1) + 0.1))
_add(E, "minimum_flip", lambda t: torch.minimum(t, t.flip(0) - 0.1))
_add(E, "cube", lambda t: t**3)
_add(E, "atan", torch.atan)
_add(E, "asinh", torch.asinh)
_add(E, "logsigmoid", F.logsigmoid)
_add(E, "leaky_relu", lambda t: F.leaky_relu(t, 0.1))
_add(E, "mish", F.mish)
_add(E, "rsqrt", lambda t: torch.rsqrt(1 + t**2))
_add(E, "expm1", lambda t: torch.expm1(0.3 * t))
_add(E, "xlogy", lambda t: torch.xlogy(t, 1 + t**2))
_add(E, "floor_mul", lambda t: t * torch.floor(t))
_add(E, "sign_mul", lambda t: t * torch.sign(t - 0.1))
_add(E, "hardtanh", lambda t: F.hardtanh(t, -0.8, 0.9))
_add(E, "softsign", F.softsign)
_add(E, "selu", F.selu)
_add(E, "sinc", torch.sinc)
_add(E, "frac", torch.frac)
_add(E, "detach_mix", lambda t: t + t.detach() ** 2 * t.mean().detach())

# binary ops of the input with shifted / rolled / flipped copies of itself
B = "binary"
_add(B, "mul_roll", lambda t: t * torch.roll(t, 1))
_add(B, "add_flip", lambda t: t + 2 * t.flip(0))
_add(B, "div_shift", lambda t: t / (1 + torch.roll(t, 2) ** 2))
_add(B, "pow_roll", lambda t: torch.pow(1 + t**2, 0.5 * torch.roll(t, -1)))
_add(B, "diff", lambda t: torch.diff(t, prepend=t[:1] * 0.5))
_add(B, "lerp", lambda t: torch.lerp(t, t.flip(0), torch.sigmoid(t)))
_add(B, "addcmul", lambda t: torch.addcmul(t, torch.roll(t, 1), t.flip(0), value=0.5))
_add(B, "hypot_roll", lambda t: torch.hypot(t, torch.roll(t, 1)))
_add(B, "atan2_roll", lambda t: torch.atan2(t, torch.roll(t, 1) + 2.5))
_add(B, "mul_swap_halves", lambda t: t * torch.cat(_half(t)[::-1]), div=2)

# complex intermediates
C = "complex"
_add(C, "rfft_abs", lambda t: torch.fft.rfft(t).abs())
_add(C, "fft_real", lambda t: torch.fft.fft(t).real)
_add(C, "fft_imag", lambda t: torch.fft.fft(t).imag + t)
_add(C, "irfft_rfft", lambda t: torch.fft.irfft(torch.fft.rfft(t) * 0.5, n=t.numel()))
_add(C, "cpair_abs", lambda t: _cpairs(t).abs(), div=2)
_add(C, "cpair_angle", lambda t: _cpairs(t).angle(), div=2)
_add(C, "cpair_sgn", lambda t: torch.view_as_real(torch.sgn(_cpairs(t))), div=2)
_add(C, "cpair_square", lambda t: torch.view_as_real(_cpairs(t) ** 2), div=2)
_add(C, "cpair_real_imag", lambda t: torch.stack([(_cpairs(t) * (0.3 + 0.7j)).real,
                                                   (_cpairs(t) * (0.3 + 0.7j)).imag]), div=2)
_add(C, "mul_1j_abs", lambda t: (t * 1j + 0.5).abs())
_add(C, "exp_1j", lambda t: torch.view_as_real(torch.exp(1j * t)))
_add(C, "polar", lambda t: torch.view_as_real(torch.polar(t.abs() + 0.5, t)))

# reductions (over a reshaped dim, some broadcast back)
R = "reduction"
_add(R, "sum_rows", lambda t: _rows(t).sum(0), div=2, min_n=4)
_add(R, "mean_center", lambda t: _rows(t) - _rows(t).mean(1, keepdim=True), div=2)
_add(R, "prod_pairs", lambda t: _pairs(t).prod(1), div=2, min_n=4)
_add(R, "amax_pairs", lambda t: _pairs(t).amax(1), div=2, min_n=4)
_add(R, "amin_bcast", lambda t: _rows(t) * _rows(t).amin(1, keepdim=True), div=2)
_add(R, "logsumexp_pairs", lambda t: _pairs(t).logsumexp(1), div=2, min_n=4)
_add(R, "norm_pairs", lambda t: _pairs(t).norm(dim=1), div=2, min_n=4)
_add(R, "scale_by_sum", lambda t: t * t.sum())
_add(R, "var_bcast", lambda t: _rows(t) + _rows(t).var(1, keepdim=True), div=2, min_n=4)
_add(R, "std_pairs", lambda t: _pairs(t).std(1), div=2, min_n=4)
_add(R, "max_values", lambda t: _pairs(t).max(1).values, div=2, min_n=4)
_add(R, "median_rows", lambda t: _rows(t).median(1).values * t[:2], div=2, min_n=6)
_add(R, "sum_keepdim_bcast", lambda t: _pairs(t) / (1 + _pairs(t).sum(0, keepdim=True) ** 2), div=2)

# cumulative
U = "cumulative"
_add(U, "cumsum", lambda t: torch.cumsum(t, 0))
_add(U, "cumprod", lambda t: torch.cumprod(t, 0))
_add(U, "cummax", lambda t: torch.cummax(t, 0).values)
_add(U, "cummin", lambda t: torch.cummin(t, 0).values)
_add(U, "logcumsumexp", lambda t: torch.logcumsumexp(t, 0))
_add(U, "cumsum_rows", lambda t: _rows(t).cumsum(1), div=2)
_add(U, "cumprod_flip", lambda t: torch.cumprod(t.flip(0), 0))

# indexing with constant indices
I = "indexing"
_add(I, "gather", lambda t: torch.gather(t, 0, dup_index(t.numel(), t.numel())))
_add(I, "index_select", lambda t: torch.index_select(t, 0, dup_index(t.numel() - 1, t.numel())))
_add(I, "getitem_list", lambda t: t[[t.numel() - 1, 0, 1, 1, -2]])
_add(I, "stride2", lambda t: t[::2], min_n=4)
_add(I, "flip", lambda t: t.flip(0))
_add(I, "roll", lambda t: torch.roll(t, 3))
_add(I, "narrow", lambda t: t.narrow(0, 1, t.numel() - 2), min_n=4)
_add(I, "cat_slices", lambda t: torch.cat([t[t.numel() // 2:], t[:t.numel() // 2]]))
_add(I, "repeat", lambda t: t.repeat(2))
_add(I, "expand", lambda t: t[:3].unsqueeze(0).expand(2, 3), min_n=3)
_add(I, "take", lambda t: torch.take(t, perm(t.numel())))
_add(I, "mask_select", lambda t: t[mask(t.numel())], min_n=4)
_add(I, "unfold_prod", lambda t: t.unfold(0, 2, 1).prod(-1), min_n=3)
_add(I, "transpose", lambda t: _rows(t).t(), div=2)
_add(I, "tril", lambda t: torch.tril(_sq(t)) + 0.5 * _sq(t).triu(1), accepts=_square)
_add(I, "pad_const", lambda t: F.pad(t, (1, 2), value=0.25))
_add(I, "pad_reflect", lambda t: F.pad(t.reshape(1, 1, -1), (1, 1), mode="reflect"), min_n=3)
_add(I, "pad_circular", lambda t: F.pad(t.reshape(1, 1, -1), (2, 1), mode="circular"), min_n=3)
_add(I, "stack_ends", lambda t: torch.stack([t[0], t[-1], t[1] * t[-2]]), min_n=3)
_add(I, "diag_embed", lambda t: torch.diag(t[:4]), min_n=4)

# scatter, index_add, index_put, masked_fill with constant indices and masks
S = "scatter"
_add(S, "scatter", lambda t: torch.zeros(t.numel() + 1, dtype=t.dtype).scatter(0, perm(t.numel()), t))
_add(S, "scatter_add", lambda t: torch.zeros(t.numel() // 2 + 1, dtype=t.dtype)
     .scatter_add(0, dup_index(t.numel(), t.numel() // 2 + 1), t))
_add(S, "index_add", lambda t: (0.5 * t[:3]).index_add(0, dup_index(t.numel(), 3), t), min_n=3)
for _red in ("sum", "amax", "amin", "prod", "mean"):
    for _self in (True, False):
        _add(S, f"scatter_reduce_{_red}{'' if _self else '_noself'}",
             lambda t, r=_red, s=_self: (0.5 + torch.sigmoid(t[:3])).scatter_reduce(
                 0, dup_index(t.numel(), 3), t, reduce=r, include_self=s), min_n=3)
_add(S, "index_put_acc", lambda t: torch.ones(4, dtype=t.dtype).index_put(
    (dup_index(t.numel(), 4),), t, accumulate=True))
_add(S, "index_put", lambda t: torch.zeros(t.numel() + 2, dtype=t.dtype).index_put((perm(t.numel()) + 1,), t * 2))
_add(S, "masked_fill", lambda t: t.masked_fill(mask(t.numel()), 0.5))
_add(S, "masked_scatter", lambda t: torch.zeros(t.numel(), dtype=t.dtype).masked_scatter(mask(t.numel()), t.flip(0)))
_add(S, "index_copy", lambda t: torch.zeros(t.numel(), dtype=t.dtype).index_copy(0, perm(t.numel()), t.sin()))


# in place on clones and buffers created inside the function
def _inplace_shift_add(t):
    y = t.clone()
    y[1:] += t[:-1]
    return y


def _inplace_self_shift_add(t):
    y = t.clone()
    y[1:] += y[:-1].clone()
    return y


def _inplace_mul(t):
    y = t.clone()
    y.mul_(torch.roll(t, 1))
    return y


def _inplace_clamp(t):
    y = t * 1.5
    y.clamp_(-0.6, 0.8)
    return y


def _inplace_relu(t):
    y = t - 0.1
    torch.relu_(y)
    return y + 0.1 * t


def _inplace_sin_exp(t):
    y = t.clone()
    y.sin_().mul_(0.5).exp_()
    return y


def _inplace_setitem(t):
    y = t.clone()
    y[::2] = t[1::2] ** 2
    return y


def _buffer_laplacian(t):
    r = torch.zeros_like(t)
    r[1:-1] = t[2:] - 2 * t[1:-1] + t[:-2] + t[1:-1] ** 3
    r[0] = t[0]
    r[-1] = t[-1] - 1
    return r


def _inplace_masked_fill(t):
    y = t ** 2
    y.masked_fill_(mask(t.numel()), 0.0)
    return y


def _inplace_copy(t):
    y = torch.empty_like(t)
    y.copy_(t.flip(0))
    return y * t


def _inplace_index_add(t):
    y = torch.zeros(3, dtype=t.dtype)
    y.index_add_(0, dup_index(t.numel(), 3), t.tanh())
    return y


def _inplace_addcmul(t):
    y = t.clone()
    y.addcmul_(torch.roll(t, 2), t, value=-0.5)
    return y


P = "inplace"
_add(P, "inplace_shift_add", _inplace_shift_add)
_add(P, "inplace_self_shift_add", _inplace_self_shift_add)
_add(P, "inplace_mul", _inplace_mul)
_add(P, "inplace_clamp", _inplace_clamp)
_add(P, "inplace_relu", _inplace_relu)
_add(P, "inplace_sin_exp", _inplace_sin_exp)
_add(P, "inplace_setitem", _inplace_setitem, min_n=2)
_add(P, "buffer_laplacian", _buffer_laplacian, min_n=3)
_add(P, "inplace_masked_fill", _inplace_masked_fill)
_add(P, "inplace_copy", _inplace_copy)
_add(P, "inplace_index_add", _inplace_index_add)
_add(P, "inplace_addcmul", _inplace_addcmul)


# matmul: constant matrices, sparse constants and bilinear forms of the input's halves
@lru_cache(maxsize=None)
def _sparse_band(n):
    """A constant bidiagonal (n, n) matrix in torch's sparse COO layout (asd keeps its structure)."""
    i = torch.arange(n)
    rows = torch.cat([i, i[:-1]])
    cols = torch.cat([i, i[1:]])
    vals = const("band", 2 * n - 1)
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (n, n), check_invariants=True).coalesce()


M = "matmul"
_add(M, "matvec_const", lambda t: const("A", t.numel(), t.numel()) @ t)
_add(M, "rows_matmul_const", lambda t: _rows(t) @ const("B", t.numel() // 2, 3), div=2)
_add(M, "gram_rows", lambda t: _rows(t) @ _rows(t).T, div=2, min_n=4)
_add(M, "gram_cols", lambda t: _rows(t).T @ _rows(t), div=2)
_add(M, "bilinear_halves", lambda t: torch.einsum("i,ij,j->", *_half(t)[:1], const("W", t.numel() // 2, t.numel() // 2),
                                                  _half(t)[1]) * t, div=2)
_add(M, "kron", lambda t: torch.kron(t[:2], t[2:4]), min_n=4)
_add(M, "sparse_matvec", lambda t: torch.sparse.mm(_sparse_band(t.numel()), t.unsqueeze(1)))
_add(M, "sparse_matvec_inline", lambda t: torch.sparse.mm(_sparse_band.__wrapped__(t.numel()), t.unsqueeze(1)))
_add(M, "linear", lambda t: F.linear(_rows(t), const("L", 3, t.numel() // 2), const("b", 3)), div=2)
_add(M, "addmv", lambda t: torch.addmv(t, const("A", t.numel(), t.numel()), t.flip(0) ** 2, beta=0.5))
_add(M, "bmm_outer", lambda t: torch.bmm(_pairs(t).unsqueeze(2), _pairs(t).unsqueeze(1)), div=2)
_add(M, "matrix_power", lambda t: torch.linalg.matrix_power(0.5 * _sq(t), 3), accepts=_square)

# convolution and pooling
V = "conv"
_add(V, "conv_pad1", lambda t: F.conv1d(t.reshape(1, 1, -1), const("k3", 1, 1, 3), padding=1))
_add(V, "conv_valid", lambda t: F.conv1d(t.reshape(1, 1, -1), const("k3", 1, 1, 3)), min_n=4)
_add(V, "conv_stride2", lambda t: F.conv1d(t.reshape(1, 1, -1), const("k3", 1, 1, 3), stride=2, padding=1))
_add(V, "conv_self", lambda t: F.conv1d(t.reshape(1, 1, -1), t[:3].reshape(1, 1, 3), padding=1), min_n=3)
_add(V, "conv_self_full", lambda t: F.conv1d(t.reshape(1, 1, -1), t[-2:].reshape(1, 1, 2), padding=1))
_add(V, "conv_2ch", lambda t: F.conv1d(t.reshape(1, 2, -1), const("k2c", 2, 2, 3), padding="same"), div=2)
_add(V, "conv_transpose", lambda t: F.conv_transpose1d(t.reshape(1, 1, -1), const("k3", 1, 1, 3)))
_add(V, "conv2d", lambda t: F.conv2d(t.reshape(1, 1, 2, -1), const("k22", 1, 1, 2, 2), padding=1), div=2)
_add(V, "avg_pool", lambda t: F.avg_pool1d(t.reshape(1, 1, -1), 2), div=2, min_n=4)
_add(V, "max_pool", lambda t: F.max_pool1d(t.reshape(1, 1, -1), 2), div=2, min_n=4)
_add(V, "max_pool_overlap", lambda t: F.max_pool1d(t.reshape(1, 1, -1), 3, stride=1, padding=1), min_n=3)

# norms
N = "norm"
_add(N, "l1_normalize", lambda t: t / (1 + torch.linalg.vector_norm(t, 1)))
_add(N, "l2_rows", lambda t: torch.linalg.vector_norm(_rows(t), 2, dim=1) * t[:2], div=2)
_add(N, "linf_scale", lambda t: t * torch.linalg.vector_norm(t, float("inf")))
_add(N, "layer_norm", lambda t: F.layer_norm(_rows(t), (t.numel() // 2,)), div=2, min_n=4)
_add(N, "layer_norm_affine", lambda t: F.layer_norm(_rows(t), (t.numel() // 2,), const("g", t.numel() // 2),
                                                    const("h", t.numel() // 2)), div=2, min_n=4)
_add(N, "group_norm", lambda t: F.group_norm(t.reshape(1, 4, -1), 2), div=4, min_n=8)
_add(N, "normalize_rows", lambda t: F.normalize(_rows(t), dim=1), div=2)
_add(N, "batch_norm", lambda t: F.batch_norm(_pairs(t), None, None, training=True), div=2, min_n=4)
_add(N, "rms_norm", lambda t: F.rms_norm(_rows(t), (t.numel() // 2,)), div=2)
_add(N, "instance_norm", lambda t: F.instance_norm(t.reshape(1, 2, -1)), div=2, min_n=4)

# softmax
X = "softmax"
_add(X, "softmax_rows", lambda t: torch.softmax(_rows(t), 1), div=2)
_add(X, "log_softmax_pairs", lambda t: torch.log_softmax(_pairs(t), 1), div=2)
_add(X, "softmax_all", lambda t: torch.softmax(t, 0))
_add(X, "softmin_cols", lambda t: F.softmin(_rows(t), 0), div=2)

# sort, topk, kthvalue
O = "sort"
_add(O, "sort", lambda t: torch.sort(t).values)
_add(O, "sort_rows_desc", lambda t: torch.sort(_rows(t), 1, descending=True).values, div=2)
_add(O, "topk", lambda t: torch.topk(t, t.numel() // 2).values, min_n=4)
_add(O, "kthvalue_rows", lambda t: torch.kthvalue(_rows(t), 2, 1).values * t[:2], div=2, min_n=4)
_add(O, "msort", lambda t: torch.msort(_pairs(t)), div=2)
_add(O, "argsort_gather", lambda t: t[t.argsort()] * t)

# distances
D = "cdist"
_add(D, "cdist", lambda t: torch.cdist(*(h.reshape(-1, 2) for h in _half(t))), div=4)
_add(D, "cdist_p1", lambda t: torch.cdist(*(h.reshape(-1, 2) for h in _half(t)), p=1), div=4)
_add(D, "pdist", lambda t: F.pdist(_pairs(t)), div=2, min_n=6)
_add(D, "cosine_similarity", lambda t: F.cosine_similarity(*(h.reshape(-1, 2) for h in _half(t))), div=4)

# linear algebra on 2x2 blocks
L = "linalg"
_add(L, "det", lambda t: torch.linalg.det(_blocks(t)) * t[:2], div=4)
_add(L, "inv", lambda t: torch.linalg.inv(_eye_blocks(t) + 0.1 * _blocks(t)), div=4)
_add(L, "solve", lambda t: torch.linalg.solve(_eye_blocks(t) + 0.1 * _blocks(t), _blocks(t)[:, :, :1].flip(0)), div=4)
_add(L, "cholesky", lambda t: torch.linalg.cholesky(_blocks(t) @ _blocks(t).mT + _eye_blocks(t)), div=4)
_add(L, "slogdet", lambda t: torch.linalg.slogdet(_eye_blocks(t) + _blocks(t)).logabsdet + t[:2], div=4)
_add(L, "eigvalsh", lambda t: torch.linalg.eigvalsh(_blocks(t) + _blocks(t).mT), div=4)
_add(L, "matrix_exp", lambda t: torch.linalg.matrix_exp(0.3 * _blocks(t)), div=4)
_add(L, "solve_triangular", lambda t: torch.linalg.solve_triangular(
    _eye_blocks(t) + 0.2 * _blocks(t).tril(), _blocks(t).mT, upper=False), div=4)
_add(L, "svdvals", lambda t: torch.linalg.svdvals(_blocks(t)), div=4)
_add(L, "trace_blocks", lambda t: torch.diagonal(_blocks(t), dim1=1, dim2=2).sum(1) * t[:2], div=4)

# everything else
Z = "misc"
_add(Z, "stack_powers", lambda t: torch.stack([t, t**2]))
_add(Z, "cross", lambda t: torch.linalg.cross(t.reshape(-1, 3), t.flip(0).reshape(-1, 3)), div=3)
_add(Z, "cumulative_trapezoid", lambda t: torch.cumulative_trapezoid(t ** 2))
_add(Z, "where_const_mask", lambda t: torch.where(mask(t.numel()), t, torch.roll(t, 1) ** 2))
_add(Z, "nan_to_num", lambda t: torch.nan_to_num(torch.log(t.abs() + 1e-3)))
_add(Z, "einsum_outer_trace", lambda t: torch.einsum("ij,kj->ik", _rows(t), _rows(t).flip(1)), div=2)


# PyTorch's own forward-mode derivative is wrong for these ops (finite differences agree with reverse
# mode), so forward-mode dense references cannot tell ties from this error: only reverse-mode ones are
# used. asd evaluates them without forward mode (asd.detection.ad_gaps).
TORCH_WRONG_FORWARD_AD = frozenset({"scatter_reduce_prod", "scatter_reduce_prod_noself"})


@lru_cache(maxsize=None)
def out_size(name: str, n: int) -> int | None:
    """The output size of op ``name`` on ``n`` elements, or None if it does not take ``n``."""
    op = POOL[name]
    if not op.accepts(n):
        return None
    try:
        with torch.no_grad():
            return int(op.fn(const("size probe", n)).numel())
    except Exception:  # an op that cannot take n (the size rule is checked by running it)
        return None


def _valid_chain(ops: tuple[str, ...], n: int) -> bool:
    size = n
    for i, nm in enumerate(ops):
        size = out_size(nm, size)
        if size is None or not (1 if i == len(ops) - 1 else 2) <= size <= MAX_SIZE:
            return False
    return True


def compose(names: tuple[str, ...], n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The composition of the ops ``names`` on inputs of ``n`` elements."""
    # checking the chain also builds the cached constants here, outside asd's tracing (a constant
    # first built inside a traced call would be a traced tensor)
    if not _valid_chain(names, n):
        raise ValueError(f"the ops {names} do not chain from {n} elements")
    fns = [POOL[nm].fn for nm in names]

    def f(x):
        for fn in fns:
            x = fn(x)
        return x
    f.__qualname__ = " -> ".join(names)
    return f


# -- examples and their outcome ----------------------------------------------------------------

@dataclass(frozen=True)
class Jacobian:
    mode: str  # "forward" | "reverse" | "auto" | "bidirectional"
    order: str
    batch_size: int | None
    local: bool
    check: bool | None

    def prepare(self, f, x):
        coloring = {"bidirectional": "bidirectional"}.get(self.mode)
        mode = "auto" if coloring else self.mode
        return asd.prepare_jacobian(f, x, mode=mode, coloring=coloring, order=self.order,
                                    batch_size=self.batch_size, local=self.local, check=self.check)


@dataclass(frozen=True)
class Hessian:
    of: str  # "sum": f(x).sum(); "sumsq": (f(x)**2).sum()
    coloring: str | None
    hvp: str
    order: str
    batch_size: int | None
    local: bool
    check: bool | None

    def scalar(self, f):
        if self.of == "sum":
            return lambda x: f(x).sum()
        return lambda x: (f(x) ** 2).sum()

    def prepare(self, f, x):
        return asd.prepare_hessian(self.scalar(f), x, coloring=self.coloring, hvp=self.hvp, order=self.order,
                                   batch_size=self.batch_size, local=self.local, check=self.check)


@dataclass(frozen=True)
class Example:
    ops: tuple[str, ...]
    n: int
    derivative: Jacobian | Hessian
    seed: int

    def points(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        return tuple(torch.randn(self.n, generator=g, dtype=torch.float64) for _ in range(2))


@dataclass
class Outcome:
    status: str  # see FAILED and REJECTED
    detail: str = ""
    warnings: list[str] = field(default_factory=list)


FAILED = ("mismatch", "unsound", "crash")
REJECTED = ("refused", "reference_failed", "nonsmooth", "torch_limitation", "known_failure")


def _basis(n):
    return torch.eye(n, dtype=torch.float64)


def dense_jacobian(f, x, mode: str) -> torch.Tensor:
    """Dense (m, n) Jacobian by plain autograd: one VJP per row (reverse) or JVP per column (forward)."""
    if mode == "reverse":
        J = torch.autograd.functional.jacobian(f, x)
        return J.reshape(-1, x.numel())
    cols = [torch.func.jvp(f, (x,), (e,))[1].reshape(-1) for e in _basis(x.numel())]
    return torch.stack(cols, 1)


def dense_hessian(g, x, flavour: str) -> torch.Tensor:
    """Dense Hessian of the scalar ``g``: reverse-over-reverse, forward-over-reverse or reverse-over-forward."""
    if flavour == "reverse_over_reverse":
        return torch.autograd.functional.hessian(g, x)
    if flavour == "forward_over_reverse":
        return torch.stack([torch.func.jvp(torch.func.grad(g), (x,), (e,))[1] for e in _basis(x.numel())])
    return torch.stack([torch.func.grad(lambda z: torch.func.jvp(g, (z,), (e,))[1])(x) for e in _basis(x.numel())])


def _scale(R):
    return max(1.0, float(R.abs().max())) if R.numel() else 1.0


def _close(A, R, hessian: bool = False) -> bool:
    return A.shape == R.shape and bool(((A - R).abs() <= _allowance(R, hessian)).all())


def _allowance(R, hessian: bool = False) -> float:
    """``RTOL`` of the reference's scale; for a Hessian at least the reference's own asymmetry: an
    ill-conditioned function's computed Hessian is symmetric only to that level (2e-5 relative seen
    at values of 6e7), and symmetric decompression reads one triangle."""
    tol = RTOL * _scale(R)
    if hessian and torch.isfinite(R).all():
        tol = max(tol, 2 * float((R - R.T).abs().max()))
    return tol


def _finite(A):
    """``A`` with NaN and infinities replaced by one sentinel, so equal non-finite entries compare equal."""
    return torch.where(torch.isfinite(A), A, torch.full_like(A, 1e300))


def _describe(A, R, hessian: bool = False) -> str:
    if A.shape != R.shape:
        return f"shape {tuple(A.shape)} != reference {tuple(R.shape)}"
    err = torch.nan_to_num((A - R).abs(), nan=float("inf"))
    i = int(err.argmax())
    r, c = divmod(i, R.shape[1])
    wrong = [tuple(p) for p in (err > _allowance(R, hessian)).nonzero().tolist()][:8]
    return (f"max error {float(err.max()):.3g} at ({r}, {c}): asd {float(A[r, c]):.6g}, reference "
            f"{float(R[r, c]):.6g}; wrong entries {wrong}")


def _unsound(P, R) -> str | None:
    """The nonzeros of the dense ``R`` outside the boolean pattern ``P``, described, or None."""
    if P.shape != R.shape:
        return f"pattern shape {tuple(P.shape)} != derivative shape {tuple(R.shape)}"
    missing = (R.abs() > NONZERO * _scale(R)) & ~P
    if not missing.any():
        return None
    where = missing.nonzero().tolist()[:8]
    return f"{int(missing.sum())} nonzeros outside the pattern, e.g. {[(r, c, float(R[r, c])) for r, c in where]}"


def references(ex: Example, f, x) -> tuple[dict[str, torch.Tensor], str | None]:
    """Dense derivatives of ``ex`` at ``x`` by flavour, and a reason to reject the point (or None).

    A point where forward- and reverse-mode dense autograd disagree on ``f``'s Jacobian is a tie or
    a kink: the derivative is not defined there. The other flavours are kept to name the mode a
    wrong value comes from (PyTorch's own forward-mode or reverse-over-forward formulas, see
    :data:`KNOWN_FAILURES`).
    """
    d = ex.derivative
    refs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for flavour in ("reverse", "forward"):
            try:
                refs["jac_" + flavour] = dense_jacobian(f, x, flavour).detach()
            except Exception:
                pass
        if isinstance(d, Hessian):
            g = d.scalar(f)
            for flavour in FLAVOURS:
                try:
                    refs[flavour] = dense_hessian(g, x, flavour).detach()
                except Exception:
                    pass
    if any(nm in TORCH_WRONG_FORWARD_AD for nm in ex.ops):
        refs = {k: v for k, v in refs.items() if k in ("jac_reverse", "reverse_over_reverse")}
    if isinstance(d, Hessian):
        H = _adjudicated_hessian(d.scalar(f), x, refs)
        if H is None:
            return refs, "nonsmooth"
        if H is not False:
            refs["hessian"] = H
    main = canonical(ex)
    if main not in refs or not bool(torch.isfinite(refs[main]).all()):
        return refs, "reference_failed"
    forward = refs.get("jac_forward")
    if forward is not None and bool(torch.isfinite(forward).all()) and not _close(forward, refs["jac_reverse"]):
        return refs, "nonsmooth"
    return refs, None


def canonical(ex: Example) -> str:
    """The reference asd is held to: plain reverse-mode autograd, or the adjudicated Hessian."""
    return "jac_reverse" if isinstance(ex.derivative, Jacobian) else "hessian"


FLAVOURS = ("reverse_over_reverse", "forward_over_reverse", "reverse_over_forward")


def _adjudicated_hessian(g, x, refs):
    """Reverse-over-reverse, unless a finite flavour disagrees: then the first flavour that central
    differences of the gradient confirm (PyTorch's double backward is itself wrong for a few op
    chains). None when finite differences confirm none of them (a kink), False when no finite
    flavour exists."""
    finite = [refs[k] for k in FLAVOURS if k in refs and bool(torch.isfinite(refs[k]).all())]
    if not finite:
        return False
    if all(_close(H, finite[0]) for H in finite[1:]):
        return finite[0]
    grad = lambda z: torch.autograd.functional.jacobian(g, z)  # noqa: E731
    eps = 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fd = torch.stack([(grad(x + eps * e) - grad(x - eps * e)) / (2 * eps) for e in _basis(x.numel())])
    for H in finite:
        if bool(((H - fd).abs() <= 1e-5 * _scale(H)).all()):
            return H
    return None


def _own_mode(ex: Example, op) -> str:
    """The dense reference computed in the AD mode asd evaluated in."""
    d = ex.derivative
    if isinstance(d, Hessian):
        return d.hvp
    return "jac_forward" if op.mode == "forward" else "jac_reverse"


def _wrong(ex: Example, op, A, refs, where: str) -> Outcome | None:
    """A mismatch outcome when ``A`` differs from the canonical reference, else None."""
    key = canonical(ex)
    hessian = isinstance(ex.derivative, Hessian)
    if _close(A, refs[key], hessian):
        return None
    own = _own_mode(ex, op)
    if own in refs and not bool(torch.isfinite(refs[own]).all()) and not bool(torch.isfinite(A).all()):
        # loud, not silent: PyTorch's formulas in this mode give NaN/inf here (cumprod's double backward
        # at a zero, std at a tie under reverse-over-forward), and asd returns exactly that
        return Outcome("torch_limitation", f"{where}: the dense {own} is not finite and neither is asd's")
    same = f"; the dense {own} gives the same wrong value (PyTorch's error, asd inherits it)" \
        if own != key and own in refs and _close(_finite(A), _finite(refs[own])) else ""
    return Outcome("mismatch", f"{where}, against the dense {key}: {_describe(A, refs[key], hessian)}{same}")


def _same_mode_reference_missing(ex: Example, refs) -> bool:
    """Whether dense autograd also fails in the AD mode asd may have used (PyTorch lacks the formula)."""
    d = ex.derivative
    if isinstance(d, Hessian):
        return d.hvp not in refs
    return d.mode in ("forward", "bidirectional", "auto") and "jac_forward" not in refs


def _false_alarm(ex: Example, f, x, refs, exc) -> str:
    """For a refusal by the cross-mode probe: whether the unchecked values were right after all."""
    if not isinstance(exc, CheckError):
        return ""
    try:
        op = replace(ex.derivative, check=False).prepare(f, x)
        right = _close(op(x).to_dense(), refs[canonical(ex)], isinstance(ex.derivative, Hessian))
    except Exception:  # noqa: BLE001
        return ""
    return " (false alarm, the values were right)" if right else " (caught a wrong value)"


def known_failure(ex: Example) -> "KnownFailure | None":
    for kf in KNOWN_FAILURES:
        if kf.applies(ex):
            return kf
    return None


def run_example(ex: Example, *, skip_known: bool = True) -> Outcome:
    """Prepare asd's operator for ``ex``, evaluate it at two points and compare with dense autograd."""
    if skip_known and (kf := known_failure(ex)) is not None:
        return Outcome("known_failure", kf.reason)
    f = compose(ex.ops, ex.n)
    x, x2 = ex.points()
    refs, reject = references(ex, f, x)
    if reject:
        return Outcome(reject)
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        try:
            op = ex.derivative.prepare(f, x)
            A = op(x).to_dense()
        except AsdError as exc:
            return Outcome("refused", f"{type(exc).__name__}{_false_alarm(ex, f, x, refs, exc)}: {exc}")
        except Exception as exc:  # noqa: BLE001  (asd crashed where dense autograd succeeded)
            status = "torch_limitation" if _same_mode_reference_missing(ex, refs) else "crash"
            return Outcome(status, f"{type(exc).__name__}: {exc}")
        caught = sorted({type(w.message).__name__ for w in log if isinstance(w.message, Warning)
                         and type(w.message).__module__.startswith("asd")})
    P = torch.as_tensor(op.pattern.toarray(), dtype=torch.bool)
    where = f"at x = {x.tolist()}"
    if (out := _wrong(ex, op, A, refs, where)) is not None:
        out.warnings = caught
        return out
    if (why := _unsound(P, refs[canonical(ex)])):
        return Outcome("unsound", f"pattern {where} misses nonzeros of the dense {canonical(ex)}: {why}", caught)
    if ex.derivative.local:
        return Outcome("ok", warnings=caught)
    # global pattern: it must hold at a second point too, and the prepared operator be reusable there
    refs2, reject2 = references(ex, f, x2)
    if reject2:
        return Outcome("ok", warnings=caught)
    where = f"at a second point x2 = {x2.tolist()}"
    if (why := _unsound(P, refs2[canonical(ex)])):
        return Outcome("unsound", f"global pattern {where}: {why}", caught)
    try:
        A2 = op(x2).to_dense()
    except AsdError as exc:
        return Outcome("refused", f"{type(exc).__name__}{_false_alarm(ex, f, x2, refs2, exc)} at x2: {exc}", caught)
    except Exception as exc:  # noqa: BLE001
        return Outcome("crash", f"at x2: {type(exc).__name__}: {exc}", caught)
    if (out := _wrong(ex, op, A2, refs2, where)) is not None:
        out.warnings = caught
        return out
    return Outcome("ok", warnings=caught)


# -- known failures: asd bugs found by this test, each an xfail until fixed ---------------------

@dataclass(frozen=True)
class KnownFailure:
    """An op (under some options) for which asd is wrong today; ``example`` reproduces it."""

    op: str
    reason: str
    example: Example
    when: Callable[[Example], bool] = lambda ex: True

    def applies(self, ex: Example) -> bool:
        return self.op in ex.ops and self.when(ex)


# PyTorch's own wrong formulas, found by this test: asd now evaluates around them
# (asd.detection.ad_gaps); each example returned a wrong derivative without a word before.
AD_GAP_EXAMPLES: tuple[tuple[str, Example], ...] = (
    ("scatter_reduce_prod", Example(("scatter_reduce_prod",), 8, Jacobian("forward", "natural", None, False, None),
                                    1167)),
    ("scatter_reduce_prod_noself", Example(("scatter_reduce_prod_noself",), 6,
                                           Jacobian("forward", "natural", None, False, None), 47)),
    ("scatter_reduce_prod_hessian", Example(("scatter_reduce_prod",), 8,
                                            Hessian("sum", None, "forward_over_reverse", "natural", None, False, None),
                                            3)),
    *((name, Example((name,), 8, Hessian("sumsq", None, "reverse_over_forward", "natural", None, False, None), 0))
      for name in ("layer_norm", "layer_norm_affine", "batch_norm", "instance_norm", "det", "slogdet", "solve")),
    ("cdist", Example(("cdist",), 12, Jacobian("reverse", "natural", None, False, False), 0)),
    ("cdist_p1", Example(("cdist_p1",), 12, Jacobian("reverse", "natural", None, False, False), 0)),
)

KNOWN_FAILURES: tuple[KnownFailure, ...] = ()


# -- strategies and tests ----------------------------------------------------------------------

def applicable(n: int, final: bool) -> list[str]:
    lo = 1 if final else 2
    return [nm for nm in POOL if (m := out_size(nm, n)) is not None and lo <= m <= MAX_SIZE]


@st.composite
def examples(draw) -> Example:
    n = draw(st.sampled_from(SIZES))
    k = draw(st.integers(2, 6))
    names, size = [], n
    for i in range(k + 1):  # k ops from the pool plus a final op
        name = draw(st.sampled_from(applicable(size, final=i == k)))
        names.append(name)
        size = out_size(name, size)
    order = draw(st.sampled_from(ORDERS))
    batch_size = draw(st.sampled_from([None, 1, 2]))
    local = draw(st.booleans())
    check = draw(st.sampled_from([None, True]))
    if draw(st.booleans()):
        d = Jacobian(draw(st.sampled_from(["forward", "reverse", "auto", "bidirectional"])), order, batch_size,
                     local, check)
    else:
        d = Hessian(draw(st.sampled_from(["sum", "sumsq"])), draw(st.sampled_from(["star", "acyclic", None])),
                    draw(st.sampled_from(["forward_over_reverse", "reverse_over_forward"])), order, batch_size,
                    local, check)
    return Example(tuple(names), n, d, draw(st.integers(0, 2**31 - 1)))


def _check_example(ex: Example) -> None:
    out = run_example(ex)
    event(f"outcome: {out.status}")
    for w in out.warnings:
        event(f"warning: {w}")
    if out.status in REJECTED:
        if out.status == "refused":
            event(f"refused: {out.detail.split(':')[0]}")
        assume(False)
    assert out.status not in FAILED, f"{out.status}: {ex}\n{out.detail}"


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                     HealthCheck.data_too_large])


def test_pool_size_and_families():
    assert len(POOL) >= 80
    families = {op.family for op in POOL.values()}
    assert families >= {"elementwise", "binary", "complex", "reduction", "indexing", "scatter", "cumulative",
                        "matmul", "conv", "norm", "softmax", "sort", "cdist", "linalg", "inplace"}
    for n in SIZES:  # every input size starts a composition and every op is reachable from one
        assert applicable(n, final=False)
    reachable = {nm for m in range(1, MAX_SIZE + 1) for nm in POOL if out_size(nm, m) is not None}
    assert reachable == set(POOL)


@settings(FUZZ, max_examples=200, derandomize=True)  # 5000 under -m slow
@given(examples())
def test_fuzz_default(ex):
    _check_example(ex)


@pytest.mark.slow
@settings(FUZZ, max_examples=5000)
@given(examples())
def test_fuzz_slow(ex):
    _check_example(ex)


@pytest.mark.parametrize("kf", [pytest.param(kf, id=kf.op, marks=pytest.mark.xfail(strict=True, reason=kf.reason))
                                for kf in KNOWN_FAILURES])
def test_known_failure(kf):
    """Each known failure still fails; once fixed, this xpasses (strict: red) and the entry is removed."""
    out = run_example(kf.example, skip_known=False)
    assert out.status not in FAILED, f"{out.status}: {out.detail}"


# asd defects found by this test, each fixed: the example must stay right
REGRESSIONS: tuple[tuple[str, Example], ...] = (
    # vmap(vjp) ran at the first point; at the second PyTorch's prod backward reads `.data` under vmap:
    # a settled operator must still fall back instead of raising
    ("fallback_after_the_first_call",
     Example(("mul_roll", "exp", "sqrt_abs", "cpair_real_imag", "mul_1j_abs", "floor_mul", "scatter_reduce_prod"), 4,
             Jacobian("reverse", "natural", None, False, None), 1786)),
    # a function that cancels to zero (cross(a, a)): the probe's products are a few ulps, not an error
    ("probe_of_a_cancelling_function", Example(("cross", "cross"), 6, Jacobian("reverse", "natural", None, False, True), 1)),
    ("probe_of_a_cancelling_hessian", Example(("cross", "cross"), 6, Hessian("sumsq", "acyclic", "reverse_over_forward",
                                                                           "natural", None, False, True), 212)),
    # Hessians that vanish identically (a sum of normalized values): both products are rounding of
    # terms far larger than them; one mode's may be exactly zero (found by the fuzzer, note 43)
    ("probe_of_a_vanishing_hessian", Example(("erf", "group_norm"), 8, Hessian("sum", "acyclic", "forward_over_reverse",
                                                                             "natural", None, False, True), 300044)),
    ("probe_of_a_vanishing_hessian_exact_zero", Example(("einsum_outer_trace", "instance_norm"), 12,
                                                        Hessian("sum", "acyclic", "reverse_over_forward", "natural",
                                                                None, True, None), 3096)),
    # reverse-over-forward of cumprod is NaN at a zero: asked for explicitly, it is replaced
    ("cumprod_reverse_over_forward", Example(("sparse_matvec", "relu", "cumprod_flip"), 12,
                                             Hessian("sum", None, "reverse_over_forward", "natural", None, False, False),
                                             49997)),
    # a sparse constant built inside f with torch.sparse_coo_tensor(..., check_invariants=True): PyTorch's
    # check read the traced indices' memory (they have none) and detection crashed
    ("sparse_constant_checked_inside_f", Example(("sparse_matvec_inline", "sin"), 4,
                                                 Jacobian("reverse", "natural", None, False, None), 0)),
    ("sparse_constant_checked_inside_f_local", Example(("sparse_matvec_inline", "sin"), 4,
                                                       Jacobian("reverse", "natural", None, True, None), 0)),
)


@pytest.mark.parametrize("name,ex", REGRESSIONS, ids=[name for name, _ in REGRESSIONS])
def test_regressions(name, ex):
    out = run_example(ex, skip_known=False)
    assert out.status == "ok", f"{out.status}: {out.detail}"


@pytest.mark.parametrize("name,ex", AD_GAP_EXAMPLES, ids=[name for name, _ in AD_GAP_EXAMPLES])
def test_pytorch_ad_gaps_are_avoided(name, ex):
    """An explicit mode that meets a wrong PyTorch formula is replaced (with an ADGapWarning)."""
    out = run_example(ex, skip_known=False)
    assert out.status == "ok", f"{out.status}: {out.detail}"


# compile=True: slow, so a few fixed compositions outside the hypothesis loop, one derivative kind each
COMPILED = [
    (("sin", "mul_roll", "cumsum"), 8, "hessian"),
    (("conv_pad1", "softmax_rows", "square"), 8, "forward"),
    (("layer_norm", "gather", "tanh"), 6, "reverse"),
    (("cummax", "scatter_add", "exp"), 8, "bidirectional"),
]


@pytest.mark.parametrize("ops,n,kind", COMPILED, ids=["-".join(c[0]) + "-" + c[2] for c in COMPILED])
def test_fuzz_compiled(ops, n, kind):
    f = compose(ops, n)
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.compile's and the "compression barely pays" notices
        if kind == "hessian":
            g = lambda z: (f(z) ** 2).sum()  # noqa: E731
            op = asd.prepare_hessian(g, x, compile=True)
            R = dense_hessian(g, x, "reverse_over_reverse")
        else:
            coloring = "bidirectional" if kind == "bidirectional" else None
            op = asd.prepare_jacobian(f, x, mode="auto" if coloring else kind, coloring=coloring, compile=True)
            R = dense_jacobian(f, x, "reverse")
        A = op(x).to_dense()
    assert _close(A, R), _describe(A, R)


# -- script: tally the outcomes of many random examples -----------------------------------------

def label(out: Outcome) -> str:
    """The outcome's status, with the kind of refusal for refusals."""
    return f"{out.status}: {out.detail.split(': ')[0]}" if out.status == "refused" else out.status


def minimize(ex: Example, out: Outcome) -> tuple[Example, Outcome]:
    """Drop ops and simplify options of an example while its outcome keeps its :func:`label`."""
    target = label(out)
    changed = True
    while changed:
        changed = False
        candidates = [replace(ex, ops=ex.ops[:i] + ex.ops[i + 1:]) for i in range(len(ex.ops))]
        candidates = [c for c in candidates if c.ops and _valid_chain(c.ops, c.n)]
        d = ex.derivative
        for opt, plain in (("local", False), ("check", None), ("batch_size", None), ("order", "natural")):
            if getattr(d, opt) != plain and not (opt == "check" and d.check is False):
                candidates.append(replace(ex, derivative=replace(d, **{opt: plain})))
        for c in candidates:
            o = run_example(c, skip_known=False)
            if label(o) == target:
                ex, out, changed = c, o, True
                break
    return ex, out


def main(argv=None) -> None:
    import argparse
    import time

    from hypothesis import Phase, Verbosity, seed

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--all", action="store_true", help="also run the known failures")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tally: Counter = Counter()
    failures: list[tuple[Example, Outcome]] = []
    t0 = time.perf_counter()

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate],
              verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck))
    @given(examples())
    def sweep(ex):
        out = run_example(ex, skip_known=not args.all)
        tally[out.status] += 1
        if out.status in ("refused", "torch_limitation", "crash"):
            tally[f"{out.status}: {out.detail.split(': ')[0] if out.status == 'refused' else out.detail[:70]}"] += 1
        for w in out.warnings:
            tally["warning: " + w] += 1
        if out.status in FAILED or "false alarm" in out.detail:
            failures.append((ex, out))
        elif "caught a wrong value" in out.detail:  # what the probe caught: the unchecked result
            unchecked = replace(ex, derivative=replace(ex.derivative, check=False))
            failures.append((unchecked, run_example(unchecked, skip_known=not args.all)))

    sweep()
    print(f"\n{sum(tally[s] for s in FAILED + REJECTED + ('ok',))} examples in {time.perf_counter() - t0:.0f} s")
    for k, v in sorted(tally.items()):
        print(f"  {k}: {v}")
    print("\nminimized failures:")
    seen = set()
    for ex, out in failures:
        small, sout = minimize(ex, out)
        key = (label(sout), small.ops, type(small.derivative).__name__)
        if key not in seen:
            seen.add(key)
            print(f"{label(sout)}: {small}\n  {sout.detail}", flush=True)


if __name__ == "__main__":
    main()
