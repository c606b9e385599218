"""Second-order classification checked against PyTorch's OpInfo database.

For every OpInfo op that supports autograd in float64 and each of its sample inputs, *all* the
floating-point tensor arguments are traced together (so cross terms between operands are tested):
``f(z)`` splits ``z`` into the arguments, runs the op and returns ``sum_k (w_k * out_k).sum()`` with
fixed generic weights ``w_k``. Its Hessian is the weighted sum of the outputs' Hessians, so the
detected pattern must contain every nonzero of the dense float64 Hessian at the sample point and at
perturbed points (soundness); where it equals their union the sample counts as exact.

Run as a script for the per-op table::

    .venv/bin/python tests/test_hessian_sparsity_opinfo.py [--all] [--op NAME ...] [--max-samples K]
"""

from __future__ import annotations

import time
import warnings
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

pytest.importorskip("expecttest")

from asd.detection import hessian_sparsity  # noqa: E402
from test_opinfo import op_samples  # noqa: E402

# ops whose samples cannot give a reference (random ops) or a traceable function
SKIP = {
    "bernoulli", "normal", "normal.number_mean", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "pca_lowrank", "svd_lowrank", "nn.functional.multi_head_attention_forward", "to_sparse",
    "sparse.sampled_addmm", "sparse.mm.reduce", "_segment_reduce.lengths", "_segment_reduce.offsets",
    "nn.functional.ctc_loss",
    # PyTorch's own derivative is wrong there (see tests/test_opinfo.py)
    "as_strided_scatter",
}
MAX_N = 150  # traced elements per sample (dense Hessians by n backward passes)


def full_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def opinfo_ops():
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if op.supports_autograd and torch.float64 in op.supported_dtypes("cpu")
            and full_name(op) not in SKIP]


def _float_leaf(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.layout == torch.strided


def make_function(op, sample):
    """(f, z): ``z`` holds every float64 tensor argument of the sample, ``f(z)`` a weighted sum of
    the op's floating outputs."""
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    pos = [i for i, a in enumerate(flat) if _float_leaf(a)]
    if not pos:
        return None, None
    shapes = [flat[i].shape for i in pos]
    sizes = [flat[i].numel() for i in pos]
    z = torch.cat([flat[i].detach().reshape(-1) for i in pos]) if pos else None
    process = getattr(sample, "output_process_fn_grad", None) or (lambda y: y)
    weights: dict[int, torch.Tensor] = {}

    def f(v):
        args = list(flat)
        for i, piece, shape in zip(pos, torch.split(v, sizes), shapes):
            args[i] = piece.reshape(shape)
        inp, a, kw = tree_unflatten(args, spec)
        out = process(op(inp, *a, **kw))
        total = v.sum() * 0
        for k, t in enumerate(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
            if t.is_complex():
                t = torch.view_as_real(t)
            if not t.dtype.is_floating_point:
                continue
            if k not in weights:
                g = torch.Generator().manual_seed(1000 + k)
                weights[k] = 0.5 + torch.rand(t.shape, generator=g, dtype=torch.float64)
            total = total + (weights[k].to(t.dtype) * t).sum()
        return total

    return f, z


def dense_nonzeros(f, z) -> np.ndarray:
    try:
        H = torch.autograd.functional.hessian(f, z, vectorize=True)
    except Exception:  # noqa: BLE001 - vmap unsupported for some ops
        H = torch.autograd.functional.hessian(f, z)
    H = H.reshape(z.numel(), z.numel())
    H = torch.where(torch.isfinite(H), H, 0.0)
    # rounding noise of some backward formulas (copysign: 3e-17 where the truth is 0)
    tol = 1e-12 * max(1.0, float(H.abs().max())) if H.numel() else 0.0
    return (H.abs() > tol).numpy()


def perturbed(x: torch.Tensor, gen: torch.Generator, k: int) -> torch.Tensor:
    u = torch.rand(x.shape, generator=gen, dtype=x.dtype) * 2 - 1
    scale = 1e-2 * (k + 1)
    return x * (1 + scale * u) + scale * u * (x == 0)


def check_sample(op, sample, seed: int = 0, points: int = 2) -> tuple[str, str]:
    """(status, detail): status in exact | sound | unsound | error | skipped."""
    f, z = make_function(op, sample)
    if f is None:
        return "skipped", "no float64 tensor argument"
    if z.numel() > MAX_N or z.numel() == 0:
        return "skipped", "too large for a dense reference"
    try:
        with torch.no_grad():
            f(z)
        gen = torch.Generator().manual_seed(seed)
        union = np.zeros((z.numel(), z.numel()), dtype=bool)
        for k in range(points):
            union |= dense_nonzeros(f, z if k == 0 else perturbed(z, gen, k))
    except Exception as exc:  # noqa: BLE001
        return "skipped", f"no reference Hessian: {exc}"[:120]
    try:
        P = hessian_sparsity(f, z).toarray()
    except Exception as exc:  # noqa: BLE001
        return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    missed = union & ~P
    if missed.any():
        return "unsound", f"{int(missed.sum())} missed of {int(union.sum())}, e.g. {np.argwhere(missed)[0].tolist()}"
    if (P == union).all():
        return "exact", ""
    return "sound", f"{int((P & ~union).sum())} extra"


def run(ops, max_samples: int | None = None):
    per_op: dict[str, Counter] = defaultdict(Counter)
    notes: dict[str, set] = defaultdict(set)
    for op in ops:
        name = full_name(op)
        try:
            samples = op_samples(op)
        except Exception:  # noqa: BLE001
            continue
        taken = 0
        for i, sample in enumerate(samples):
            if max_samples is not None and taken >= max_samples:
                break
            status, detail = check_sample(op, sample, seed=i)
            per_op[name][status] += 1
            if status != "skipped":
                taken += 1
            if detail and status in ("unsound", "error"):
                notes[name].add(detail)
    return per_op, notes


def summary(per_op, notes, verbose: bool = False) -> str:
    tot = Counter()
    for c in per_op.values():
        tot.update(c)
    lines = []
    if verbose:
        for name in sorted(per_op):
            c = per_op[name]
            lines.append(f"{name:48s} " + " ".join(f"{k}={c[k]}" for k in ("exact", "sound", "unsound",
                                                                             "error", "skipped") if c[k]))
    checked = sum(tot[k] for k in ("exact", "sound", "unsound", "error"))
    lines.append(f"samples checked {checked}: exact {tot['exact']}, sound {tot['sound']}, unsound "
                 f"{tot['unsound']}, error {tot['error']} (skipped {tot['skipped']})")
    for name in sorted(notes):
        lines.append(f"  {name}: " + " | ".join(sorted(notes[name]))[:300])
    return "\n".join(lines)


def _assert_sound(per_op, notes):
    print("\n" + summary(per_op, notes))
    bad = {n: sorted(notes[n]) for n, c in per_op.items() if c["unsound"]}
    assert not bad, f"unsound second-order classification: {bad}"


# elementwise, binary, product and reduction families: one sample each in the default suite
QUICK = {
    "mul", "div.no_rounding_mode", "true_divide", "pow", "float_power", "xlogy", "special.xlog1py",
    "addcmul", "addcdiv", "lerp", "nn.functional.prelu", "mm", "addmm", "bmm", "baddbmm", "mv", "addmv",
    "dot", "vdot", "inner", "matmul", "einsum", "prod", "cumprod", "logsumexp", "softmax", "atan2",
    "hypot", "maximum", "fmod", "remainder", "where", "clamp", "nan_to_num", "sin", "exp", "sqrt",
    "rsqrt", "reciprocal", "sigmoid", "tanh", "square", "abs", "relu", "nn.functional.gelu",
    "nn.functional.softplus", "sub", "add", "rsub", "sum", "mean", "var", "std", "norm",
    "linalg.vector_norm", "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.linear",
    "nn.functional.bilinear", "kron", "outer", "cross", "linalg.cross", "tensordot", "trace", "diag",
    "cumsum", "max.binary", "min.binary", "copysign", "logaddexp", "polar", "scatter_reduce.prod",
    "index_reduce.prod", "amax", "sort", "nn.functional.normalize", "nn.functional.layer_norm",
    "nn.functional.mse_loss", "nn.functional.huber_loss", "nn.functional.cosine_similarity",
}


def test_opinfo_hessian_quick():
    ops = [op for op in opinfo_ops() if full_name(op) in QUICK]
    warnings.simplefilter("ignore")
    _assert_sound(*run(ops, max_samples=2))


@pytest.mark.slow
def test_opinfo_hessian_exhaustive():
    warnings.simplefilter("ignore")
    _assert_sound(*run(opinfo_ops(), max_samples=4))


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--all", action="store_true", help="every sample (default: 2 per op)")
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--op", nargs="*", default=None)
    p.add_argument("--quick", action="store_true", help="only the default suite's ops")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    ops = opinfo_ops()
    if a.op:
        ops = [o for o in ops if full_name(o) in a.op or o.name in a.op]
    if a.quick:
        ops = [o for o in ops if full_name(o) in QUICK]
    t0 = time.time()
    res = run(ops, max_samples=None if a.all else (a.max_samples or 2))
    print(summary(*res, verbose=a.verbose))
    print(f"{time.time() - t0:.1f} s")
