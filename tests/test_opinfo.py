"""Detection checked against PyTorch's OpInfo database.

For every OpInfo op that supports autograd in float64 and each of its sample inputs, the global
pattern with respect to the first floating-point tensor argument (the others are constants) must
contain every nonzero of the dense Jacobian at the sample point and at perturbed points
(soundness); where it equals the union of those nonzeros the sample counts as exact. Where it is
larger, the op may be value-dependent (max, sort, relu): the local pattern at the sample point
(``local=True``) must then contain the nonzeros of the Jacobian there (soundness of local mode),
and the sample counts as exact if it equals them and is sparser than the global pattern.

Run as a script for the coverage table of every op::

    .venv/bin/python tests/test_opinfo.py [--all] [--op NAME ...] [--max-samples K]

The default-suite test checks a few samples per op; the ``slow`` variant checks all of them.
"""

from __future__ import annotations

import random
import re
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

pytest.importorskip("expecttest")

from asd.detection import jacobian_sparsity  # noqa: E402
from asd.errors import UnsupportedOpWarning  # noqa: E402

# Random ops: their Jacobian differs from call to call, so no reference exists. Left out by name.
RANDOM_OPS = {
    "bernoulli", "normal", "normal.number_mean", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "pca_lowrank", "svd_lowrank", "nn.functional.multi_head_attention_forward",
}

# Every other exclusion, with its reason.
EXCLUDED = {
    "native_batch_norm": "in evaluation mode the meta kernel returns save_mean/save_invstd of shape (C,) "
                         "where the CPU kernel returns empty tensors, so the flattened outputs differ; "
                         "the op is checked through nn.functional.batch_norm",
    "_native_batch_norm_legit": "same meta/CPU output-shape difference as native_batch_norm",
    "as_strided_scatter": "PyTorch's autograd formula is wrong with respect to the input (it keeps "
                          "the overwritten positions and drops the others); finite differences agree "
                          "with the detected pattern",
    "to_sparse": "returns a sparse-layout tensor; asd traces strided tensors",
    "sparse.sampled_addmm": "sparse-layout input",
    "sparse.mm.reduce": "sparse-layout input",
    "_segment_reduce.lengths": "internal op without meta kernel for the lengths argument",
    "_segment_reduce.offsets": "internal op without meta kernel for the offsets argument",
    "nn.functional.ctc_loss": "CTC's alignment is computed from integer targets by a dynamic program "
                              "without a meta kernel",
    "nn.functional.max_unpool1d.grad": "duplicate of max_unpool1d with gradcheck-friendly inputs",
    "nn.functional.max_unpool2d.grad": "duplicate of max_unpool2d with gradcheck-friendly inputs",
    "nn.functional.max_unpool3d.grad": "duplicate of max_unpool3d with gradcheck-friendly inputs",
}

MAX_OUT = 4000  # skip samples whose dense reference Jacobian would be larger than this many rows


def full_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def op_samples(op, dtype: torch.dtype = torch.float64) -> list:
    """The op's sample inputs on the CPU, from its generator directly and seeded once.

    ``OpInfo.sample_inputs`` wraps the generator in a tracker that walks the caller's stack with
    ``inspect`` and reseeds every device's generator before each sample: two thirds of a sweep's
    time under pytest."""
    random.seed(0)
    np.random.seed(0)
    torch.random.default_generator.manual_seed(0)
    return list(op.sample_inputs_func(op, "cpu", dtype, False))


def opinfo_ops():
    from torch.testing._internal.common_methods_invocations import op_db

    ops = []
    for op in op_db:
        if not op.supports_autograd or torch.float64 not in op.supported_dtypes("cpu"):
            continue
        name = full_name(op)
        if name in RANDOM_OPS or name in EXCLUDED:
            continue
        ops.append(op)
    return ops


@dataclass
class Result:
    name: str
    status: str  # exact | sound | unsound | error | skipped
    detail: str = ""
    fallback: tuple = ()


def _float_leaf(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.layout == torch.strided


def make_function(op, sample):
    """(f, x): ``f`` replaces the first floating tensor of the sample by its argument and returns
    every floating (or complex, as real pairs) tensor leaf of the output, flattened and concatenated."""
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    pos = next((i for i, a in enumerate(flat) if _float_leaf(a)), None)
    if pos is None:
        return None, None
    x = flat[pos].detach().clone()
    process = getattr(sample, "output_process_fn_grad", None) or (lambda y: y)

    def f(z):
        args = list(flat)
        args[pos] = z
        inp, a, kw = tree_unflatten(args, spec)
        out = process(op(inp, *a, **kw))
        leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        parts = []
        for t in leaves:
            if t.is_complex():
                t = torch.view_as_real(t)
            if t.dtype.is_floating_point:
                parts.append(t.reshape(-1))
        if not parts:
            return None
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    return f, x


def _vectorized_is_consistent(f, x, J) -> bool:
    """PyTorch's batching rules are wrong for a few ops (native_group_norm on some samples):
    check the vmap Jacobian against one plain reverse pass with a random cotangent."""
    y = f(x)
    v = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
    (g,) = torch.autograd.functional.vjp(f, x, v)[1:]
    ref = (v.reshape(-1) @ J.reshape(y.numel(), -1)).reshape(x.shape)
    return bool(torch.allclose(g, ref, rtol=1e-6, atol=1e-8, equal_nan=True))


def dense_nonzeros(f, x) -> np.ndarray | None:
    """Boolean nonzeros of the dense Jacobian (NaN entries count as unknown: False)."""
    try:
        J = torch.autograd.functional.jacobian(f, x, vectorize=True)
        if not _vectorized_is_consistent(f, x, J):
            J = torch.autograd.functional.jacobian(f, x)
    except Exception:  # noqa: BLE001 - vmap unsupported for some ops
        J = torch.autograd.functional.jacobian(f, x)
    J = J.reshape(-1, x.numel()) if x.numel() else J.reshape(-1, 0)
    return ((J.abs() > rounding_floor(J)) & ~torch.isnan(J)).numpy()


def rounding_floor(J: torch.Tensor) -> float:
    """Magnitude below which an entry of a dense reference Jacobian is rounding residue, not a
    derivative: backward formulas that mix a whole matrix (Cholesky's symmetrized solve, QR's)
    leave entries of a few ulps of the largest entry where the exact derivative is zero."""
    finite = J[torch.isfinite(J)]
    if finite.numel() == 0 or not J.dtype.is_floating_point:
        return 0.0
    return float(64 * torch.finfo(J.dtype).eps * finite.abs().max())


def perturbed(x: torch.Tensor, gen: torch.Generator, k: int) -> torch.Tensor:
    u = torch.rand(x.shape, generator=gen, dtype=x.dtype) * 2 - 1
    scale = 1e-2 * (k + 1)
    return x * (1 + scale * u) + scale * u * (x == 0)


def check_sample(op, sample, seed: int = 0, points: int = 3) -> Result:
    name = full_name(op)
    f, x = make_function(op, sample)
    if f is None:
        return Result(name, "skipped", "no floating-point tensor argument")
    try:
        with torch.no_grad():
            y0 = f(x)
    except Exception as exc:  # noqa: BLE001
        return Result(name, "skipped", f"sample does not run: {exc}"[:120])
    if y0 is None:
        return Result(name, "skipped", "no floating-point output")
    if y0.numel() > MAX_OUT or x.numel() > MAX_OUT:
        return Result(name, "skipped", "too large for a dense reference")
    gen = torch.Generator().manual_seed(seed)
    union = nz0 = None
    try:
        for k in range(points):
            xp = x if k == 0 else perturbed(x, gen, k)
            nz = dense_nonzeros(f, xp)
            union = nz if union is None else union | nz
            nz0 = nz if nz0 is None else nz0
    except Exception as exc:  # noqa: BLE001
        return Result(name, "skipped", f"no reference Jacobian: {exc}"[:120])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", UnsupportedOpWarning)
        try:
            P = jacobian_sparsity(f, x)
        except Exception as exc:  # noqa: BLE001
            return Result(name, "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    fallback = tuple(sorted({m.group(1) for w in rec if issubclass(w.category, UnsupportedOpWarning)
                             for m in [re.search(r"no sparsity rule for (\S+);", str(w.message))] if m}))
    P = P.toarray()
    if P.shape != union.shape:
        return Result(name, "unsound", f"pattern shape {P.shape} != Jacobian shape {union.shape}", fallback)
    missed = union & ~P
    if missed.any():
        return Result(name, "unsound", f"{int(missed.sum())} missed nonzeros of {int(union.sum())}", fallback)
    if (P == union).all():
        return Result(name, "exact", "", fallback)
    # value-dependent ops (max, sort, relu, ...): exact if local tracing is exact at the sample point
    try:
        L = jacobian_sparsity(f, x, local=True).toarray()
    except Exception as exc:  # noqa: BLE001
        return Result(name, "sound", f"local tracing failed: {type(exc).__name__}", fallback)
    if (nz0 & ~L).any():
        return Result(name, "unsound", f"local: {int((nz0 & ~L).sum())} missed nonzeros at the point", fallback)
    if (L == nz0).all() and L.sum() < P.sum():
        return Result(name, "exact", "exact under local tracing", fallback)
    return Result(name, "sound", f"{int((P & ~union).sum())} extra entries", fallback)


def run(ops, max_samples: int | None = None, seed: int = 0) -> list[Result]:
    results = []
    for op in ops:
        try:
            samples = op_samples(op)
        except Exception as exc:  # noqa: BLE001
            results.append(Result(full_name(op), "skipped", f"no samples: {exc}"))
            continue
        if max_samples is not None:
            samples = samples[:max_samples]
        for i, sample in enumerate(samples):
            results.append(check_sample(op, sample, seed=seed + i))
    return results


@dataclass
class Summary:
    checked: int = 0
    exact: int = 0
    sound: int = 0
    unsound: int = 0
    error: int = 0
    skipped: int = 0
    fallback: int = 0
    per_op: dict = field(default_factory=lambda: defaultdict(Counter))
    notes: dict = field(default_factory=lambda: defaultdict(set))
    fallback_ops: Counter = field(default_factory=Counter)

    @property
    def pct(self):
        c = max(self.checked, 1)
        return (100.0 * (self.checked - self.unsound) / c, 100.0 * (self.checked - self.error) / c,
                100.0 * self.exact / c)


def summarize(results: list[Result]) -> Summary:
    s = Summary()
    for r in results:
        s.per_op[r.name][r.status] += 1
        if r.status == "skipped":
            s.skipped += 1
            continue
        s.checked += 1
        setattr(s, r.status, getattr(s, r.status) + 1)
        if r.fallback:
            s.fallback += 1
            s.fallback_ops.update(r.fallback)
        if r.detail:
            s.notes[r.name].add(r.detail)
    return s


def table(s: Summary, verbose: bool = True) -> str:
    lines = []
    if verbose:
        lines.append(f"{'op':48s} {'exact':>6s} {'sound':>6s} {'unsnd':>6s} {'error':>6s} {'skip':>6s}")
        for name in sorted(s.per_op):
            c = s.per_op[name]
            lines.append(f"{name:48s} {c['exact']:6d} {c['sound']:6d} {c['unsound']:6d} {c['error']:6d} "
                         f"{c['skipped']:6d}")
    sound, traced, exact = s.pct
    lines.append(f"samples checked {s.checked} (skipped {s.skipped}): sound {sound:.1f}%  traced "
                 f"{traced:.1f}%  exact {exact:.1f}%  (fallback rule used in {s.fallback})")
    if s.fallback_ops:
        lines.append("fallback ops: " + ", ".join(f"{k} x{v}" for k, v in s.fallback_ops.most_common()))
    for name in sorted(s.notes):
        c = s.per_op[name]
        if c["unsound"] or c["error"]:
            lines.append(f"  {name}: " + " | ".join(sorted(s.notes[name]))[:300])
    return "\n".join(lines)


def _check(s: Summary, min_traced: float, min_exact: float):
    print("\n" + table(s))
    bad = {name: sorted(s.notes[name]) for name, c in s.per_op.items() if c["unsound"]}
    assert not bad, f"unsound ops: {bad}"
    sound, traced, exact = s.pct
    assert traced >= min_traced, f"only {traced:.1f}% of the samples traced"
    assert exact >= min_exact, f"only {exact:.1f}% of the samples exact"


def test_opinfo_sound_and_coverage():
    """A few samples of every op (default suite)."""
    s = summarize(run(opinfo_ops(), max_samples=2))
    _check(s, 95.0, 90.0)


@pytest.mark.slow
def test_opinfo_exhaustive():
    """Every sample of every op: the issue's target, at least 95% exact."""
    s = summarize(run(opinfo_ops()))
    _check(s, 95.0, 95.0)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--all", action="store_true", help="every sample (default: 2 per op)")
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--op", nargs="*", default=None)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    ops = opinfo_ops()
    if a.op:
        ops = [o for o in ops if full_name(o) in a.op or o.name in a.op]
    k = None if a.all else (a.max_samples or 2)
    t0 = time.time()
    res = run(ops, max_samples=k)
    s = summarize(res)
    print(table(s, verbose=not a.quiet))
    print(f"{time.time() - t0:.1f} s")
