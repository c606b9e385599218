"""``solve(A, b, method=...)``: sparse direct and Krylov solves with implicit-function backward.

Backward (implicit function theorem, seed 004 Table 1): with ``x = A^{-1} b`` and incoming
gradient ``g``, one adjoint solve ``w = A^{-T} g`` (same method; the direct method reuses the
factorization cached on the forward pass) gives ``gb = w`` and ``gA = -(w x^T) ⊙ mask(A)``.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Union

import numpy as np
import torch

from asd.errors import ConvergenceWarning, InputError
from asd.linalg import _kernels as K
from asd.linalg import krylov
from asd.linalg._sparse import Pattern, check_dense, check_dtypes, from_columns, to_columns, values_of
from asd.linalg.krylov import KRYLOV_METHODS, SolveInfo
from asd.linalg.products import _SDDMM

__all__ = ["solve", "cg", "bicgstab", "minres", "gmres", "lsmr", "SolveInfo"]

DIRECT_METHODS = ("direct", "lu", "cholesky")
Precond = Union[None, Callable[[torch.Tensor], torch.Tensor], torch.Tensor]


# ---- direct ---------------------------------------------------------------------------------
class _Factor:
    """A scipy SuperLU factorization of the (block-diagonal) matrix, kept for the adjoint solve."""

    def __init__(self, P: Pattern, vals: torch.Tensor, spd: bool):
        import scipy.sparse.linalg as spla

        A = P.scipy(vals).tocsc()
        if vals.dtype not in (torch.float32, torch.float64):
            raise InputError(f"direct solves need float32 or float64 values, got {vals.dtype}")
        try:
            if spd:
                # no pivoting, symmetric ordering: for an SPD matrix this is its Cholesky / LDL^T
                # factorization up to the diagonal scaling (scipy has no sparse Cholesky)
                self.lu = spla.splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                                    options=dict(SymmetricMode=True))
            else:
                self.lu = spla.splu(A)
        except RuntimeError as e:
            raise InputError(f"A is singular ({e}); a direct solve needs a nonsingular matrix, or "
                             f"use method='lsmr' for a least-squares solution") from None
        self.spd = spd

    def solve(self, Bm: torch.Tensor, trans: bool) -> torch.Tensor:
        B = Bm.detach().cpu().numpy()
        t = "T" if trans else "N"
        X = self.lu.solve(np.ascontiguousarray(B), trans=t)
        if not np.all(np.isfinite(X)):
            raise InputError("A is numerically singular: the direct solve produced non-finite values")
        return torch.from_numpy(np.ascontiguousarray(X)).to(device=Bm.device, dtype=Bm.dtype)


class _DirectSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, vals, Bm, P, factor, trans):
        X = factor.solve(Bm, trans)
        ctx.P, ctx.factor, ctx.trans = P, factor, trans
        ctx.save_for_backward(vals, X)
        return X

    @staticmethod
    def backward(ctx, G):
        vals, X = ctx.saved_tensors
        P, factor, trans = ctx.P, ctx.factor, ctx.trans
        graph = torch.is_grad_enabled()
        W = _DirectSolve.apply(vals, G, P, factor, not trans) if graph else factor.solve(G, not trans)
        gv = None
        if ctx.needs_input_grad[0]:
            U, V = (W, X) if not trans else (X, W)
            gv = -(_SDDMM.apply(U, V, P) if graph else K.sddmm(P, U, V))
        return gv, (W if ctx.needs_input_grad[1] else None), None, None, None


# ---- iterative ------------------------------------------------------------------------------
class _Config:
    def __init__(self, method, rtol, atol, maxiter, M, restart, x0, warn):
        self.method, self.rtol, self.atol, self.maxiter = method, rtol, atol, maxiter
        self.M, self.restart, self.x0, self.warn = M, restart, x0, warn
        self.info: Optional[SolveInfo] = None


def _precond(M: Precond, trans: bool, like: torch.Tensor):
    if M is None:
        return None
    if callable(M) and not isinstance(M, torch.Tensor):
        return M
    PM, vm = values_of(M.detach(), "M")
    vm = vm.detach()
    if PM.n_rows != like.numel() or PM.n_cols != like.numel():
        raise InputError(f"preconditioner of shape {tuple(M.shape)} does not match the system")
    return lambda r: K.spmm(PM, vm, r.reshape(-1, 1), trans).reshape(-1)


def _run_krylov(P: Pattern, vals: torch.Tensor, Bm: torch.Tensor, cfg: _Config, trans: bool,
                X0: Optional[torch.Tensor]) -> tuple[torch.Tensor, SolveInfo]:
    v = vals.detach()
    A = lambda x: K.spmm(P, v, x.reshape(-1, 1), trans).reshape(-1)      # noqa: E731
    AT = lambda x: K.spmm(P, v, x.reshape(-1, 1), not trans).reshape(-1)  # noqa: E731
    M = _precond(cfg.M, trans, Bm[:, 0])
    N = Bm.shape[0]
    maxiter = cfg.maxiter if cfg.maxiter is not None else 10 * N
    cols, stats = [], []
    with torch.no_grad():
        for c in range(Bm.shape[1]):
            b = Bm[:, c].detach()
            bn = float(torch.linalg.vector_norm(b))
            tol = max(cfg.rtol * bn, cfg.atol)
            x = X0[:, c].detach().clone() if X0 is not None else torch.zeros_like(b)
            m = cfg.method
            if m == "cg":
                x, it, rn = krylov.cg(A, b, x, tol, maxiter, M)
            elif m == "bicgstab":
                x, it, rn = krylov.bicgstab(A, b, x, tol, maxiter, M)
            elif m == "minres":
                x, it, rn = krylov.minres(A, b, x, tol, maxiter, M)
            elif m == "gmres":
                x, it, rn = krylov.gmres(A, b, x, tol, maxiter, M, restart=cfg.restart)
            else:
                x, it, rn = krylov.lsmr(A, AT, b, x, tol, maxiter, cfg.rtol)
            ok = (rn <= tol) or (m == "lsmr" and it < maxiter)
            cols.append(x)
            stats.append((ok, it, rn, tol))
    X = torch.stack(cols, 1)
    info = SolveInfo(cfg.method, all(s[0] for s in stats), max(s[1] for s in stats),
                     max(s[2] for s in stats), max(s[3] for s in stats),
                     tuple((s[0], s[1], s[2]) for s in stats))
    if not info.converged and cfg.warn:
        what = "adjoint (backward) solve" if trans else "solve"
        warnings.warn(ConvergenceWarning(
            f"{cfg.method} {what} did not converge: {info.iterations} iterations, residual norm "
            f"{info.residual_norm:.3e} > tolerance {info.tolerance:.3e}; raise maxiter, loosen "
            f"rtol/atol or pass a preconditioner M"), stacklevel=4)
    return X, info


class _IterSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, vals, Bm, P, cfg, trans):
        X, info = _run_krylov(P, vals, Bm, cfg, trans, cfg.x0 if not trans else None)
        if not trans:
            cfg.info = info
        ctx.P, ctx.cfg, ctx.trans = P, cfg, trans
        ctx.save_for_backward(vals, X)
        return X

    @staticmethod
    def backward(ctx, G):
        vals, X = ctx.saved_tensors
        P, cfg, trans = ctx.P, ctx.cfg, ctx.trans
        graph = torch.is_grad_enabled()
        W = (_IterSolve.apply(vals, G, P, cfg, not trans) if graph
             else _run_krylov(P, vals, G, cfg, not trans, None)[0])
        gv = None
        if ctx.needs_input_grad[0]:
            U, V = (W, X) if not trans else (X, W)
            gv = -(_SDDMM.apply(U, V, P) if graph else K.sddmm(P, U, V))
        return gv, (W if ctx.needs_input_grad[1] else None), None, None, None


# ---- public API -----------------------------------------------------------------------------
def solve(A: torch.Tensor, b: torch.Tensor, method: str = "direct", *, rtol: float = 1e-6,
          atol: float = 0.0, maxiter: Optional[int] = None, M: Precond = None,
          x0: Optional[torch.Tensor] = None, restart: int = 30, return_info: bool = False,
          warn: bool = True):
    """Solve ``A x = b`` for sparse ``A`` with gradients in ``A``'s pattern.

    Parameters
    ----------
    A : torch.Tensor
        Sparse COO or CSR, square, ``(n, n)`` or batched ``(B, n, n)`` (solved as one
        block-diagonal system).
    b : torch.Tensor
        Dense ``(n,)``, ``(n, k)``, ``(B, n)`` or ``(B, n, k)``.
    method : str
        ``"direct"`` (alias ``"lu"``): scipy SuperLU with partial pivoting, computed on the host;
        ``"cholesky"``: for SPD ``A``, a symmetric-mode factorization without pivoting;
        ``"cg"`` (SPD), ``"minres"`` (symmetric), ``"bicgstab"``, ``"gmres"``, ``"lsmr"``: Krylov
        iterations in torch on ``A``'s device.  The factorization (direct) or the same Krylov
        method (iterative) serves the adjoint solve of the backward pass.
    rtol, atol : float
        Krylov stopping rule ``||b - A x|| <= max(rtol ||b||, atol)``, per right-hand side.
    maxiter : int, optional
        Krylov iteration limit (default ``10 n``; for GMRES it counts inner iterations).
    M : callable or sparse tensor, optional
        Preconditioner approximating ``A^{-1}``.  A sparse matrix is applied as ``M @ r`` and
        transposed for the adjoint solve; a callable ``r -> M r`` (on flat vectors) is used as
        given for both, so it should be symmetric for non-symmetric methods' adjoints.
    x0 : torch.Tensor, optional
        Krylov starting guess shaped like ``b`` (treated as a constant).
    restart : int
        GMRES restart length.
    return_info : bool
        Also return a :class:`SolveInfo` (status, iterations, residual norm).
    warn : bool
        Emit :class:`~asd.errors.ConvergenceWarning` when a Krylov solve (forward or adjoint)
        stops short of its tolerance.  Solvers never raise on non-convergence.

    Returns
    -------
    torch.Tensor or (torch.Tensor, SolveInfo)
        ``x`` shaped like ``b``.
    """
    P, vals = values_of(A, "A")
    if P.n != P.m:
        raise InputError(f"A must be square to solve A x = b, got shape {P.shape}; for least "
                         f"squares use a square normal-equations system or lsmr on A^T A")
    check_dense(b, "b", P, P.n, what="rhs")
    check_dtypes(vals, b)
    Bm, info_shape = to_columns(b, P, P.n, "b")
    if method in DIRECT_METHODS:
        factor = _Factor(P, vals, spd=(method == "cholesky"))
        X = _DirectSolve.apply(vals, Bm, P, factor, False)
        info = SolveInfo(method, True, 0, float("nan"), 0.0)
    elif method in KRYLOV_METHODS:
        X0 = None
        if x0 is not None:
            check_dense(x0, "x0", P, P.n, what="rhs")
            if x0.shape != b.shape:
                raise InputError(f"x0 has shape {tuple(x0.shape)}, b has {tuple(b.shape)}")
            X0 = to_columns(x0, P, P.n, "x0")[0]
        if rtol < 0 or atol < 0:
            raise InputError("rtol and atol must be non-negative")
        cfg = _Config(method, rtol, atol, maxiter, M, restart, X0, warn)
        X = _IterSolve.apply(vals, Bm, P, cfg, False)
        info = cfg.info
    else:
        raise InputError(f"unknown method {method!r}; choose one of "
                         f"{DIRECT_METHODS + KRYLOV_METHODS}")
    x = from_columns(X, info_shape, P, P.n)
    return (x, info) if return_info else x


def _krylov(method: str):
    def f(A: torch.Tensor, b: torch.Tensor, *, rtol: float = 1e-6, atol: float = 0.0,
          maxiter: Optional[int] = None, M: Precond = None, x0: Optional[torch.Tensor] = None,
          **kw):
        return solve(A, b, method, rtol=rtol, atol=atol, maxiter=maxiter, M=M, x0=x0,
                     return_info=True, **kw)

    f.__name__ = method
    f.__qualname__ = method
    f.__doc__ = (f"Differentiable {method.upper()} solve of ``A x = b``; returns ``(x, info)``.\n\n"
                 f"Shorthand for ``solve(A, b, method={method!r}, return_info=True, ...)``; see "
                 f":func:`solve` for the parameters.\n")
    return f


cg = _krylov("cg")
bicgstab = _krylov("bicgstab")
minres = _krylov("minres")
gmres = _krylov("gmres")
lsmr = _krylov("lsmr")
