"""Never failing where autograd works: asd's sparse Jacobian on PyTorch's OpInfo samples.

For each OpInfo sample (float64 autograd ops, random ops left out, as in ``test_opinfo.py``) whose
dense Jacobian ``torch.autograd.functional.jacobian`` computes, ``asd.sparse_jacobian`` must
return it too (equal to it, float64 tolerances): an asd error where autograd works counts as a
failure, and so does a wrong value. The default suite runs one sample per op of a fixed subset;
``-m slow`` runs two samples of every op. As a script it prints every failure::

    .venv/bin/python tests/test_opinfo_evaluation.py [--samples K]
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

pytest.importorskip("expecttest")

import asd  # noqa: E402
from test_opinfo import MAX_OUT, full_name, make_function, op_samples, opinfo_ops  # noqa: E402

SUBSET = ("abs", "cumprod", "cdist", "scatter_reduce.prod", "nn.functional.layer_norm", "linalg.det",
          "nn.functional.embedding", "index_put", "take_along_dim", "nn.functional.conv1d", "sort", "max.reduction_with_dim")


COMPARED = {"n": 0}  # samples held to a dense reference, for the script's tally


def evaluate_sample(op, sample) -> str | None:
    """``None`` when asd agrees with dense autograd (or autograd itself fails), else what went wrong."""
    f, x = make_function(op, sample)
    if f is None or x.numel() == 0 or x.numel() > 256:
        return None
    try:
        with torch.no_grad():
            y = f(x)
        if y is None or y.numel() == 0 or y.numel() > MAX_OUT:
            return None
        dense = torch.autograd.functional.jacobian(f, x).reshape(y.numel(), x.numel())
    except Exception:  # noqa: BLE001 - no reference: nothing to hold asd to
        return None
    if not torch.isfinite(dense).all():
        return None
    COMPARED["n"] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            J = asd.sparse_jacobian(f, x, cache=False).to_dense().reshape(dense.shape)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if not torch.allclose(J, dense, rtol=1e-6, atol=1e-8 * max(1.0, float(dense.abs().max()))):
        return f"wrong value: max error {float((J - dense).abs().max()):.3g}"
    return None


def sweep(names=None, samples: int = 2) -> list[tuple[str, str]]:
    failures = []
    for op in opinfo_ops():
        name = full_name(op)
        if names is not None and name not in names:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                all_samples = op_samples(op)
            except Exception:  # noqa: BLE001
                continue
        picked = all_samples[::max(1, len(all_samples) // samples)][:samples]
        for sample in picked:
            problem = evaluate_sample(op, sample)
            if problem is not None:
                failures.append((name, problem))
    return failures


def test_evaluation_where_autograd_works_subset():
    failures = sweep(set(SUBSET), samples=1)
    assert not failures, failures


@pytest.mark.slow
def test_evaluation_where_autograd_works_every_op():
    failures = sweep()
    assert not failures, "\n".join(f"{name}: {problem}" for name, problem in failures)


if __name__ == "__main__":
    k = int(sys.argv[sys.argv.index("--samples") + 1]) if "--samples" in sys.argv else 2
    found = sweep(samples=k)
    for name, problem in found:
        print(f"{name:45s} {problem}")
    print(f"{len(found)} failures in {COMPARED['n']} samples compared")
