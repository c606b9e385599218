"""Krylov solvers in plain torch: CG, BiCGSTAB, MINRES, restarted GMRES and LSMR.

These are the raw iterations on a linear operator (any device, any float dtype); they run without
autograd.  :func:`asd.linalg.solve` wraps them in an implicit-function-theorem backward.  Every
solver returns ``(x, info)``; stopping short of the tolerance is reported in ``info`` and by
:func:`solve` as a :class:`~asd.errors.ConvergenceWarning`, never raised.

The stopping rule is scipy's: ``||b - A x|| <= max(rtol * ||b||, atol)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

__all__ = ["SolveInfo", "KRYLOV_METHODS"]

Op = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SolveInfo:
    """Status and statistics of a solve.

    Attributes
    ----------
    method : str
    converged : bool
        Every right-hand side reached its tolerance.
    iterations : int
        The largest iteration count over right-hand sides (0 for direct solves).
    residual_norm : float
        The largest final residual norm ``||b - A x||`` over right-hand sides.
    tolerance : float
        The largest tolerance ``max(rtol ||b||, atol)`` over right-hand sides.
    per_column : tuple
        ``(converged, iterations, residual_norm)`` for each right-hand side.
    """

    method: str
    converged: bool
    iterations: int
    residual_norm: float
    tolerance: float
    per_column: tuple = field(default=(), repr=False)


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b))


def _norm(a: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a))


def cg(A: Op, b, x, tol, maxiter, M: Optional[Op]):
    r = b - A(x)
    rn = _norm(r)
    if rn <= tol:
        return x, 0, rn
    z = M(r) if M else r
    p = z.clone()
    rz = _dot(r, z)
    for it in range(1, maxiter + 1):
        Ap = A(p)
        pAp = _dot(p, Ap)
        if pAp == 0.0:
            return x, it, rn
        alpha = rz / pAp
        x = x.add(p, alpha=alpha)
        r = r.sub(Ap, alpha=alpha)
        rn = _norm(r)
        if rn <= tol:
            return x, it, rn
        z = M(r) if M else r
        rz_new = _dot(r, z)
        p = z.add(p, alpha=rz_new / rz)
        rz = rz_new
    return x, maxiter, rn


def bicgstab(A: Op, b, x, tol, maxiter, M: Optional[Op]):
    r = b - A(x)
    rn = _norm(r)
    if rn <= tol:
        return x, 0, rn
    rhat = r.clone()
    rho = alpha = omega = 1.0
    v = torch.zeros_like(b)
    p = torch.zeros_like(b)
    for it in range(1, maxiter + 1):
        rho_new = _dot(rhat, r)
        if rho_new == 0.0:                         # breakdown: restart the shadow residual
            rhat = r.clone()
            rho_new = _dot(rhat, r)
            p.zero_()
            v.zero_()
            rho = alpha = omega = 1.0
        beta = (rho_new / rho) * (alpha / omega)
        p = r + beta * (p - omega * v)
        ph = M(p) if M else p
        v = A(ph)
        rv = _dot(rhat, v)
        if rv == 0.0:
            return x, it, rn
        alpha = rho_new / rv
        s = r - alpha * v
        sn = _norm(s)
        if sn <= tol:
            return x.add(ph, alpha=alpha), it, sn
        sh = M(s) if M else s
        t = A(sh)
        tt = _dot(t, t)
        omega = _dot(t, s) / tt if tt > 0 else 0.0
        x = x + alpha * ph + omega * sh
        r = s - omega * t
        rn = _norm(r)
        rho = rho_new
        if rn <= tol or omega == 0.0:
            return x, it, rn
    return x, maxiter, rn


def minres(A: Op, b, x, tol, maxiter, M: Optional[Op]):
    """MINRES of Paige and Saunders for symmetric (possibly indefinite) ``A``, SPD ``M``."""
    r1 = b - A(x)
    rn = _norm(r1)
    if rn <= tol:
        return x, 0, rn
    y = M(r1) if M else r1
    beta1 = _dot(r1, y)
    if beta1 <= 0:
        return x, 0, rn                             # indefinite preconditioner: give up, report
    beta1 = math.sqrt(beta1)
    oldb, beta, dbar, epsln, phibar = 0.0, beta1, 0.0, 0.0, beta1
    cs, sn = -1.0, 0.0
    w = torch.zeros_like(b)
    w2 = torch.zeros_like(b)
    r2 = r1
    eps = torch.finfo(b.dtype).eps
    for it in range(1, maxiter + 1):
        v = y / beta
        y = A(v)
        if it >= 2:
            y = y - (beta / oldb) * r1
        alfa = _dot(v, y)
        y = y - (alfa / beta) * r2
        r1, r2 = r2, y
        y = M(r2) if M else r2
        oldb = beta
        beta = _dot(r2, y)
        if beta < 0:
            return x, it, _norm(b - A(x))
        beta = math.sqrt(beta)
        oldeps = epsln
        delta = cs * dbar + sn * alfa
        gbar = sn * dbar - cs * alfa
        epsln = sn * beta
        dbar = -cs * beta
        gamma = max(math.hypot(gbar, beta), eps)
        cs, sn = gbar / gamma, beta / gamma
        phi = cs * phibar
        phibar = sn * phibar
        w1, w2 = w2, w
        w = (v - oldeps * w1 - delta * w2) / gamma
        x = x.add(w, alpha=phi)
        if phibar <= tol or beta == 0.0:
            rn = _norm(b - A(x))                    # phibar is the M^-1-norm: confirm
            if rn <= tol or beta == 0.0:
                return x, it, rn
    return x, maxiter, _norm(b - A(x))


def gmres(A: Op, b, x, tol, maxiter, M: Optional[Op], restart: int = 30):
    """Restarted GMRES with right preconditioning (the residual is the true residual)."""
    N = b.numel()
    restart = max(1, min(restart, N))
    total = 0
    rn = _norm(b - A(x))
    while True:
        r = b - A(x)
        rn = _norm(r)
        if rn <= tol or total >= maxiter:
            return x, total, rn
        V = [r / rn]
        H = torch.zeros(restart + 1, restart, dtype=torch.float64)
        g = torch.zeros(restart + 1, dtype=torch.float64)
        g[0] = rn
        cs = [0.0] * restart
        sn = [0.0] * restart
        j_last = 0
        for j in range(restart):
            z = M(V[j]) if M else V[j]
            w = A(z)
            for i in range(j + 1):                 # modified Gram-Schmidt
                h = _dot(w, V[i])
                H[i, j] = h
                w = w.sub(V[i], alpha=h)
            hn = _norm(w)
            H[j + 1, j] = hn
            V.append(w / hn if hn > 0 else w)
            for i in range(j):                     # previous Givens rotations
                t = cs[i] * H[i, j] + sn[i] * H[i + 1, j]
                H[i + 1, j] = -sn[i] * H[i, j] + cs[i] * H[i + 1, j]
                H[i, j] = t
            d = math.hypot(float(H[j, j]), float(H[j + 1, j]))
            cs[j] = float(H[j, j]) / d if d > 0 else 1.0
            sn[j] = float(H[j + 1, j]) / d if d > 0 else 0.0
            H[j, j] = d
            H[j + 1, j] = 0.0
            g[j + 1] = -sn[j] * g[j]
            g[j] = cs[j] * g[j]
            total += 1
            j_last = j
            if abs(float(g[j + 1])) <= tol or total >= maxiter or hn == 0:
                break
        k = j_last + 1
        yk = torch.linalg.solve_triangular(H[:k, :k], g[:k].unsqueeze(1), upper=True).squeeze(1)
        upd = torch.zeros_like(b)
        for i in range(k):
            upd = upd.add(V[i], alpha=float(yk[i]))
        x = x + (M(upd) if M else upd)


def lsmr(A: Op, AT: Op, b, x, tol, maxiter, rtol: float):
    """LSMR of Fong and Saunders for ``min ||A x - b||`` (no damping).

    Stops when the residual reaches ``tol`` or, for inconsistent systems, when
    ``||A^T r|| <= rtol ||A|| ||r||`` (a least-squares solution).
    """
    u = b - A(x)
    beta = _norm(u)
    if beta <= tol:
        return x, 0, beta
    u = u / beta
    v = AT(u)
    alpha = _norm(v)
    if alpha == 0:
        return x, 0, beta
    v = v / alpha
    zetabar = alpha * beta
    alphabar = alpha
    rho = rhobar = cbar = 1.0
    sbar = 0.0
    h = v.clone()
    hbar = torch.zeros_like(x)
    normA2 = alpha * alpha
    rn = beta
    for it in range(1, maxiter + 1):
        u = A(v) - alpha * u
        beta = _norm(u)
        if beta > 0:
            u = u / beta
            v = AT(u) - beta * v
            alpha = _norm(v)
            if alpha > 0:
                v = v / alpha
        normA2 += alpha * alpha + beta * beta
        rhoold = rho
        rho = math.hypot(alphabar, beta)
        c, s = alphabar / rho, beta / rho
        thetanew = s * alpha
        alphabar = c * alpha
        rhobarold = rhobar
        thetabar = sbar * rho
        rhotemp = cbar * rho
        rhobar = math.hypot(rhotemp, thetanew)
        cbar, sbar = rhotemp / rhobar, thetanew / rhobar
        zeta = cbar * zetabar
        zetabar = -sbar * zetabar
        hbar = h - (thetabar * rho / (rhoold * rhobarold)) * hbar
        x = x + (zeta / (rho * rhobar)) * hbar
        h = v - (thetanew / rho) * h
        rn = _norm(b - A(x))
        if rn <= tol:
            return x, it, rn
        if abs(zetabar) <= rtol * math.sqrt(normA2) * rn or (alpha == 0 or beta == 0):
            return x, it, rn
    return x, maxiter, rn


KRYLOV_METHODS = ("cg", "bicgstab", "minres", "gmres", "lsmr")
