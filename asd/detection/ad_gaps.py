"""PyTorch's own missing or wrong derivative formulas, by AD mode, and the modes a trace rules out.

Evaluation differentiates ``f`` with PyTorch's formulas; where one of them is wrong the sparse
result is wrong too, without a word. This table lists the (op, mode) pairs known to be wrong in
the PyTorch this package supports (found by ``tests/test_ad_gaps.py``, which checks each entry
against plain reverse-mode autograd and finite differences, by ``tests/test_fuzz.py``, and, for
the overwriting scatters, by an adversarial review: ``tests/test_duplicate_writes.py``). The
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

and ``reverse``, plain unbatched reverse mode (the autograd-loop backend's VJPs and double
backward), which is right where the others are wrong unless an entry names it. An entry that names
``reverse`` names every mode built on it too: with ``forward`` as well (:data:`EVERY_MODE`) no
evaluation is right; without it (an overwriting scatter with repeated indices) a Jacobian is still
right in forward mode, while a Hessian, whose products all differentiate a gradient, is not.
Prepared operators refuse what no mode gets right with an error naming the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch.utils._mode_utils import no_dispatch

from ._core import storage_positions, window_positions

__all__ = ["MODES", "EVERY_MODE", "Gap", "GAPS", "gaps_of", "refusal_fix", "unsafe_modes"]


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
    #: how to write the step so that PyTorch's derivative is right (said when asd refuses)
    fix: str = ""


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


def _known(t) -> torch.Tensor | None:
    """The values of an index argument (a traced tensor's primal), or ``None`` where they are
    unknown (computed from the input under global tracing)."""
    t = getattr(t, "primal", t)
    if not isinstance(t, torch.Tensor) or t.is_meta:
        return None
    return t.detach().cpu()


def _repeats(positions: torch.Tensor) -> bool:
    """Whether a non-negative index tensor holds a value twice (a mark per value: linear, no sort)."""
    flat = positions.reshape(-1)
    if flat.numel() < 2:
        return False
    seen = torch.zeros(int(flat.max()) + 1, dtype=torch.bool)
    seen[flat] = True
    return int(seen.sum()) != flat.numel()


def _ids(x) -> torch.Tensor:
    return torch.arange(x.numel(), dtype=torch.int64).reshape(tuple(x.shape))


def _writes_a_position_twice(bound: dict) -> bool:
    """An overwriting scatter (``index_put`` without ``accumulate``, ``scatter`` of ``src`` without
    ``reduce``, ``put``, ``index_copy``) whose source depends on the input writes one element from
    two source elements; indices whose values are unknown count as such a write."""
    source = next((bound[k] for k in ("values", "src", "source") if k in bound), None)
    if bound.get("accumulate") or bound.get("reduce") is not None or not _carries_sets(source):
        return False
    try:
        return _positions_repeat(bound)
    except Exception:  # noqa: BLE001 - indices the op itself refuses (out of range): its own error follows
        return True


def _cannot_repeat(bound: dict) -> bool:
    """Whether the indices' shapes and dtypes alone rule a repeat out (known under global tracing
    too): boolean masks, a single index, ``scatter`` with one index along its dim."""
    if "indices" in bound:
        given = [i for i in bound["indices"] if i is not None]
        if all(i.dtype in (torch.bool, torch.uint8) for i in given):
            return True  # masks select each position once
        if any(i.dtype in (torch.bool, torch.uint8) for i in given):
            return False
        return math.prod(torch.broadcast_shapes(*(tuple(i.shape) for i in given))) <= 1
    index = bound["index"]
    if "src" in bound:
        return index.dim() == 0 or index.shape[bound["dim"]] <= 1
    return index.numel() <= 1


def _positions_repeat(bound: dict) -> bool:
    if _cannot_repeat(bound):
        return False
    x = bound["self"]
    with no_dispatch():
        if "indices" in bound:  # index_put: the index tensors together select the positions written
            given = list(bound["indices"])
            indices = [None if i is None else _known(i) for i in given]
            if any(i is None and j is not None for i, j in zip(indices, given)):
                return True
            return _repeats(_ids(x)[tuple(slice(None) if i is None else i for i in indices)])
        index = _known(bound["index"])
        if index is None:
            return True
        if "src" in bound:  # scatter: self[index[i][j]][j] = src[i][j] (dim 0)
            return _repeats(torch.gather(_ids(x), bound["dim"], index))
        if "dim" in bound:  # index_copy: whole slices along dim
            return _repeats(index)
        return _repeats(index.remainder(max(x.numel(), 1)))  # put: flat positions, negative from the end


_DUPLICATE_FIX = ("Write each element once (indices without repeats), or add the repeated ones up "
                  "(index_put(..., accumulate=True), scatter_add, index_add) where that is what is meant; "
                  "indices computed from the input are unknown to global detection and count as repeated: "
                  "local=True reads them at the point.")
_STRIDED_FIX = "Write that step with ordinary indexing (slices, index_put_, scatter) on the tensor itself."
_DUPLICATE = ("PyTorch's reverse-mode derivative of {} with repeated (or unknown) indices gives the "
              "derivative of each element written to every source element aimed at it (forward mode follows "
              "the element written)")
_NOT_FORWARD = EVERY_MODE - {"forward"}

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
    **{f"aten::{name}": (Gap(name, EVERY_MODE, _STRIDED.format(name), _window_reads_traced_storage_outside,
                             _STRIDED_FIX),)
       for name in ("as_strided", "as_strided_", "as_strided_copy")},
    "aten::as_strided_scatter": (Gap("as_strided_scatter", EVERY_MODE,
                                     "PyTorch's derivative of as_strided_scatter is "
                                     "wrong in every AD mode", _scatter_derivative_wrong, _STRIDED_FIX),),
    # an element written twice keeps one source element, yet reverse mode hands its derivative to
    # every source element aimed at it (found by an adversarial review); forward mode follows the write
    **{f"aten::{name}": (Gap(name, _NOT_FORWARD, _DUPLICATE.format(name), _writes_a_position_twice,
                             _DUPLICATE_FIX),)
       for name in ("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put", "scatter", "scatter_",
                    "put", "put_", "index_copy", "index_copy_")},
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


def refusal_fix(info) -> str:
    """How to rewrite ``f`` (a finished trace's :class:`~asd.detection.torch_tracer.TraceInfo`)
    where plain reverse mode is wrong: the fix of the first such gap, by op name."""
    for gap in sorted(info.gaps, key=lambda g: g.op):
        if "reverse" in gap.modes and gap.fix:
            return gap.fix
    return ""


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
