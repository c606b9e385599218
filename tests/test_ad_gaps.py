"""Rebuilding the table of PyTorch's AD gaps (:mod:`asd.detection.ad_gaps`) from OpInfo samples.

For each OpInfo op (float64 autograd, random ops left out) and sample, every AD building block that
asd's backends use is compared with plain, unbatched reverse-mode autograd:

``forward``               ``jacfwd`` against per-row ``autograd.grad``;
``batched_reverse``       ``jacrev`` (vmap of VJPs) against the same;
``forward_over_reverse``  ``jacfwd(jacrev(s))`` against double backward, ``s = sum(w * f(x))``;
``reverse_over_forward``  ``vmap(grad(jvp(s)))`` against the same.

A disagreement that central differences side against PyTorch's transform is a gap; the sweep
fails when it finds one the table does not list for an op the trace saw (the test names the op and
mode to add). The default suite runs the sweep on the ops the table lists (each must still show its
gap, or the entry is stale); ``-m slow`` runs it on every op. As a script it prints every gap found::

    .venv/bin/python tests/test_ad_gaps.py [--op NAME ...]
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("expecttest")

from asd.detection import jacobian_pattern  # noqa: E402
from asd.detection.ad_gaps import MODES, unsafe_modes  # noqa: E402
from test_opinfo import MAX_OUT, full_name, make_function, op_samples, opinfo_ops  # noqa: E402

RTOL, ATOL = 1e-6, 1e-8
MAX_SAMPLES = 4
# OpInfo names of the ops behind the table's entries
TABLE_OPS = ("scatter_reduce.prod", "cdist", "nn.functional.layer_norm", "linalg.det", "linalg.slogdet",
             "linalg.solve")


@dataclass(frozen=True)
class Finding:
    op: str
    mode: str
    listed: bool
    error: float


def _plain_jacobian(f, x):
    return torch.autograd.functional.jacobian(f, x, vectorize=False).reshape(-1, x.numel())


def _central_jacobian(f, x, eps=1e-6):
    cols = []
    for j in range(x.numel()):
        e = torch.zeros_like(x).reshape(-1)
        e[j] = eps
        e = e.reshape(x.shape)
        cols.append(((f(x + e) - f(x - e)) / (2 * eps)).reshape(-1))
    return torch.stack(cols, dim=1)


def _products(f, x):
    """``{mode: (result, reference, finite differences)}`` for the first-order modes, and the
    scalarized function for the second-order ones."""
    ref = _plain_jacobian(f, x)
    out = {}
    for mode, transform in (("forward", torch.func.jacfwd), ("batched_reverse", torch.func.jacrev)):
        try:
            out[mode] = (transform(f)(x).reshape(ref.shape), ref)
        except Exception:  # noqa: BLE001 - a missing formula raises: not a silent gap
            continue
    return out, ref


def _hessians(f, x):
    w = torch.randn(f(x).shape, dtype=x.dtype, generator=torch.Generator().manual_seed(3))

    def s(z):
        return (f(z) * w).sum()

    ref = torch.autograd.functional.hessian(s, x, vectorize=False).reshape(x.numel(), x.numel())
    out = {}

    def rof(z):
        n = z.numel()
        return torch.func.vmap(lambda v: torch.func.grad(lambda u: torch.func.jvp(s, (u,), (v,))[1])(z))(
            torch.eye(n, dtype=z.dtype).reshape(n, *z.shape))

    for mode, fn in (("forward_over_reverse", lambda z: torch.func.jacfwd(torch.func.jacrev(s))(z)),
                     ("reverse_over_forward", rof)):
        try:
            out[mode] = (fn(x).reshape(ref.shape), ref)
        except Exception:  # noqa: BLE001
            continue
    return out, s


def _wrong(got, ref) -> float:
    """Largest error of ``got`` beyond tolerance (0 when it agrees)."""
    if got.shape != ref.shape or not torch.isfinite(ref).all():
        return 0.0
    bad = ~torch.isclose(got, ref, rtol=RTOL, atol=ATOL)
    return float((got - ref).abs()[bad].max()) if bad.any() else 0.0


def _reference_holds(f, x, ref) -> bool:
    """Central differences agree with the plain reverse-mode reference (not a kink or a tie)."""
    fd = _central_jacobian(f, x)
    return bool(torch.allclose(fd, ref, rtol=1e-4, atol=1e-6))


def sweep_sample(op, sample) -> list[Finding]:
    try:
        return _sweep_sample(op, sample)
    except Exception:  # noqa: BLE001 - a sample that does not run under some transform: no finding
        return []


def _sweep_sample(op, sample) -> list[Finding]:
    f, x = make_function(op, sample)
    if f is None or x.numel() == 0 or x.numel() > 64:
        return []
    try:
        with torch.no_grad():
            y = f(x)
        if y is None or y.numel() > MAX_OUT or y.numel() == 0:
            return []
        _, info = jacobian_pattern(f, x, return_info=True)
    except Exception:  # noqa: BLE001 - not traceable or not runnable: nothing to compare
        return []
    unsafe = unsafe_modes(info)
    # both HVP flavours contain a JVP: a forward-mode gap rules them out too
    listed = set(unsafe) | ({"forward_over_reverse", "reverse_over_forward"} if "forward" in unsafe else set())
    findings = []
    try:
        first, ref = _products(f, x)
    except Exception:  # noqa: BLE001
        return []
    for mode, (got, r) in first.items():
        err = _wrong(got, r)
        if err and _reference_holds(f, x, r):
            findings.append(Finding(full_name(op), mode, mode in listed, err))
    try:
        second, s = _hessians(f, x)
    except Exception:  # noqa: BLE001
        return findings
    grad = lambda z: torch.autograd.grad(s(z), z)[0]  # noqa: E731
    for mode, (got, r) in second.items():
        err = _wrong(got, r)
        if err:
            with torch.enable_grad():
                holds = _reference_holds(lambda z: grad(z.detach().requires_grad_()), x, r)
            if holds:
                findings.append(Finding(full_name(op), mode, mode in listed, err))
    return findings


def sweep(names=None, max_samples: int = MAX_SAMPLES) -> list[Finding]:
    found = []
    for op in opinfo_ops():
        if names is not None and full_name(op) not in names:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                samples = op_samples(op)
                samples = samples[::max(1, len(samples) // max_samples)][:max_samples]  # spread over the kinds
            except Exception:  # noqa: BLE001
                continue
            for sample in samples:
                found.extend(sweep_sample(op, sample))
    return found


def test_table_entries_still_show_their_gap_and_are_listed():
    found = sweep(set(TABLE_OPS), max_samples=16)
    assert found, "no table op shows a gap any more: PyTorch fixed them, prune asd.detection.ad_gaps"
    assert {f.mode for f in found} <= set(MODES)
    unlisted = sorted({(f.op, f.mode) for f in found if not f.listed})
    assert not unlisted, f"gaps missing from asd.detection.ad_gaps: {unlisted}"
    assert {f.op.split(".")[0] for f in found} >= {"scatter_reduce", "cdist", "nn"}


@pytest.mark.slow
def test_every_opinfo_gap_is_listed():
    unlisted = sorted({(f.op, f.mode) for f in sweep() if not f.listed})
    assert not unlisted, f"gaps missing from asd.detection.ad_gaps: {unlisted}"


if __name__ == "__main__":
    names = set(sys.argv[sys.argv.index("--op") + 1:]) if "--op" in sys.argv else None
    for finding in sweep(names):
        print(f"{finding.op:40s} {finding.mode:22s} {'listed' if finding.listed else 'MISSING'}  "
              f"max error {finding.error:.3g}")
