"""PyTorch's own missing or wrong derivative formulas, by AD mode, and the modes a trace rules out.

Evaluation differentiates ``f`` with PyTorch's formulas; where one of them is wrong the sparse
result is wrong too, without a word. This table lists the (op, mode) pairs known to be wrong in
the PyTorch this package supports (found by ``tests/test_ad_gaps.py``, which checks each entry
against plain reverse-mode autograd and finite differences, and by ``tests/test_fuzz.py``). The
tracer notes the entries whose ops ``f`` applies (:attr:`TraceInfo.gaps
<asd.detection.torch_tracer.TraceInfo>`); prepared operators then evaluate in a mode that avoids
them (:func:`unsafe_modes`).

The modes are the AD building blocks of the evaluation backends:

``forward``
    forward-mode AD (dual numbers, ``torch.func.jvp``): column and bidirectional colorings, and
    both HVP flavours that contain a JVP;
``batched_reverse``
    VJPs batched with ``vmap`` (row and bidirectional colorings, reverse-over-reverse HVPs);
``reverse_over_forward``
    ``grad`` of ``jvp`` (the ``hvp="reverse_over_forward"`` flavour);
``forward_over_reverse``
    ``jvp`` of ``grad`` (the default HVP flavour).

Plain, unbatched reverse mode (the autograd-loop backend) needs none of them. An entry whose modes
include ``reverse`` (plain reverse mode, and with it every other mode: :data:`EVERY_MODE`) leaves no
evaluation that PyTorch gets right: prepared operators refuse such a function with an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ._core import storage_positions, window_positions

__all__ = ["MODES", "EVERY_MODE", "Gap", "GAPS", "gaps_of", "unsafe_modes"]


MODES = ("forward", "batched_reverse", "reverse_over_forward", "forward_over_reverse")
#: a formula PyTorch gets wrong in plain reverse mode as well: no mode gives the derivative
EVERY_MODE = frozenset({*MODES, "reverse"})


@dataclass(frozen=True)
class Gap:
    """A derivative formula of ``op`` that PyTorch gets wrong (or lacks) under ``modes``.

    ``applies(bound)`` tells, from the op's bound arguments, whether a call is affected (for
    instance only ``reduce="prod"`` of ``scatter_reduce``); ``reason`` is what a warning says.
    """

    op: str
    modes: frozenset
    reason: str
    applies: Callable[[dict], bool] = lambda bound: True


def _prod(bound: dict) -> bool:
    return bound.get("reduce") == "prod"


def _padded(bound: dict) -> bool:
    padding_idx = bound.get("padding_idx", -1)
    return padding_idx is not None and padding_idx >= 0


def _carries_sets(t) -> bool:
    sets = getattr(t, "sets", None)  # a traced tensor: constants carry empty sets
    return sets is not None and getattr(sets, "nnz", 0) > 0


def _window_reads_traced_storage_outside(bound: dict) -> bool:
    """``as_strided(self, size, stride, storage_offset)`` reads a storage position that is none of
    ``self``'s elements and whose element depends on the input (PyTorch's derivative gives such
    reads zero); a position the trace does not know counts as one."""
    x = bound.get("self")
    storage = getattr(x, "_storage", None)
    if storage is None:
        return False
    outside = np.setdiff1d(window_positions(bound, x), storage_positions(x.shape, x.stride(), x.storage_offset()))
    if not outside.size or storage.sets.nnz == 0:
        return False
    if x.element_size() != storage.geometry[3]:
        return True
    rows = storage.rows_at(outside)
    return rows is None or bool(np.diff(storage.sets.indptr)[rows].any())


def _scatter_derivative_wrong(bound: dict) -> bool:
    """``as_strided_scatter``: PyTorch's derivative with respect to ``self`` is wrong whenever it has
    one; with respect to ``src`` wherever ``self`` is not contiguous from its storage's start or the
    window writes a position twice."""
    x, src = bound.get("self"), bound.get("src")
    if _carries_sets(x):
        return True
    if not _carries_sets(src):
        return False
    window = window_positions(bound, x)
    # right for a contiguous self at its storage's start, or addressed from its own start
    return not (x.is_contiguous() and (x.storage_offset() == 0 or bound.get("storage_offset") is None)
                and np.unique(window).size == window.size)


_ROF = "PyTorch's double backward of {} through a JVP (grad of jvp) is wrong"
_STRIDED = ("PyTorch's derivative of {} reading storage outside its input's elements (a view's offset "
            "or strides) is wrong in every AD mode")

# keyed by the qualified name of the op packet: some namespaces (torch_nn) register their ops late
GAPS: dict = {
    "aten::scatter_reduce": (Gap("scatter_reduce", frozenset({"forward"}),
                                 "PyTorch's forward-mode derivative of scatter_reduce(reduce='prod') is zero", _prod),),
    "aten::scatter_reduce_": (Gap("scatter_reduce_", frozenset({"forward"}),
                                  "PyTorch's forward-mode derivative of scatter_reduce_(reduce='prod') is zero",
                                  _prod),),
    "aten::_cdist_forward": (Gap("cdist", frozenset({"batched_reverse"}), "vmap of PyTorch's cdist backward is wrong"),
                             Gap("cdist", frozenset({"forward"}), "PyTorch has no forward-mode derivative of cdist")),
    **{f"aten::{name}": (Gap(name, frozenset({"reverse_over_forward"}), _ROF.format(name)),)
       for name in ("native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
                    "_native_batch_norm_legit_no_training", "_linalg_det", "_linalg_slogdet", "_linalg_solve_ex",
                    "linalg_householder_product", "linalg_eig", "_safe_softmax", "cumprod")},
    **{f"torch_nn::{name}": (Gap(name, frozenset({"forward"}), f"PyTorch's forward-mode derivative of {name} is wrong"),)
       for name in ("_linear_cross_entropy_batch_chunked", "_linear_cross_entropy_vocab_chunked",
                    "_linear_cross_entropy_batch_chunked_no_reduction",
                    "_linear_cross_entropy_vocab_chunked_no_reduction")},
    "aten::embedding": (Gap("embedding", frozenset({"forward"}),
                            "PyTorch's reverse mode gives embedding's padding row a zero derivative, forward mode "
                            "does not", _padded),),
    # found with finite differences (tests/test_strided_storage.py): plain reverse mode is wrong too
    **{f"aten::{name}": (Gap(name, EVERY_MODE, _STRIDED.format(name), _window_reads_traced_storage_outside),)
       for name in ("as_strided", "as_strided_", "as_strided_copy")},
    "aten::as_strided_scatter": (Gap("as_strided_scatter", EVERY_MODE,
                                     "PyTorch's derivative of as_strided_scatter is "
                                     "wrong in every AD mode", _scatter_derivative_wrong),),
    # eigh reads one triangle; its backward is symmetrized, its JVP is not: the two modes disagree
    # on non-symmetric perturbations (found by tests/test_opinfo_evaluation.py); asd follows reverse
    "aten::_linalg_eigh": (Gap("linalg_eigh", frozenset({"forward"}),
                               "PyTorch's forward- and reverse-mode derivatives of eigh disagree (the reverse "
                               "one is symmetrized)"),),
}


def gaps_of(func: torch._ops.OpOverload, bound: Callable[[], dict]) -> tuple:
    """The gaps a call of ``func`` falls into; ``bound()`` gives its bound arguments (only
    computed for the ops of the table)."""
    entries = GAPS.get(func.overloadpacket._qualified_op_name)
    if not entries:
        return ()
    b = bound()
    return tuple(g for g in entries if g.applies(b))


def unsafe_modes(info) -> dict:
    """``{mode: reason}`` of the AD modes whose results would differ from what ``f`` computes,
    from a finished trace's :class:`~asd.detection.torch_tracer.TraceInfo` (``None``: no trace,
    nothing known)."""
    if info is None:
        return {}
    out: dict = {}
    for gap in sorted(info.gaps, key=lambda g: g.op):
        for mode in gap.modes:
            out.setdefault(mode, gap.reason)
    forward_reason = None
    if info.calls_autograd:
        forward_reason = ("f calls torch.autograd on its input, which forward-mode AD does not track (the "
                          "input has requires_grad=False under a JVP)")
    elif info.no_grad_cut:
        forward_reason = ("f computes from its input under torch.no_grad() (or detaches it): reverse mode "
                          "cuts those dependencies, forward-mode AD does not")
    if forward_reason is not None:
        for mode in ("forward", "reverse_over_forward", "forward_over_reverse"):
            out.setdefault(mode, forward_reason)
    return out
