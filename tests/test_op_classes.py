"""One classification per op, checked numerically against dense float64 derivatives.

For every OpInfo op (float64, autograd, random ops excluded) and its samples, ``f`` is the op as a
function of the sample's first floating-point tensor (the others are constants, as in
``tests/test_opinfo.py``). The rules the trace reaches state the op's classes:

* first order: the detected Jacobian pattern contains every nonzero of the dense Jacobian at the
  sample point and at perturbed points;
* second order: the table's class of the sample is the highest class of the rules it reaches
  (``zero`` < ``linear`` < ``bilinear``/``nonlinear``). A ``zero`` sample must have a zero dense
  Jacobian; for every sample the detected Hessian pattern of ``sum(f(x) * w)`` (``w`` generic
  weights) contains every nonzero of the dense Hessian, so a ``linear`` sample whose rules record no
  interaction must have a zero Hessian. (The way SparseConnectivityTracer checks each operator's
  class.)

Run as a script for the per-rule table or for the coverage report of the rules no test reaches::

    .venv/bin/python tests/test_op_classes.py [--all] [--op NAME ...]
    .venv/bin/python tests/test_op_classes.py --coverage [PYTEST ARGS ...]

The default-suite test checks one small sample per op; the ``slow`` test every sample.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

pytest.importorskip("expecttest")

from asd.detection import hessian_sparsity, jacobian_sparsity  # noqa: E402
from asd.detection.table import RULES, recording_reached, unreached  # noqa: E402
from asd.errors import UnsupportedOpWarning  # noqa: E402
from test_opinfo import full_name, make_function, op_samples, opinfo_ops, perturbed, rounding_floor  # noqa: E402

RANK = {"zero": 0, "linear": 1, "bilinear": 2, "nonlinear": 2}
# the tracer's stand-in for the input is a clone, an identity: linear alone, no class of its own with others
IDENTITY = {torch.ops.aten.clone.default}
CLASS_NAMES = ("zero", "linear", "nonlinear")


@dataclass
class SampleClass:
    """The classes a sample's rules state and what the dense derivatives say of them."""

    name: str
    ops: frozenset
    rank: int
    failures: list[str] = field(default_factory=list)


def _dense_jacobian(f, x) -> np.ndarray:
    J = torch.autograd.functional.jacobian(f, x).reshape(-1, x.numel())
    return ((J.abs() > rounding_floor(J)) & ~torch.isnan(J)).numpy()


def _dense_hessian(g, x) -> np.ndarray:
    try:
        H = torch.func.hessian(g)(x)
    except Exception:  # noqa: BLE001 - ops without forward AD: reverse over reverse
        H = torch.func.jacrev(torch.func.jacrev(g))(x)
    H = H.reshape(x.numel(), x.numel())
    return ((H.abs() > rounding_floor(H)) & ~torch.isnan(H)).numpy()


def _weights(y: torch.Tensor) -> torch.Tensor:
    return torch.linspace(0.5, 1.5, y.numel(), dtype=y.dtype).reshape(y.shape)


def classify_sample(op, sample, *, max_n: int, points: int = 2, seed: int = 0) -> SampleClass | None:
    """Check one sample's first- and second-order classes; ``None`` when the sample gives no
    reference (no floating-point argument or output, too large, or dense AD fails)."""
    f, x = make_function(op, sample)
    if f is None or not 0 < x.numel() <= max_n:
        return None
    try:
        with torch.no_grad():
            y = f(x)
    except Exception:  # noqa: BLE001
        return None
    if y is None or y.numel() > 40 * max_n:
        return None
    w = _weights(y)

    def g(z):
        return (f(z) * w).sum()

    gen = torch.Generator().manual_seed(seed)
    xs = [x] + [perturbed(x, gen, k) for k in range(1, points)]
    try:
        J = np.logical_or.reduce([_dense_jacobian(f, z) for z in xs])
        H = np.logical_or.reduce([_dense_hessian(g, z) for z in xs])
    except Exception:  # noqa: BLE001 - dense AD does not run here: nothing to compare with
        return None
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", UnsupportedOpWarning)
        with recording_reached() as ops:  # the op's own rules (not the weighted sum's)
            P = jacobian_sparsity(f, x).toarray()
        Hp = hessian_sparsity(g, x).toarray()
    fallback = any(issubclass(r.category, UnsupportedOpWarning) for r in rec)
    rank = 2 if fallback else max((RANK[RULES[o].second_order] for o in ops - IDENTITY), default=1)
    res = SampleClass(full_name(op), frozenset(ops), rank)
    if (J & ~P).any():
        res.failures.append(f"Jacobian pattern misses {int((J & ~P).sum())} nonzeros")
    if rank == 0 and J.any():
        res.failures.append(f"class zero, but {int(J.sum())} nonzero Jacobian entries")
    if (H & ~Hp).any():
        res.failures.append(f"class {CLASS_NAMES[rank]}: Hessian pattern misses {int((H & ~Hp).sum())} nonzeros")
    return res


def run(ops, *, max_samples: int | None, max_n: int, points: int = 2) -> list[SampleClass]:
    results = []
    for op in ops:
        try:
            samples = op_samples(op)
        except Exception:  # noqa: BLE001
            continue
        checked = 0
        for i, sample in enumerate(samples):
            if max_samples is not None and checked >= max_samples:
                break
            r = classify_sample(op, sample, max_n=max_n, points=points, seed=i)
            if r is not None:
                results.append(r)
                checked += 1
    return results


def per_rule(results: list[SampleClass]) -> dict:
    """``{overload: (class in the table, samples reaching it, failing samples)}``."""
    table = defaultdict(lambda: [0, 0])
    for r in results:
        for o in r.ops:
            table[o][0] += 1
            table[o][1] += bool(r.failures)
    return {o: (RULES[o].second_order, n, bad) for o, (n, bad) in table.items()}


def _assert_classified(results: list[SampleClass], min_rules: int):
    bad = [f"{r.name} ({', '.join(sorted(str(o) for o in r.ops))}): {'; '.join(r.failures)}"
           for r in results if r.failures]
    assert not bad, "misclassified samples:\n" + "\n".join(bad[:30])
    assert len(per_rule(results)) >= min_rules
    assert {r.rank for r in results} == {0, 1, 2}


def test_every_op_class_against_dense_derivatives():
    """One small sample per OpInfo op (default suite)."""
    results = run(opinfo_ops(), max_samples=1, max_n=12)
    _assert_classified(results, min_rules=150)


@pytest.mark.slow
def test_every_op_class_every_sample():
    """Every sample of every OpInfo op up to 60 traced elements, at three points."""
    results = run(opinfo_ops(), max_samples=None, max_n=60, points=3)
    _assert_classified(results, min_rules=200)


def test_unreached_lists_every_rule_not_reached():
    everything = unreached((), traceable_only=False)
    assert sum(len(v) for v in everything.values()) == len(RULES)
    assert unreached(RULES) == {}
    traceable = {name for names in unreached(()).values() for name in names}
    assert "aten.sin.default" in traceable and "aten.sin.out" not in traceable and "aten.sin.int" not in traceable
    with recording_reached() as reached:
        jacobian_sparsity(lambda z: z.sin() * 2.0, torch.randn(3, dtype=torch.float64))
    assert {torch.ops.aten.sin.default, torch.ops.aten.mul.Tensor} <= reached
    assert str(torch.ops.aten.sin.default) not in unreached(reached).get("elementwise", [])


# -- script: the per-rule table and the coverage report -----------------------------------------------

def print_per_rule(results: list[SampleClass]) -> None:
    rows = per_rule(results)
    print(f"{'overload':52s} {'class':10s} {'samples':>8s} {'failing':>8s}")
    for o in sorted(rows, key=str):
        cls, n, bad = rows[o]
        print(f"{str(o):52s} {cls:10s} {n:8d} {bad:8d}")
    for r in results:
        if r.failures:
            print(f"  {r.name}: {'; '.join(r.failures)}")
    print(f"{len(results)} samples, {sum(bool(r.failures) for r in results)} failing, {len(rows)} rules reached "
          f"of {len(RULES)}")


class _Coverage:
    """pytest plugin: record the rules reached while the session runs, report the others."""

    def pytest_sessionstart(self, session):
        self._ctx = recording_reached()
        self.reached = self._ctx.__enter__()

    def pytest_sessionfinish(self, session, exitstatus):
        self._ctx.__exit__(None, None, None)

    def report(self) -> str:
        missing = unreached(self.reached)
        traceable = sum(len(v) for v in unreached(()).values())
        lines = [f"rules reached by the tests: {len(self.reached)} of {len(RULES)} registered overloads; "
                 f"{sum(len(v) for v in missing.values())} of the {traceable} a trace can meet are unreached"]
        for family, names in missing.items():
            lines.append(f"{family} ({len(names)} unreached): " + ", ".join(names))
        return "\n".join(lines)


def coverage(pytest_args: list[str]) -> int:
    """Run pytest with ``pytest_args`` and print the rules that no test reached."""
    plugin = _Coverage()
    code = pytest.main(pytest_args, plugins=[plugin])
    print(plugin.report())
    return int(code)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--coverage", action="store_true", help="run pytest (remaining args) and report unreached rules")
    p.add_argument("--all", action="store_true", help="every sample (default: one per op)")
    p.add_argument("--op", nargs="*", default=None)
    p.add_argument("--max-n", type=int, default=None)
    a, rest = p.parse_known_args()
    if a.coverage:
        sys.exit(coverage(rest or ["-q", "-m", "not slow", "-p", "no:cacheprovider", "tests/test_detection.py",
                                   "tests/test_detection_classes.py", "tests/test_op_classes.py",
                                   "tests/test_opinfo.py", "tests/test_hessian_sparsity.py"]))
    warnings.simplefilter("ignore")
    ops = opinfo_ops()
    if a.op:
        ops = [o for o in ops if full_name(o) in a.op or o.name in a.op]
    t0 = time.time()
    res = run(ops, max_samples=None if a.all else 1, max_n=a.max_n or (60 if a.all else 12),
              points=3 if a.all else 2)
    print_per_rule(res)
    print(f"{time.time() - t0:.1f} s")
