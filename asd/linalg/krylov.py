"""Krylov solvers in plain torch: CG, BiCGSTAB, MINRES, restarted GMRES and LSMR.

These are the raw iterations on a linear operator (any device, any float dtype); they run without
autograd.  The solver objects of :mod:`asd.linalg.iterative` call them and wrap them in the
implicit-function backward of :mod:`asd.linalg.base`.  Each returns ``(x, iterations, residual
norm)``; stopping short of the tolerance is reported, never raised.

The recurrence scalars stay on the operands' device as 0-d tensors: the loops read nothing back
to the host except one convergence test every ``check_every`` iterations, so iteration counts are
multiples of ``check_every`` (or ``maxiter``).  Divisions by a vanished quantity (a breakdown, or
an exact solution reached inside a block) give zero instead of NaN, so the iterate stalls and the
next test sees it; GMRES solves its small Hessenberg problem in the least-squares sense, so a
singular A gives its best iterate rather than NaN.  The stopping rule is scipy's:
``||b - A x|| <= max(rtol * ||b||, atol)``; LSMR also stops at a least-squares solution
``||A^T r|| <= rtol ||A|| ||r||``, and at a breakdown.

On ``meta`` there is nothing to read back: every read-back gives NaN (and False for flags), so no
test passes and a loop runs to ``maxiter`` (which the solver objects cap at one block there).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

__all__ = ["cg", "bicgstab", "minres", "gmres", "lsmr"]

Op = Callable[[torch.Tensor], torch.Tensor]


def _norm(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(a)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a / b``, and 0 where ``b == 0``."""
    nz = b != 0
    return torch.where(nz, a / torch.where(nz, b, torch.ones_like(b)), torch.zeros_like(a))


def read_back(*scalars: torch.Tensor) -> list:
    """One device-to-host transfer for the convergence test of a block of iterations (on meta,
    NaN for each number and False for each flag)."""
    if scalars[0].device.type == "meta":
        return [False if s.dtype == torch.bool else math.nan for s in scalars]
    return torch.stack([s.to(torch.float64) for s in scalars]).tolist()


def _block(it: int, maxiter: int, check_every: int) -> range:
    return range(min(check_every, maxiter - it))


def _residual(A: Op, b: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``r = b - A x`` and its norm, read back."""
    r = b - A(x)
    (rn,) = read_back(_norm(r))
    return r, rn


def cg(A: Op, b, x, tol: float, maxiter: int, M: Optional[Op], check_every: int):
    r, rn = _residual(A, b, x)
    if rn <= tol:
        return x, 0, rn
    it = 0
    while it < maxiter:  # the updated residual drifts from b - A x: a stop it claims is confirmed
        z = M(r) if M else r
        p = z.clone()
        rz = torch.dot(r, z)
        broke = torch.zeros((), dtype=torch.bool, device=b.device)
        stop = False
        while it < maxiter:
            for _ in _block(it, maxiter, check_every):
                Ap = A(p)
                pAp = torch.dot(p, Ap)
                broke = broke | (pAp == 0)
                alpha = _div(rz, pAp)
                x = x + alpha * p
                r = r - alpha * Ap
                z = M(r) if M else r
                rz_new = torch.dot(r, z)
                p = z + _div(rz_new, rz) * p
                rz = rz_new
                it += 1
            rn, stop = read_back(_norm(r), broke)
            if rn <= tol or stop:
                break
        r, rn = _residual(A, b, x)  # the true residual: restart from it where the updated one was wrong
        if rn <= tol or stop or not math.isfinite(rn):
            break
    return x, it, rn


def bicgstab(A: Op, b, x, tol: float, maxiter: int, M: Optional[Op], check_every: int):
    r, rn = _residual(A, b, x)
    if rn <= tol:
        return x, 0, rn
    it = 0
    while it < maxiter:                        # a breakdown restarts with a fresh shadow residual
        rhat = r.clone()
        one = torch.ones((), dtype=b.dtype, device=b.device)
        rho, alpha, omega = one, one, one
        v = torch.zeros_like(b)
        p = torch.zeros_like(b)
        broke = torch.zeros((), dtype=torch.bool, device=b.device)
        rn0 = rn
        while it < maxiter:
            for _ in _block(it, maxiter, check_every):
                rho_new = torch.dot(rhat, r)
                p = r + _div(rho_new, rho) * _div(alpha, omega) * (p - omega * v)
                ph = M(p) if M else p
                v = A(ph)
                rv = torch.dot(rhat, v)
                alpha = _div(rho_new, rv)
                s = r - alpha * v
                sh = M(s) if M else s
                t = A(sh)
                omega = _div(torch.dot(t, s), torch.dot(t, t))
                x = x + alpha * ph + omega * sh
                r = s - omega * t
                broke = broke | (rho_new == 0) | (rv == 0) | (omega == 0)
                rho = rho_new
                it += 1
            rn, stop = read_back(_norm(r), broke)
            if rn <= tol or stop:
                break
        # the updated residual drifts from b - A x: a stop it claims is confirmed, and a restart
        # starts from the true residual
        r, rn = _residual(A, b, x)
        if rn <= tol or not math.isfinite(rn):
            return x, it, rn
        if rn >= rn0:                          # a restart that made no progress: give up
            break
    return x, it, rn


def minres(A: Op, b, x, tol: float, maxiter: int, M: Optional[Op], check_every: int):
    """MINRES of Paige and Saunders for symmetric (possibly indefinite) ``A``, SPD ``M``."""
    r1, rn = _residual(A, b, x)
    if rn <= tol:
        return x, 0, rn
    y = M(r1) if M else r1
    (beta1,) = read_back(torch.dot(r1, y))
    if beta1 <= 0:
        return x, 0, rn                             # indefinite preconditioner: give up, report
    zero = torch.zeros((), dtype=b.dtype, device=b.device)
    beta = torch.sqrt(torch.dot(r1, y))
    oldb, dbar, epsln, phibar = zero, zero, zero, beta
    cs, sn = -torch.ones_like(zero), zero
    w = torch.zeros_like(b)
    w2 = torch.zeros_like(b)
    r2 = r1
    eps = torch.finfo(b.dtype).eps
    bad = torch.zeros((), dtype=torch.bool, device=b.device)
    done = bad
    it = 0
    while it < maxiter:
        for _ in _block(it, maxiter, check_every):
            v = _div(y, beta)
            y = A(v)
            if it >= 1:
                y = y - _div(beta, oldb) * r1
            alfa = torch.dot(v, y)
            y = y - _div(alfa, beta) * r2
            r1, r2 = r2, y
            y = M(r2) if M else r2
            oldb = beta
            beta2 = torch.dot(r2, y)
            bad = bad | (beta2 < 0)
            beta = torch.sqrt(beta2.clamp(min=0))
            done = done | (beta == 0)
            oldeps = epsln
            delta = cs * dbar + sn * alfa
            gbar = sn * dbar - cs * alfa
            epsln = sn * beta
            dbar = -cs * beta
            gamma = torch.hypot(gbar, beta).clamp(min=eps)
            cs, sn = gbar / gamma, beta / gamma
            phi = cs * phibar
            phibar = sn * phibar
            w1, w2 = w2, w
            w = (v - oldeps * w1 - delta * w2) / gamma
            x = x + phi * w
            it += 1
        pb, stop_bad, stop_done = read_back(phibar, bad, done)
        if stop_bad:
            break
        if pb <= tol or stop_done:
            _, rn = _residual(A, b, x)                     # phibar is the M^-1-norm: confirm
            if rn <= tol or stop_done:
                return x, it, rn
    return x, it, _residual(A, b, x)[1]


#: ``alpha`` or ``beta`` at most this many ``eps ||A||_F`` is a breakdown of LSMR's bidiagonalization
BREAKDOWN = 10.0


def gmres(A: Op, b, x, tol: float, maxiter: int, M: Optional[Op], check_every: int,
          restart: int = 30):
    """Restarted GMRES with right preconditioning (the residual is the true residual)."""
    restart = max(1, min(restart, b.numel()))
    total = 0
    opts = dict(dtype=b.dtype, device=b.device)
    while True:
        r, rn = _residual(A, b, x)
        if rn <= tol or total >= maxiter:
            return x, total, rn
        V = [r / rn]
        H = torch.zeros(restart + 1, restart, **opts)
        g = torch.zeros(restart + 1, **opts)
        g[0] = rn
        cs = torch.zeros(restart, **opts)
        sn = torch.zeros(restart, **opts)
        hns = []
        for j in range(restart):
            z = M(V[j]) if M else V[j]
            w = A(z)
            for i in range(j + 1):                 # modified Gram-Schmidt
                h = torch.dot(w, V[i])
                H[i, j] = h
                w = w - h * V[i]
            hn = _norm(w)
            hns.append(hn)
            H[j + 1, j] = hn
            V.append(_div(w, hn))
            for i in range(j):                     # previous Givens rotations
                t = cs[i] * H[i, j] + sn[i] * H[i + 1, j]
                H[i + 1, j] = -sn[i] * H[i, j] + cs[i] * H[i + 1, j]
                H[i, j] = t
            d = torch.hypot(H[j, j], H[j + 1, j])
            cs[j] = torch.where(d > 0, _div(H[j, j], d), torch.ones_like(d))
            sn[j] = _div(H[j + 1, j], d)
            H[j, j] = d
            H[j + 1, j] = 0.0
            g[j + 1] = -sn[j] * g[j]
            g[j] = cs[j] * g[j]
            total += 1
            if total >= maxiter or j == restart - 1:
                break
            if (j + 1) % check_every == 0:
                res, happy = read_back(g[j + 1].abs(), (torch.stack(hns) == 0).any())
                if res <= tol or happy:
                    break
        # a happy breakdown (hn == 0) inside the block ends the Krylov space there
        zero = None if b.device.type == "meta" else (torch.stack(hns) == 0).nonzero()
        k = int(zero[0, 0]) + 1 if zero is not None and zero.numel() else len(hns)
        # least squares, not a triangular solve: R is singular where A is on the Krylov space
        yk = torch.linalg.pinv(H[:k, :k]) @ g[:k]
        upd = torch.stack(V[:k], 1) @ yk
        x = x + (M(upd) if M else upd)


def lsmr(A: Op, AT: Op, b, x, tol: float, maxiter: int, check_every: int, normA: float, rtol: float):
    """LSMR of Fong and Saunders for ``min ||A x - b||`` (no damping; ``normA`` is ``||A||_F``).

    Stops when the residual reaches ``tol`` or, for inconsistent systems, when
    ``||A^T r|| <= rtol ||A|| ||r||`` (a least-squares solution); returns ``(x, iterations,
    residual norm, converged)`` with ``converged`` true when either test passed.

    A breakdown of the bidiagonalization (``alpha`` or ``beta`` at most ``BREAKDOWN eps ||A||_F``),
    or the recurrence's estimate of ``||A^T r||`` at its rounding level ``eps ||A||_F ||b||`` while
    ``alpha`` or ``beta`` fades below ``sqrt(eps) ||A||_F`` (the Krylov space of a rank-deficient A
    is exhausted, and what is left of it is rounding noise; the estimate alone drifts below that
    level in float32 long before the residual converges), stops the iteration with the iterate it
    has: the steps past it grow without bound (found by an adversarial review: ``|x| ~ 1e16``
    reported converged). The stopped iterate is then judged by its computed ``||A^T r||``, not the
    recurrence's estimate.
    """
    eps = torch.finfo(b.dtype).eps
    u = b - A(x)
    beta = _norm(u)
    rn, bn = read_back(beta, _norm(b))
    if rn <= tol:
        return x, 0, rn, True
    u = u / beta
    v = AT(u)
    alpha = _norm(v)
    if read_back(alpha)[0] == 0:                    # A^T b = 0: x = 0 is a least-squares solution
        return x, 0, rn, True
    v = v / alpha
    one = torch.ones((), dtype=b.dtype, device=b.device)
    zetabar = alpha * beta
    alphabar = alpha
    rho, rhobar, cbar, sbar = one, one, one, 0 * one
    h = v.clone()
    hbar = torch.zeros_like(x)
    normA2 = alpha * alpha
    floor, ar_floor, fading = BREAKDOWN * eps * normA, eps * normA * bn, eps ** 0.5 * normA
    stop = torch.zeros((), dtype=torch.bool, device=b.device)
    it = 0
    ok = False
    while it < maxiter:
        for _ in _block(it, maxiter, check_every):
            u = A(v) - alpha * u
            beta = _norm(u)
            u = _div(u, beta)
            v = AT(u) - beta * v
            alpha = _norm(v)
            v = _div(v, alpha)
            normA2 = normA2 + alpha * alpha + beta * beta
            rhoold = rho
            rho = torch.hypot(alphabar, beta)
            c, s = _div(alphabar, rho), _div(beta, rho)
            thetanew = s * alpha
            alphabar = c * alpha
            rhobarold = rhobar
            thetabar = sbar * rho
            rhotemp = cbar * rho
            rhobar = torch.hypot(rhotemp, thetanew)
            cbar, sbar = _div(rhotemp, rhobar), _div(thetanew, rhobar)
            zeta = cbar * zetabar
            zetabar = -sbar * zetabar
            hbar = h - _div(thetabar * rho, rhoold * rhobarold) * hbar
            x = torch.where(stop, x, x + _div(zeta, rho * rhobar) * hbar)
            h = v - _div(thetanew, rho) * h
            stop = stop | (alpha <= floor) | (beta <= floor) | (
                (zetabar.abs() <= ar_floor) & (torch.minimum(alpha, beta) <= fading))
            it += 1
        r = b - A(x)
        rn, zb, nA2, halt = read_back(_norm(r), zetabar.abs(), normA2, stop)
        if halt:
            (ar,) = read_back(_norm(AT(r)))
            return x, it, rn, rn <= tol or ar <= rtol * normA * rn
        ok = rn <= tol or zb <= rtol * nA2 ** 0.5 * rn
        if ok:
            break
    return x, it, rn, ok
