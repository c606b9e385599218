"""The cross-mode probe: a derivative checked by one product of the other AD mode.

For a random vector, the decompressed sparse matrix times the vector is compared with one
matrix-free product computed another way: a VJP when the colors were JVPs (one uncompressed JVP
where reverse mode is wrong for ``f``), a JVP when they were VJPs, and for Hessians the other
Hessian-vector product flavour. A stale or too-sparse pattern,
a coloring that does not fit the function, or one of PyTorch's wrong AD formulas shows up as a
disagreement far beyond rounding. Cost: one product and one sparse matrix-vector product.

Each row of the two products is judged at its own scale (``|A| |v|`` in that row, with a floor of
``eps ** ROW_FLOOR_POWER`` times the largest row's), so that a row of small entries beside rows of
large ones is checked as well, down to about 10^-9 of the largest (float64); an entry far below the
largest of its own row is within that row's rounding and can be wrong unnoticed.

The probe's own product avoids the AD modes the trace ruled out (``op.unsafe``, see
:mod:`asd.detection.ad_gaps`), and one that is not finite where the values are is judged on its
finite entries only, and passed over for the next where they agree: a probe must not raise for a
formula PyTorch gets wrong, nor pass values that lack a NaN derivative the pattern left out. A
derivative that is zero to working precision (its products are rounding residue) is judged against
the function's own scale (:func:`_floor`): ``eps ** 0.75`` times the size of ``f(x)`` over that of
``x`` (squared for Hessians), computed only when the relative test fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, jvp, vjp

from .coloring.result import AcyclicColoring, ColumnColoring, StarColoring
from .errors import CheckError

__all__ = ["CheckReport", "probe", "checks_forced"]


def checks_forced() -> bool:
    """``ASD_CHECK=1`` in the environment turns the probe on for every prepared call."""
    return os.environ.get("ASD_CHECK", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class CheckReport:
    """The outcome of one probe."""

    ok: bool
    error: float
    scale: float
    tolerance: float
    product: str
    #: the element of the product judged worst, where the check failed
    row: int | None = None

    def __str__(self) -> str:
        where = "" if self.row is None else f" in element {self.row}"
        return (f"{self.product}: max difference {self.error:.3g}{where} against a scale of {self.scale:.3g} "
                f"(tolerance {self.tolerance:.3g} relative)")


_FLAVOUR = {"forward_over_reverse": "forward-over-reverse", "reverse_over_forward": "reverse-over-forward"}


def _vjp(g, x, u):
    y, pull = vjp(g, x)
    return pull(u.to(y.dtype))[0]


def _dual_jvp(g, x, v):
    """``J @ v`` with plain dual numbers (no ``torch.func`` interpreter: cheaper for one product),
    on a private copy of ``x``."""
    with fwAD.dual_level():
        y = g(fwAD.make_dual(x.detach().clone(), v.to(x.dtype)))
        tangent = fwAD.unpack_dual(y).tangent
    return torch.zeros_like(y) if tangent is None else tangent


def _autograd_vjp(g, x, u):
    with torch.enable_grad():
        xr = x.detach().clone().requires_grad_(True)
        y = g(xr)
        (gx,) = torch.autograd.grad(y, xr, u.to(y.dtype), allow_unused=True)
    return torch.zeros_like(x) if gx is None else gx


def _double_backward(g, x, v):
    with torch.enable_grad():
        xr = x.detach().clone().requires_grad_(True)
        (gr,) = torch.autograd.grad(g(xr), xr, create_graph=True)
        if not gr.requires_grad:
            return torch.zeros_like(x)
        (hv,) = torch.autograd.grad(gr, xr, v, allow_unused=True)
    return torch.zeros_like(x) if hv is None else hv


def _tolerance(dtype: torch.dtype) -> float:
    return tolerance_of(float(torch.finfo(dtype).eps))


def custom_function_hint(trace_info) -> str:
    """Where the trace saw ``f`` compute through custom ``torch.autograd.Function`` classes, a
    sentence naming them and what a failed check then most likely means; else ``""``."""
    names = getattr(trace_info, "custom_functions", None)
    if not names:
        return ""
    return (f"f computes through the torch.autograd.Function {', '.join(sorted(names))}: the detection follows "
            "the ops of its forward, while PyTorch differentiates its backward (or jvp); where these differ "
            "(a straight-through estimator, a surrogate gradient) the detected pattern misses entries: pass "
            "pattern= with the pattern of the derivative its backward defines. ")


def tolerance_of(eps: float) -> float:
    """The relative tolerance of a row at working precision ``eps`` (shared with :mod:`asd.jax`)."""
    return 10 * eps ** 0.5


def _floor(g: Callable, x: torch.Tensor, dtype: torch.dtype, order: int) -> float:
    """Differences that are rounding for ``g`` at ``x``: ``eps ** 0.75 * max|g(x)| / s ** order`` with
    ``s = max(|x|, 1)`` (``order`` 1 for Jacobians, 2 for Hessians), and at least ``16 eps / s ** (order - 1)``
    (a function that cancels to zero, ``cross(a, a)``, leaves products of a few ulps of its inputs)."""
    with torch.enable_grad():
        y = g(x.detach().clone().requires_grad_(True)).detach()
    size = float(y.abs().max()) if y.numel() else 0.0
    xs = max(float(x.abs().max()) if x.numel() else 0.0, 1.0)
    eps = float(torch.finfo(dtype).eps)
    return max(eps ** 0.75 * size / xs ** order, 16 * eps / xs ** (order - 1))


# the AD building blocks (asd.detection.ad_gaps.MODES) of each probe product
_MODES = {
    "reverse-over-forward Hessian-vector product": {"forward", "reverse_over_forward", "reverse"},
    "forward-over-reverse Hessian-vector product": {"forward", "forward_over_reverse", "reverse"},
    "double-backward Hessian-vector product": {"reverse"},
    "vector-Jacobian product": {"reverse"},
    "autograd vector-Jacobian product": {"reverse"},
    "Jacobian-vector product": {"forward"},
}


def _sparse_times(rows, cols, vals, v, size, transpose: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``A @ v`` (or ``A^T @ v``) from COO triplets, and ``|A| @ |v|`` as its rounding scale."""
    src, dst = (rows, cols) if transpose else (cols, rows)
    terms = vals * v[src]
    both = v.new_zeros((size, 2)).index_add_(0, dst, torch.stack([terms, terms.abs()], 1))
    return both[:, 0], both[:, 1]


def _csr_times(decompressor, vals: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, Callable]:
    """``A @ v`` with ``A`` the CSR matrix of ``vals`` in the decompressor's structure, and a thunk
    for ``|A| @ |v|`` (its rounding scale, needed only when ``|A @ v|`` does not settle a check)."""
    A = decompressor.csr(vals)

    def scale() -> torch.Tensor:
        return decompressor.csr(vals.abs()) @ v.abs()
    return A @ v, scale


def probe(op, x: torch.Tensor, values: torch.Tensor, *, generator: torch.Generator | None = None) -> CheckReport:
    """Check ``values`` (the operator's CSR values at ``x``) with one product of the other mode."""
    coloring = op.coloring
    g: Callable = op._g
    if not getattr(g, "copies_input", False):
        # on a copy: a function that writes into its input must change neither x nor the next product's point
        from .operators import _copying_input

        g = _copying_input(g)
    xf = x.detach().reshape(-1)
    if xf.device.type == "meta":
        return CheckReport(True, 0.0, 0.0, 0.0, "nothing to compare on the meta device (no values)")
    dt = values.dtype if values.is_floating_point() else xf.dtype
    vals = values.detach().to(dt)
    rows = op.decompressor.rows
    cols = op.decompressor.col
    m, n = coloring.shape
    gen = generator if generator is not None else torch.Generator(device=xf.device).manual_seed(0x5eed)
    sides: dict = {}  # drawn and multiplied only when a product needs them

    def make_side(which: str, w: torch.Tensor) -> tuple:
        if which == "v":  # CSR matrix-vector products: the common probe, kept cheap
            prod, scale = _csr_times(op.decompressor, vals, w)
        else:
            prod, full = _sparse_times(rows, cols, vals, w, n, transpose=True)
            scale = lambda full=full: full  # noqa: E731
        return w, prod, scale

    def side(which: str):
        """``(random vector, sparse product, its rounding scale)``: ``"v"`` for ``A @ v``, ``"u"`` for
        ``A^T @ u``."""
        if which not in sides:
            size = m if which == "u" else n
            sides[which] = make_side(which, torch.rand(size, dtype=dt, device=xf.device, generator=gen) * 2 - 1)
        return sides[which]

    def outside_pattern(which: str, product: Callable, got: torch.Tensor, ref: torch.Tensor,
                        local: torch.Tensor) -> _Verdict | None:
        """The lines (rows of ``A v``, columns of ``A^T u``) that passed only by the row floor, probed
        again with a vector that vanishes on their stored entries' other index: the sparse side is
        then exactly 0 there, so any product there beyond their tolerance is an entry the pattern
        misses (rounding of the stored entries, which the floor is for, cannot show there). ``None``
        where none fails."""
        suspect = (got - ref).abs() > tol * local
        if not bool(suspect.any()):
            return None
        lines, other = (rows, cols) if which == "v" else (cols, rows)
        w = torch.rand(sides[which][0].shape, dtype=dt, device=xf.device, generator=gen) * 2 - 1
        w[other[suspect[lines]]] = 0
        if not bool((w != 0).any()):
            return None
        kept = sides[which]
        sides[which] = make_side(which, w)
        try:
            again = product().detach().reshape(-1).to(dt)
            mine = sides[which][1]
        except Exception:  # noqa: BLE001 - the product evaluated once already: no second verdict
            return None
        finally:
            sides[which] = kept
        diff = torch.where(suspect & torch.isfinite(again), (again - mine).abs(), torch.zeros_like(again))
        excess = diff - tol * local
        worst = int(excess.argmax())
        if float(excess[worst]) <= 0:
            return None
        return _Verdict(False, float(diff[worst]), float(local[worst]), worst)

    def linearity_defect(which: str, product: Callable, ref: torch.Tensor | None = None) -> torch.Tensor | None:
        """``|P(a + b) - P(a) - P(b)|`` for an uncompressed product ``P`` (``P(a)``: ``ref`` where
        given), largest over :data:`DEFECT_TRIALS` random ``b``: zero in exact arithmetic, so what
        the product's own rounding amounts to at this x, cancellation within ``f`` included (a
        Hessian that vanishes identically, ``sum(group_norm(x))``, is a few ulps of terms far larger
        than itself). ``None`` where a product fails."""
        kept = sides[which]
        try:
            if ref is None:
                ref = product().detach().reshape(-1).to(dt)
            worst = torch.zeros_like(ref)
            for _ in range(DEFECT_TRIALS):
                b = torch.rand(kept[0].shape, dtype=dt, device=xf.device, generator=gen) * 2 - 1
                sides[which] = (b, None, None)
                pb = product().detach().reshape(-1).to(dt)
                sides[which] = (kept[0] + b, None, None)
                pab = product().detach().reshape(-1).to(dt)
                worst = torch.maximum(worst, (pab - ref - pb).abs())
        except Exception:  # noqa: BLE001 - the product evaluated once already: no estimate
            return None
        finally:
            sides[which] = kept
        return worst

    def rounding_shown(which: str, product: Callable, ref: torch.Tensor, finite: torch.Tensor | None):
        """Entry by entry, the largest linearity defect of the products of this side: the
        reference's (``ref`` at the current vector) and those of the other modes PyTorch is not
        known to get wrong for ``f``, the operator's own among them (whose products may show
        rounding the reference's do not: a double backward that is exactly zero beside a
        forward-over-reverse product of a few ulps); zeros where none is available. Entry by entry:
        rounding that large intermediates leave in some rows says nothing of the others (acyclic
        substitution carrying it down a chain of small entries is an error there)."""
        worst = torch.zeros_like(ref if finite is None else ref[finite])
        for name, (side_of, other) in others.items():
            if side_of != which or _MODES[name] & unsafe:
                continue
            defect = linearity_defect(which, other, ref if other is product else None)
            if defect is None:
                continue
            if finite is not None:
                defect = defect[finite]
            if defect.numel() and bool(torch.isfinite(defect).all()):
                worst = torch.maximum(worst, defect)
        return worst

    def v():
        return side("v")[0].to(xf.dtype)

    def u():
        return side("u")[0]

    if isinstance(coloring, (StarColoring, AcyclicColoring)):
        others = {
            "reverse-over-forward Hessian-vector product": ("v", lambda: grad(lambda z: jvp(g, (z,), (v(),))[1])(xf)),
            "forward-over-reverse Hessian-vector product": ("v", lambda: jvp(grad(g), (xf,), (v(),))[1]),
            "double-backward Hessian-vector product": ("v", lambda: _double_backward(g, xf, v())),
        }
        order = [k for k in others if not k.startswith(_FLAVOUR.get(op.hvp, "-"))]
    elif isinstance(coloring, ColumnColoring):
        # last, where reverse mode is wrong for f: one uncompressed JVP, still independent of the coloring
        others = {"vector-Jacobian product": ("u", lambda: _vjp(g, xf, u())),
                  "autograd vector-Jacobian product": ("u", lambda: _autograd_vjp(g, xf, u())),
                  "Jacobian-vector product": ("v", lambda: _dual_jvp(g, xf, v()))}
        order = list(others)
    else:  # row colorings and bicolorings: a JVP; without forward AD, a plain reverse product (still
        # independent of the coloring)
        others = {"Jacobian-vector product": ("v", lambda: _dual_jvp(g, xf, v())),
                  "autograd vector-Jacobian product": ("u", lambda: _autograd_vjp(g, xf, u()))}
        order = list(others)
    unsafe = set(getattr(op, "unsafe", {}) or {})
    order = [name for name in order if not _MODES[name] & unsafe]
    tol = _tolerance(dt)
    row_floor = float(torch.finfo(dt).eps) ** ROW_FLOOR_POWER
    ref = what = got = scale = None
    finite = None  # the entries compared, where a product is not finite everywhere
    errors: list[Exception] = []
    for name in order:
        which, product = others[name]
        try:
            side(which)  # the random vector is drawn before the product uses it
            candidate = product().detach().reshape(-1).to(dt)
        except torch.OutOfMemoryError:
            raise  # no verdict without the product: the call fails as any evaluation would
        except Exception as exc:  # noqa: BLE001 - this product is not available for f: the next one
            errors.append(exc)
            continue
        _, mine, mine_scale = side(which)
        if mine.numel() == 0:
            return CheckReport(True, 0.0, 0.0, tol, name)
        # the common verdict, settled without the rounding scale (|A| |v| >= |A v| in every row)
        verdict = _rows_agree(mine, candidate, candidate.abs(), tol, row_floor)
        if verdict.ok:
            missed = outside_pattern(which, product, mine, candidate, candidate.abs())
            if missed is None:
                return CheckReport(True, verdict.error, verdict.scale, tol, name)
            return CheckReport(False, missed.error, missed.scale, tol, f"{name} on a vector vanishing on the stored "
                               "entries of the rows it checks", missed.row)
        keep = torch.isfinite(candidate)
        if not keep.all() and torch.isfinite(mine).all():
            # PyTorch's formula may fail where the values are finite (not evidence), or the values
            # miss a NaN or infinite derivative (a stale pattern): the finite entries decide
            if not keep.any() or _rows_agree(mine[keep], candidate[keep], candidate[keep].abs(), tol, row_floor).ok:
                continue
            finite = keep
        elif not keep.all() and torch.equal(keep, torch.isfinite(mine)):
            # NaN or infinite derivatives at this x (a NaN in x, sqrt of a negative) in the same lines
            # of both: the finite lines decide
            if not keep.any():
                return CheckReport(True, 0.0, 0.0, tol, f"{name} (no finite line to compare)")
            finite = keep
        ref, what, got, scale = candidate, name, mine, mine_scale
        break
    if ref is None:
        if order and len(errors) == len(order):
            # every product raised: f's own error where f fails at x, else no verdict to pass
            g(xf.clone())
            last = errors[-1]
            raise CheckError(f"the cross-mode check could not evaluate any product of the other AD mode at this x "
                             f"({type(last).__name__}: {str(last).splitlines()[0][:200] if str(last) else ''}); "
                             "the values are unverified") from last
        return CheckReport(True, 0.0, 0.0, tol, "no independent product available")
    full = scale()
    ref_all = ref
    if finite is not None:
        got, ref, full = got[finite], ref[finite], (full[finite] if full.numel() else full)
    local = torch.maximum(full, ref.abs()) if full.numel() else ref.abs()
    verdict = _rows_agree(got, ref, local, tol, row_floor)
    if verdict.row is not None and finite is not None:
        verdict = _Verdict(verdict.ok, verdict.error, verdict.scale, int(torch.nonzero(finite).reshape(-1)[verdict.row]))
    ok = verdict.ok
    if not ok and verdict.error == verdict.error:  # a derivative at rounding level: judge it at the function's scale
        hessian = isinstance(coloring, (StarColoring, AcyclicColoring))
        diff = float((got - ref).abs().max())
        try:
            ok = diff <= _floor(g, xf, dt, 2 if hessian else 1)
        except Exception:  # noqa: BLE001 - f does not run plainly here: keep the relative verdict
            ok = False
        if not ok:  # or, entry by entry, at the rounding the products show at this x (their linearity defect)
            # entry by entry only: a floor shared by the entries (their median) let the rounding of
            # many rows excuse an error in a quiet one (a missed entry, rounding carried down a chain)
            slack = DEFECT_FACTOR * rounding_shown(which, product, ref_all, finite) + tol * local
            ok = bool(((got - ref).abs() <= slack).all())
    if ok and finite is None:  # passed by a floor: no entry outside the pattern hides below it
        missed = outside_pattern(which, product, got, ref, local)
        if missed is not None:
            return CheckReport(False, missed.error, missed.scale, tol, f"{what} on a vector vanishing on the stored "
                               "entries of the rows it checks", missed.row)
    return CheckReport(ok, verdict.error, verdict.scale, tol, what, None if ok else verdict.row)


#: differences up to this many times the other mode's linearity defect are its rounding (:func:`probe`)
DEFECT_FACTOR = 16.0
#: random pairs the linearity defect is the largest over
DEFECT_TRIALS = 8

#: a row's difference below ``eps ** ROW_FLOOR_POWER`` times the largest row scale is rounding,
#: whatever the row's own scale: rows up to about 10^9 (float64; 10^4 in float32) below the largest
#: are checked (a stiff system's small rows), while a row whose intermediates are up to about 10^6
#: times its result (cancellation) still passes
ROW_FLOOR_POWER = 0.6


@dataclass(frozen=True)
class _Verdict:
    ok: bool
    error: float  #: the difference in the row judged worst
    scale: float  #: the scale that row is judged against (``error <= tol * scale`` where it passes)
    row: int | None = None


def _rows_agree(mine: torch.Tensor, ref: torch.Tensor, local: torch.Tensor, tol: float,
                row_floor: float) -> _Verdict:
    """Row by row: ``|mine - ref| <= tol * local + row_floor * max(local)``. A comparison against
    the largest entry alone passes rows that are wrong on a scale far below it (a row of unit
    entries beside rows of 10^8 missing its entries altogether)."""
    diff = (mine - ref).abs()
    top = float(local.max())
    slack = float((diff - tol * local).max())  # NaN anywhere: NaN, no agreement
    if slack <= row_floor * top:
        return _Verdict(True, float(diff.max()), top + (row_floor / tol) * top)
    effective = local + (row_floor / tol) * top
    worst = int(torch.nan_to_num(diff / effective, nan=float("inf")).argmax())
    return _Verdict(False, float(diff[worst]), float(effective[worst]), worst)
