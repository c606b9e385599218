"""The conservative rule for ops without a registered rule.

Every differentiable output element depends on every input element of every differentiable
operand: sound for any op, and as dense as a rule can be. The tracer warns (once per op) when it
uses this rule, or raises under ``strict=True``.
"""

from __future__ import annotations

import numpy as np
from torch.utils._pytree import tree_flatten

from .. import sets as S
from .._core import Call, TracedTensor, is_differentiable_dtype


def conservative(call: Call) -> list:
    flat, _ = tree_flatten((call.args, call.kwargs))
    parts = [call.sets(a) for a in flat if isinstance(a, TracedTensor)]
    parts = [S.full_row(p) for p in parts if p is not None]
    if not parts:
        return [None] * len(call.outs)
    row = S.union(parts, 1, call.n)
    return [S.take_rows(row, np.zeros(o.numel(), dtype=np.int64)) if is_differentiable_dtype(o.dtype) else None
            for o in call.outs]
