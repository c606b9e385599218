"""Kernel dispatch: Numba on CPU (compiled lazily on first use), plain torch elsewhere.

These functions are not differentiable themselves; the autograd Functions in ``products`` and
``triangular`` call them and express their backward passes through those same Functions.
"""

from __future__ import annotations

import numpy as np
import torch

from asd.errors import InputError
from asd.linalg._device import warn_host_fallback

_nk = None


def _numba():
    """The Numba kernel module, or ``False`` when Numba is unavailable."""
    global _nk
    if _nk is None:
        try:
            from asd.linalg import _numba_kernels as mod
            _nk = mod
        except ImportError:  # pragma: no cover - numba is a core dependency
            _nk = False
    return _nk


_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """Uninitialised CPU output allocated by numpy: first touch of a large fresh torch allocation
    is several times slower here (measured: 18 ms vs 2.5 ms for 32 MB)."""
    return torch.from_numpy(np.empty(shape, dtype=_NP_DTYPES[dtype]))


def _use_numba(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) and bool(_numba())


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two index tensors hold the same values (Numba on CPU: torch.equal is ~6x slower)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if (a.device.type == "cpu" and _numba() and a.is_contiguous() and b.is_contiguous()
            and not (_is_cow(a) or _is_cow(b))):  # (numpy() would copy a copy-on-write clone: an asd result's indices)
        return bool(_numba().equal(a.reshape(-1).numpy(), b.reshape(-1).numpy()))
    return torch.equal(a, b)


def _is_cow(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory is shared copy-on-write (``torch._lazy_clone``), which a write access copies."""
    is_cow = getattr(torch._C, "_is_cow_tensor", None)
    return bool(is_cow(t)) if is_cow is not None else False


def spmm(P, vals: torch.Tensor, X: torch.Tensor, trans: bool = False) -> torch.Tensor:
    """``A @ X`` (or ``A^T @ X``) for flat values ``vals`` of pattern ``P``; ``X`` is ``(rows, k)``."""
    vals = vals.detach()
    X = X.detach()
    out_rows = P.n_cols if trans else P.n_rows
    k = X.shape[1]
    if _use_numba(X):
        nk = _numba()
        Y = _empty((out_rows, k), X.dtype)
        v = vals.contiguous().numpy()
        if k == 1:
            x = X.reshape(-1).contiguous().numpy()
            (nk.spmv_t if trans else nk.spmv)(P.np("ucrow"), P.np("ucol"), v, x, Y.numpy().reshape(-1))
        else:
            (nk.spmm_t if trans else nk.spmm)(P.np("ucrow"), P.np("ucol"), v, X.contiguous().numpy(),
                                              Y.numpy())
        return Y
    src, dst = (P.col, P.row) if not trans else (P.row, P.col)
    Y = torch.zeros((out_rows, k), dtype=X.dtype, device=X.device)
    return Y.index_add_(0, dst, vals.unsqueeze(1) * X.index_select(0, src))


def sddmm(P, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Sampled product: ``out[p] = U[row_p, :] . V[col_p, :]`` for every stored entry ``p``."""
    U = U.detach()
    V = V.detach()
    if _use_numba(U):
        nk = _numba()
        out = _empty((P.nnz,), U.dtype)
        if U.shape[1] == 1:
            nk.sddmm_vec(P.np("ucrow"), P.np("ucol"), U.reshape(-1).contiguous().numpy(),
                         V.reshape(-1).contiguous().numpy(), out.numpy())
        else:
            nk.sddmm(P.np("ucrow"), P.np("ucol"), U.contiguous().numpy(), V.contiguous().numpy(),
                     out.numpy())
        return out
    return (U.index_select(0, P.row) * V.index_select(0, P.col)).sum(-1)


def trsv(P, vals: torch.Tensor, Bm: torch.Tensor, lower: bool, trans: bool, unit: bool) -> torch.Tensor:
    """Solve ``op(T) X = B`` for the triangular matrix of pattern ``P``; ``B`` is ``(n, k)``.

    On CPU a Numba substitution sweep; on CUDA cuSPARSE through ``torch.triangular_solve`` with
    a sparse CSR matrix (a zero or missing diagonal entry gives non-finite values there instead
    of an error, which would need a read-back); on meta a shape-only result; on any other device
    the sweep runs on the host, with :class:`~asd.errors.HostFallbackWarning`.
    """
    dev = Bm.device
    if dev.type == "meta":
        return torch.empty_like(Bm, memory_format=torch.contiguous_format)
    if dev.type == "cuda":
        return _trsv_cusparse(P, vals, Bm, lower, trans, unit)
    if dev.type != "cpu":
        warn_host_fallback("sparse triangular solve", dev, "no device kernel off CUDA")
    Bc = Bm.detach().to("cpu")
    X = _empty(tuple(Bc.shape), Bc.dtype) if Bc.dtype in _NP_DTYPES else torch.empty_like(Bc)
    X.copy_(Bc)
    v = vals.detach().to("cpu").contiguous()
    nk = _numba()
    if nk and X.dtype in (torch.float32, torch.float64):
        if X.shape[1] == 1:
            kern = nk.trsv_vec_t if trans else nk.trsv_vec
            bad = kern(P.np("crow"), P.np("col"), v.numpy(), X.numpy().reshape(-1), lower, unit)
        else:
            bad = nk.trsv(P.np("crow"), P.np("col"), v.numpy(), X.numpy(), lower, trans, unit)
    else:  # pragma: no cover - slow reference path
        bad = _trsv_py(P, v, X, lower, trans, unit)
    if bad >= 0:
        raise InputError(f"the triangular matrix is singular: zero or missing diagonal entry in row "
                         f"{bad % P.n}" + (f" of batch item {bad // P.n}" if P.batch else ""))
    return X.to(dev)


def _trsv_cusparse(P, vals, Bm, lower, trans, unit):  # pragma: no cover - needs CUDA
    """cuSPARSE SpSV/SpSM through torch: the flattened (block-diagonal) pattern as one CSR."""
    T = torch.sparse_csr_tensor(P.crow, P.col, vals.detach(), (P.n_rows, P.n_cols),
                                check_invariants=False)
    X, _ = torch.triangular_solve(Bm.detach().contiguous(), T, upper=not lower, transpose=trans,
                                  unitriangular=unit)
    return X


def _trsv_py(P, v, X, lower, trans, unit):  # pragma: no cover
    crow, col = P.np("crow"), P.np("col")
    vv, XX = v.numpy(), X.numpy()
    n = len(crow) - 1
    order = range(n) if (lower != trans) else range(n - 1, -1, -1)
    for i in order:
        d = 1.0 if unit else 0.0
        for p in range(crow[i], crow[i + 1]):
            if col[p] == i and not unit:
                d = vv[p]
        if d == 0:
            return i
        if not trans:
            for p in range(crow[i], crow[i + 1]):
                if col[p] != i:
                    XX[i] -= vv[p] * XX[col[p]]
            XX[i] /= d
        else:
            XX[i] /= d
            for p in range(crow[i], crow[i + 1]):
                if col[p] != i:
                    XX[col[p]] -= vv[p] * XX[i]
    return -1


def product_pattern(PA, PB):
    """Symbolic product of two patterns: (crow, col, ka, kb, kc) as int64 CPU tensors (computed on
    the host: the result's size depends on the index values)."""
    if PA.device.type != "cpu":
        warn_host_fallback("the symbolic phase of sparse @ sparse", PA.device,
                           "index arrays only, once per pair of patterns")
    nk = _numba()
    out = nk.product_triples(PA.np("crow"), PA.np("col"), PB.np("crow"), PB.np("col"),
                             np.int64(PB.n_cols))
    return tuple(torch.from_numpy(a) for a in out)
