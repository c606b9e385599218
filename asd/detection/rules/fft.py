"""FFT ops: every output element depends on the whole input slice over the transformed dims.

``torch.fft.*`` functions reach the tracer as ``_fft_r2c``, ``_fft_c2c`` and ``_fft_c2r`` (after
padding/trimming by movement ops); the transformed dims may change length (one-sided spectra),
the others keep their coordinates.
"""

from __future__ import annotations

import torch

from .._core import Call
from ..table import aten_ops, register_rule
from .nn import slice_union, to_out

aten = torch.ops.aten


def fft_rule(call: Call) -> list:
    b = call.bound()
    x = b["self"]
    u, kept = slice_union(call, x, list(b["dim"]))
    out = call.outs[0]
    return [to_out(u, kept, out.shape) if u is not None else None]


register_rule(aten_ops("_fft_r2c", "_fft_c2c", "_fft_c2r"), fft_rule, second_order="linear", family="fft")
