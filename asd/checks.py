"""The cross-mode probe: a derivative checked by one product of the other AD mode.

For a random vector, the decompressed sparse matrix times the vector is compared with one
matrix-free product computed another way: a VJP when the colors were JVPs, a JVP when they were
VJPs, and for Hessians the other Hessian-vector product flavour. A stale or too-sparse pattern,
a coloring that does not fit the function, or one of PyTorch's wrong AD formulas shows up as a
disagreement far beyond rounding. Cost: one product and one sparse matrix-vector product.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
from torch.func import grad, jvp, vjp

from .coloring.result import AcyclicColoring, ColumnColoring, StarColoring

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

    def __str__(self) -> str:
        return (f"{self.product}: max difference {self.error:.3g} against a scale of {self.scale:.3g} "
                f"(tolerance {self.tolerance:.3g} relative)")


def _tolerance(dtype: torch.dtype) -> float:
    return 10 * float(torch.finfo(dtype).eps) ** 0.5


def _sparse_times(rows, cols, vals, v, size, transpose: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``A @ v`` (or ``A^T @ v``) from COO triplets, and ``|A| @ |v|`` as its rounding scale."""
    src, dst = (rows, cols) if transpose else (cols, rows)
    out = v.new_zeros(size).index_add(0, dst, vals * v[src])
    scale = v.new_zeros(size).index_add(0, dst, (vals * v[src]).abs())
    return out, scale


def probe(op, x: torch.Tensor, values: torch.Tensor, *, generator: torch.Generator | None = None) -> CheckReport:
    """Check ``values`` (the operator's CSR values at ``x``) with one product of the other mode."""
    coloring = op.coloring
    g: Callable = op._g
    xf = x.detach().reshape(-1)
    dt = values.dtype if values.is_floating_point() else xf.dtype
    vals = values.detach().to(dt)
    rows = op.decompressor.rows
    cols = op.decompressor.col
    m, n = coloring.shape
    gen = generator if generator is not None else torch.Generator(device=xf.device).manual_seed(0x5eed)
    if isinstance(coloring, (StarColoring, AcyclicColoring)):
        v = torch.randn(n, dtype=dt, device=xf.device, generator=gen)
        got, scale = _sparse_times(rows, cols, vals, v, n, transpose=False)
        if op.hvp == "forward_over_reverse":
            ref = grad(lambda z: jvp(g, (z,), (v.to(xf.dtype),))[1])(xf)
            what = "reverse-over-forward Hessian-vector product"
        else:
            ref = jvp(grad(g), (xf,), (v.to(xf.dtype),))[1]
            what = "forward-over-reverse Hessian-vector product"
    elif isinstance(coloring, ColumnColoring):
        u = torch.randn(m, dtype=dt, device=xf.device, generator=gen)
        got, scale = _sparse_times(rows, cols, vals, u, n, transpose=True)
        y, pull = vjp(g, xf)
        ref = pull(u.to(y.dtype))[0]
        what = "vector-Jacobian product"
    else:  # row colorings and bicolorings: a JVP
        v = torch.randn(n, dtype=dt, device=xf.device, generator=gen)
        got, scale = _sparse_times(rows, cols, vals, v, m, transpose=False)
        ref = jvp(g, (xf,), (v.to(xf.dtype),))[1]
        what = "Jacobian-vector product"
    ref = ref.detach().reshape(-1).to(dt)
    err = float((got - ref).abs().max()) if got.numel() else 0.0
    sc = max(float(scale.max()) if scale.numel() else 0.0, float(ref.abs().max()) if ref.numel() else 0.0)
    tol = _tolerance(dt)
    ok = bool(err <= tol * sc) and err == err
    return CheckReport(ok, err, sc, tol, what)
