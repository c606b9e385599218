"""Interpolation (upsample linear / bilinear / bicubic / trilinear, antialiased variants).

These ops are separable linear maps: along each spatial axis an output position reads a few input
positions with weights fixed by the sizes, scales and ``align_corners``. Rather than re-deriving
PyTorch's source-index arithmetic, the rule *probes* the op itself once per axis: it runs the op on
one-hot inputs that vary along that axis only (the other axes have size 2, which the op maps
identically), and the nonzeros of the result are that axis' (input, output) pairs. The pattern is
then the product of the per-axis pairs within each (batch, channel) plane: exact, since a one-hot
probe returns the interpolation weights themselves. (Nearest modes are pure movement.)
"""

from __future__ import annotations

import numpy as np
import torch

from .. import sets as S
from .._core import Call
from ..table import aten_ops, register_rule
from .linear import _combine

aten = torch.ops.aten


def _axis_pairs(call: Call, d: int, axis: int, n_in: int, n_out: int):
    b = call.bound()
    # other axes have size 2, mapped identically (the antialiased kernels mishandle size-1 axes)
    probe = torch.zeros([n_in, 1] + [n_in if i == axis else 2 for i in range(d)], dtype=torch.float64)
    idx = torch.arange(n_in)
    view = probe.movedim(2 + axis, 2)
    view[idx, 0, idx] = 1.0
    names = [a.name for a in call.func._schema.arguments]
    kwargs = {}
    if "scale_factors" in names:  # .vec overload
        sf = b.get("scale_factors")
        if sf is not None:
            kwargs = dict(output_size=None, scale_factors=[float(sf[i]) if i == axis else 1.0 for i in range(d)])
        else:
            kwargs = dict(output_size=[n_out if i == axis else 2 for i in range(d)], scale_factors=None)
        out = call.func(probe, align_corners=b["align_corners"], **kwargs)
    else:
        scale_names = [n for n in names if n.startswith("scales")]
        for i, n in enumerate(scale_names):
            kwargs[n] = b.get(n) if i == axis else None
        out = call.func(probe, [n_out if i == axis else 2 for i in range(d)], b["align_corners"], **kwargs)
    w = (out.movedim(2 + axis, -1) != 0).reshape(n_in, -1, n_out).any(1)
    i_in, i_out = torch.nonzero(w, as_tuple=True)
    return i_out.numpy(), np.zeros(len(i_out), dtype=np.int64), i_in.numpy()


def _rule(d: int):
    def rule(call: Call) -> list:
        b = call.bound()
        x = b.get("self", b.get("input"))
        out = call.outs[0]
        s = call.sets(x)
        if s is None:
            return [None]
        s_in, s_out = list(x.shape[-d:]), list(out.shape[-d:])
        pairs = [_axis_pairs(call, d, a, s_in[a], s_out[a]) for a in range(d)]
        y, _, xi = _combine(pairs, s_out, [1] * d, s_in)
        Sin, Sout = int(np.prod(s_in)), int(np.prod(s_out))
        planes = x.numel() // max(Sin, 1)
        rows = (np.arange(planes)[:, None] * Sout + y[None, :]).reshape(-1)
        cols = (np.arange(planes)[:, None] * Sin + xi[None, :]).reshape(-1)
        return [S.gather_union(s, rows, cols, out.numel())]
    return rule


register_rule(aten_ops("upsample_linear1d"), _rule(1), second_order="linear", family="interpolate")
register_rule(aten_ops("upsample_bilinear2d", "upsample_bicubic2d", "_upsample_bilinear2d_aa",
                       "_upsample_bicubic2d_aa"), _rule(2), second_order="linear", family="interpolate")
register_rule(aten_ops("upsample_trilinear3d"), _rule(3), second_order="linear", family="interpolate")
