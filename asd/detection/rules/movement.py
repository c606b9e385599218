"""Data movement, handled once, generically: run the op on id tensors and take rows.

Every differentiable tensor argument is replaced by a tensor of element ids (1-based, offset per
argument; 0 means "no input", so zero-filling ops such as ``tril`` or constant padding produce
empty sets), every ``Scalar`` argument by 0, and the op is run for real. Each output element then
names the one argument element it was copied from. Integer and boolean arguments (indices,
masks) are passed with their real values; under global tracing a selector whose values are
unknown makes the op a union: a mask (``where``, ``masked_fill``) selects either operand, and an
index computed from the input (``x[i, x.argmax(1)]``, ``scatter`` at an ``argmax``) is taken to be
any valid index along the dimension it addresses, with a warning (:func:`unknown_selection`).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from ...errors import TracingError, UnsupportedOpWarning
from .. import sets as S
from .._core import Call, TracedTensor, is_differentiable_dtype, storage_positions, window_positions
from ..table import aten_ops, register_rule
from .elementwise import broadcast_union
from .fallback import conservative
from .reductions import group_ids

aten = torch.ops.aten


def _is_data(a) -> bool:
    return isinstance(a, torch.Tensor) and is_differentiable_dtype(a.dtype)


_SCALAR_NAMES: dict = {}


def _scalar_arg_names(func) -> frozenset[str]:
    names = _SCALAR_NAMES.get(func)
    if names is None:
        # TorchScript prints the schema type ``Scalar`` as ``number``
        names = _SCALAR_NAMES[func] = frozenset(
            a.name for a in func._schema.arguments
            if str(a.type) in ("Scalar", "Optional[Scalar]", "number", "Optional[number]"))
    return names


def _id_call(call: Call, id_dtype: torch.dtype, data_value=None, subst: dict | None = None):
    """Run the op with id tensors in place of data tensors; returns (outputs, stacked sets).

    ``subst`` maps ``id(selector)`` to the values used for a selector whose values are unknown."""
    func = call.func
    scalar_names = _scalar_arg_names(func)
    schema_args = func._schema.arguments
    set_list = []
    offset = 0

    def ids_for(a):
        nonlocal offset
        s = call.sets(a) if isinstance(a, TracedTensor) else None
        shape = a.shape
        if s is None:
            return torch.zeros(shape, dtype=id_dtype)
        ids = torch.arange(offset + 1, offset + 1 + a.numel(), dtype=id_dtype).reshape(shape)
        offset += a.numel()
        set_list.append(s)
        return ids

    def select(a):
        if isinstance(a, TracedTensor):
            p = a.primal
        else:
            p = a
        if isinstance(p, torch.Tensor) and p.is_meta:
            if subst is not None and id(a) in subst:
                return subst[id(a)]
            raise _UnknownSelector(a)
        if isinstance(p, torch.Tensor) and p.device.type != "cpu":
            p = p.cpu()
        return p

    def tensor(a):
        return ids_for(a) if _is_data(a) else select(a)

    # not recursive: a closure that calls itself is a reference cycle, which would keep the call,
    # its tracer and every index set of the trace alive until the garbage collector runs
    def convert(name, a):
        if isinstance(a, torch.Tensor):
            return tensor(a)
        if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
            return type(a)(tensor(t) if isinstance(t, torch.Tensor) else t for t in a)  # Tensor[] / Tensor?[]
        if name in scalar_names and a is not None:
            return 0 if data_value is None else data_value
        return a

    args = [convert(schema_args[i].name if i < len(schema_args) else "", a) for i, a in enumerate(call.args)]
    kwargs = {k: convert(k, v) for k, v in call.kwargs.items()}
    out = call.func(*args, **kwargs)
    stacked = S.vstack(set_list) if set_list else None
    return out, stacked


class _UnknownSelector(Exception):
    def __init__(self, arg):
        self.arg = arg


def _id_rows(call: Call, out, stacked) -> list:
    """For each output: the row of ``stacked`` each of its elements copies (``-1``: none), or
    ``None`` where the output carries no sets."""
    tensors = [out] if isinstance(out, torch.Tensor) else [t for t in tree_flatten(out)[0]
                                                           if isinstance(t, torch.Tensor)]
    res = []
    for o, ids in zip(call.outs, tensors):
        if stacked is None or not is_differentiable_dtype(o.dtype):
            res.append(None)
            continue
        res.append(ids.reshape(-1).to(torch.int64).numpy() - 1)
    return res


# -- memo of the id runs ----------------------------------------------------------------------------
# An op run on ids gives the same rows whenever its arguments have the same shapes and Python values
# (a traced function repeats the same few calls, and traces of one function repeat them all): the
# rows are kept under a key made of exactly what :func:`_id_call` reads - the op, each data tensor's
# shape, dtype and whether it carries sets, every other argument's Python value and type. Calls with
# a tensor whose values matter (an index, a mask) or any other object are not memoized.

#: most elements of one memoized row array, and of all of them together (the memo is emptied then)
MEMO_MAX_ELEMENTS = 1 << 18
MEMO_TOTAL_ELEMENTS = 1 << 21
_MEMO: dict = {}
_MEMO_SIZE = [0]
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _NoKey(Exception):
    pass


def _arg_key(call: Call, a):
    if _is_data(a):
        return ("D", tuple(a.shape), a.dtype, isinstance(a, TracedTensor) and call.sets(a) is not None)
    if isinstance(a, torch.Tensor):
        raise _NoKey  # a selector: its values decide
    if isinstance(a, (list, tuple)):
        return (type(a), tuple([_arg_key(call, t) for t in a]))
    if type(a) in _PLAIN:
        return (type(a), a)
    raise _NoKey


_SEEDED: dict = {}


def _memo_key(call: Call):
    """The key of ``call``'s run on ids (see above), or ``None``."""
    func = call.func
    seeded = _SEEDED.get(func)
    if seeded is None:
        seeded = _SEEDED[func] = torch.Tag.nondeterministic_seeded in func.tags
    if seeded:
        return None
    try:
        return (func, tuple([_arg_key(call, a) for a in call.args]),
                tuple([(k, _arg_key(call, v)) for k, v in call.kwargs.items()]))
    except _NoKey:
        return None


def remembered(key) -> list | None:
    """The rows kept under ``key`` (:func:`remember`), or ``None``."""
    return _MEMO.get(key)


def remember(key, rows: list) -> None:
    """Keep ``rows`` (a list of row arrays, made read-only) under ``key``, within the memo's bounds;
    the tracer's shortcut for ``roll``/``flip``/``clone`` keeps its rows here too."""
    # every entry and every array counts (an array's header is worth ~16 int64 elements)
    size = 16 + sum(16 + (r.size if r is not None else 0) for r in rows)
    if size > MEMO_MAX_ELEMENTS:
        return
    for r in rows:
        if r is not None:
            r.flags.writeable = False
    if _MEMO_SIZE[0] + size > MEMO_TOTAL_ELEMENTS:
        _MEMO.clear()
        _MEMO_SIZE[0] = 0
    _MEMO[key] = rows
    _MEMO_SIZE[0] += size


def clear_memo() -> None:
    """Forget the memoized id runs."""
    _MEMO.clear()
    _MEMO_SIZE[0] = 0


def _collect_sets(call: Call, a, set_list: list) -> None:
    # a module function, not a closure calling itself: that would be a reference cycle holding the
    # call (and with it the tracer and every index set of the trace) until the garbage collector runs
    if _is_data(a):
        s = call.sets(a) if isinstance(a, TracedTensor) else None
        if s is not None:
            set_list.append(s)
    elif isinstance(a, (list, tuple)):
        for t in a:
            _collect_sets(call, t, set_list)


def _stacked_sets(call: Call):
    """The sets of the data arguments, stacked in the order :func:`_id_call` numbers them."""
    set_list: list = []
    for a in (*call.args, *call.kwargs.values()):
        _collect_sets(call, a, set_list)
    return S.vstack(set_list) if set_list else None


def run_on_ids(call: Call, subst: dict | None = None):
    """Output sets of a pure data-movement op, or ``None`` if the op cannot run on ids."""
    key = _memo_key(call) if subst is None else None
    if key is not None:
        rows = _MEMO.get(key)
        if rows is not None:
            stacked = _stacked_sets(call)
            return [None if r is None or stacked is None else S.take_rows(stacked, r) for r in rows]
    for dtype in (torch.int64, torch.float64):
        try:
            out, stacked = _id_call(call, dtype, subst=subst)
        except _UnknownSelector:
            raise
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        rows = _id_rows(call, out, stacked)
        if key is not None:
            remember(key, rows)
        return [None if r is None else S.take_rows(stacked, r) for r in rows]
    return None


def movement(call: Call) -> list:
    """Rule for ops that only copy elements, selectors known (else: data-dependent indexing error)."""
    try:
        res = run_on_ids(call)
    except _UnknownSelector:
        return unknown_selection(call)
    if res is None:
        call.unsupported()
        return conservative(call)
    return res


#: most index values enumerated for the selectors of one op with unknown indices
MAX_CHOICES = 4096


def _is_unknown(t) -> bool:
    p = t.primal if isinstance(t, TracedTensor) else t
    return isinstance(p, torch.Tensor) and p.is_meta and not is_differentiable_dtype(p.dtype)


def selector_ranges(call: Call) -> list[tuple[torch.Tensor, int]] | None:
    """The index arguments of ``call`` whose values are unknown, each with the number of values it
    can take (the size of the dimension it addresses), or ``None`` when an unknown selector is not
    an index into a known dimension (a boolean mask)."""
    b = call.bound()
    name = call.func.overloadpacket.__name__.strip("_")
    x = b.get("self", b.get("weight"))
    found: list[tuple[torch.Tensor, int]] = []
    if name in ("index", "index_put", "index_put_impl", "unsafe_masked_index"):
        for i, t in enumerate(b["indices"]):
            if t is not None and _is_unknown(t):
                if t.dtype in (torch.bool, torch.uint8):
                    return None
                found.append((t, x.shape[i]))
    elif name in ("take", "put"):
        found.append((b["index"], x.numel()))
    elif name == "take_along_dim":
        d = b.get("dim")
        found.append((b["indices"], x.numel() if d is None else x.shape[d]))
    elif name == "embedding":
        found.append((b["indices"], b["weight"].shape[0]))
    elif "dim" in b and isinstance(b.get("index"), torch.Tensor):
        found.append((b["index"], x.shape[b["dim"]] if x.dim() else 1))
    found = [(t, r) for t, r in found if _is_unknown(t)]
    tensors = [t for t in tree_flatten((call.args, call.kwargs))[0] if isinstance(t, torch.Tensor)]
    if sum(_is_unknown(t) for t in tensors) != len(found):
        return None
    return found


def index_choices(call: Call) -> list[dict] | None:
    """Substitutions (``id(selector) -> values``) that give every unknown index each value it can
    take, one constant at a time (their product over several selectors), or ``None`` when there are
    more than :data:`MAX_CHOICES` or an unknown selector is no index."""
    ranges = selector_ranges(call)
    if not ranges or int(np.prod([max(r, 1) for _, r in ranges])) > MAX_CHOICES:
        return None
    choices = []
    for values in itertools.product(*[range(max(r, 1)) for _, r in ranges]):
        choices.append({id(t): torch.full(tuple(t.shape), v, dtype=t.dtype) for (t, _), v in zip(ranges, values)})
    return choices


def warn_unknown_indices(call: Call) -> None:
    warnings.warn(
        f"asd: {call.func} indexes with values computed from the input, unknown under global tracing; "
        "every valid index is assumed (a sound but denser pattern). Pass local=True for the pattern "
        "at a point.", UnsupportedOpWarning, stacklevel=2)


def unknown_selection(call: Call) -> list:
    """Indices computed from the input (unknown under global tracing): the output shape is known,
    and each unknown index may take any value along the dimension it addresses, so an output element
    depends on every element it could select: the union of the patterns over those values.
    Selectors that are no index, or too many choices, fall back to the conservative rule."""
    warn_unknown_indices(call)
    b = call.bound()
    name = call.func.overloadpacket.__name__
    if name in ("gather", "take_along_dim") and b.get("dim") is not None:
        return _along_dim_union(call, b)
    choices = index_choices(call)
    if choices is None:
        return conservative(call)
    results = [run_on_ids(call, subst) for subst in choices]
    if any(r is None for r in results):
        return conservative(call)
    return [None if parts[0] is None else S.union(list(parts), o.numel(), call.n)
            for o, parts in zip(call.outs, zip(*results))]


def _along_dim_union(call: Call, b: dict) -> list:
    """gather / take_along_dim at unknown positions: the union over ``dim``, in one step."""
    x = b["self"]
    s = call.sets(x)
    if s is None:
        return [None] * len(call.outs)
    d = b["dim"] % max(x.dim(), 1)
    groups, ngroups = group_ids(tuple(x.shape), [d])
    u = S.gather_union(s, groups, np.arange(x.numel()), ngroups)
    out = call.outs[0]
    oshape = list(out.shape)
    kept = [1 if i == d else sz for i, sz in enumerate(x.shape)]
    # output position -> group of the same coordinates outside ``dim`` (index may be smaller)
    pos = torch.arange(ngroups, dtype=torch.int64).reshape(kept)
    idx = [torch.arange(oshape[i]) if i != d else torch.zeros(1, dtype=torch.int64) for i in range(len(oshape))]
    og = pos[torch.meshgrid(*idx, indexing="ij")] if oshape else pos
    og = og.expand(oshape).reshape(-1).numpy()
    return [S.take_rows(u, og)] + [None] * (len(call.outs) - 1)


def selection(call: Call) -> list:
    """Rule for ops choosing between data by a mask (where, masked_fill): union when unknown."""
    try:
        res = run_on_ids(call)
    except (_UnknownSelector, IndexError):  # unknown mask, or operands whose ids do not line up
        res = None
    if res is None:
        return broadcast_union(call)
    return res


def view_ids(call: Call, base: TracedTensor) -> list[np.ndarray] | None:
    """For a view op, the base element each output element refers to (0-based, per output)."""
    func = call.func
    if func in _STRIDED_VIEWS:
        return None  # storage positions, not the base's elements: see storage_view_rows
    if func is aten.view_as_real.default:
        return [np.repeat(np.arange(base.numel(), dtype=np.int64), 2)]
    if func is aten.view_as_complex.default:
        return None  # each complex element reads two real ones: a copy (see ``complex_pairs``)
    key = _view_key(call, base)
    if key is not None:
        hit = _MEMO.get(key)
        if hit is not None:
            return hit
    ids_in = torch.arange(base.numel(), dtype=torch.int64).reshape(base.shape)

    def convert(a):
        if a is base:
            return ids_in
        if isinstance(a, TracedTensor):
            return a.primal
        return a

    args = [convert(a) for a in call.args]
    kwargs = {k: convert(v) for k, v in call.kwargs.items()}
    try:
        out = func(*args, **kwargs)
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    flat = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
    # ``to(dtype)`` aliases its input when the dtype already matches, and converts the ids with it;
    # the ids are copied out of ``ids_in`` (a view op returns views of it)
    ids = [np.array(t.reshape(-1).to(torch.int64).numpy()) for t in flat if isinstance(t, torch.Tensor)]
    if key is not None:
        remember(key, ids)
    return ids


def _view_arg_key(a, base: TracedTensor):
    if a is base:
        return ("B", tuple(base.shape), base.dtype)
    if isinstance(a, torch.Tensor):
        raise _NoKey
    if isinstance(a, (list, tuple)):
        return (type(a), tuple(_view_arg_key(t, base) for t in a))
    if type(a) in _PLAIN:
        return (type(a), a)
    raise _NoKey


def _view_key(call: Call, base: TracedTensor):
    """The memo key of a view op's ids (see :func:`_memo_key`): the op, the base's shape and every
    other argument's Python value; ``None`` where another tensor is passed."""
    try:
        return ("view", call.func, tuple(_view_arg_key(a, base) for a in call.args),
                tuple((k, _view_arg_key(v, base)) for k, v in call.kwargs.items()))
    except _NoKey:
        return None


MOVEMENT_OPS = aten_ops(
    "clone", "copy", "copy_", "cat", "stack", "hstack", "vstack", "dstack", "roll", "flip", "rot90",
    "repeat", "tril", "tril_", "triu", "triu_", "constant_pad_nd", "reflection_pad1d",
    "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d", "_pad_circular", "_unsafe_view", "view_copy", "permute_copy", "expand_copy",
    "t_copy", "transpose_copy", "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy",
    "diagonal_copy", "unfold_copy", "alias_copy", "narrow_copy", "unbind_copy", "split_copy",
    "split_with_sizes_copy", "detach_copy", "index", "index_select", "gather",
    "take", "take_along_dim", "masked_select", "index_fill", "index_fill_",
    "index_copy", "index_copy_", "slice_scatter", "select_scatter", "diagonal_scatter",
    "masked_scatter", "masked_scatter_", "diag_embed", "diag", "block_diag",
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "im2col",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "repeat_interleave", "fill", "fill_",
    "zero_", "unfold", "lift_fresh_copy", "_reshape_copy", "flatten",
    "movedim", "moveaxis", "narrow", "tile", "ravel", "swapaxes", "swapdims",
    "embedding", "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",
    optional=["_unsafe_masked_index"],  # torch >= 2.5
)

register_rule(MOVEMENT_OPS, movement, second_order="linear", family="movement")


# -- ops that address their input's storage ----------------------------------------------------------
# ``as_strided_copy`` and ``as_strided_scatter`` count positions from the storage of ``self``, not
# from its first element: on a view (an offset, other strides) they read or write elements outside it.
# Running them on ids of ``self``'s own elements (as the movement rule does) would name other elements.

_STRIDED_VIEWS = (aten.as_strided.default, aten.as_strided_.default)


def _window_rows(x: TracedTensor, positions: np.ndarray) -> np.ndarray:
    """Rows of ``x``'s storage sets at ``positions``; :class:`TracingError` where they are not all
    elements of the traced storage (a reinterpreting view such as ``view_as_real``, or a window
    reaching memory the trace does not know), rather than an unsound guess."""
    storage = x._storage
    if x.element_size() != storage.geometry[3]:
        raise TracingError("as_strided (or as_strided_copy / as_strided_scatter) on a view whose element size "
                           "differs from its storage's (view_as_real, view_as_complex) cannot be traced")
    rows = storage.rows_at(positions)
    if rows is None:
        raise TracingError("an as_strided window reaches memory outside the traced tensor's storage; take the "
                           "window from the tensor that owns that memory")
    return rows


def storage_view_rows(call: Call, base: TracedTensor) -> np.ndarray | None:
    """For ``as_strided`` (or ``as_strided_``) of ``base``: the row of ``base``'s storage sets each
    output element refers to, wherever ``base`` starts (the window may leave ``base``'s elements);
    ``None`` for other ops, and for a window off a constant's storage that reaches memory the trace
    does not know."""
    if call.func not in _STRIDED_VIEWS:
        return None
    if base._storage.sets.nnz == 0:
        # a constant's storage: still an alias where the window lies in it (a write through the
        # window reaches the constant: it was dropped, a silently empty pattern); a window beyond
        # the memory the trace knows (a captured view of a larger constant) reads constants: a copy
        storage = base._storage
        if base.element_size() != storage.geometry[3]:
            return None
        return storage.rows_at(window_positions(call.bound(), base))
    return _window_rows(base, window_positions(call.bound(), base))


def as_strided_copy_rule(call: Call) -> list:
    """``as_strided_copy(self, size, stride, storage_offset)``: element ``k`` copies the storage
    element at position ``storage_offset + sum(i_d * stride_d)``, wherever ``self`` starts."""
    b = call.bound()
    x, out = b["self"], call.outs[0]
    if (not isinstance(x, TracedTensor) or not is_differentiable_dtype(out.dtype) or call.tracer.detached(x)
            or x._storage.sets.nnz == 0):
        return [None]
    return [S.take_rows(x._storage.sets, _window_rows(x, window_positions(b, x)))]


def as_strided_scatter_rule(call: Call) -> list:
    """``as_strided_scatter(self, src, size, stride, storage_offset)``: a copy of ``self`` (same
    geometry) whose elements at the storage positions the strided window addresses take ``src``'s
    elements; every other element keeps ``self``'s."""
    b = call.bound()
    x, src = b["self"], b["src"]
    out = call.outs[0]
    xs, ss = call.sets(x), call.sets(src)
    if (xs is None and ss is None) or not is_differentiable_dtype(out.dtype):
        return [None]
    m, k = x.numel(), src.numel()
    q = storage_positions(x.shape, x.stride(), x.storage_offset())  # where self's elements live
    p = window_positions(b, x)  # where src's elements go
    if len(np.unique(q)) != q.size:  # self's elements overlap: any of them may be any write
        parts = [S.full_row(s) for s in (xs, ss) if s is not None]
        return [S.take_rows(S.union(parts, 1, call.n), np.zeros(out.numel(), dtype=np.int64))]
    top = int(max(q.max() if q.size else 0, p.max() if p.size else 0)) + 1
    element = np.full(top, -1, dtype=np.int64)
    element[q] = np.arange(m, dtype=np.int64)
    target = element[p]  # the element of self that src's element k overwrites (-1: outside self)
    written = np.zeros(m, dtype=bool)
    written[target[target >= 0]] = True
    kept = np.flatnonzero(~written)
    hit = np.flatnonzero(target >= 0)
    stacked = S.vstack([xs if xs is not None else S.empty(m, call.n), ss if ss is not None else S.empty(k, call.n)])
    # a position written twice (an overlapping window) may hold any of its writes: all of them
    rows = np.concatenate([kept, target[hit]])
    cols = np.concatenate([kept, m + hit])
    return [S.gather_union(stacked, rows, cols, m)]


register_rule(aten_ops("as_strided_copy"), as_strided_copy_rule, second_order="linear", family="movement")
register_rule(aten_ops("as_strided_scatter"), as_strided_scatter_rule, second_order="linear", family="movement")
register_rule(aten_ops("where", "masked_fill", "masked_fill_"), selection, second_order="linear",
              family="movement")


# -- accumulating scatters: the target keeps its sets and gains those of every source element -------

def _positions(shape) -> torch.Tensor:
    return torch.arange(int(np.prod(shape)) if len(shape) else 1, dtype=torch.int64).reshape(shape)


def _values(t, subst: dict):
    """The values of selector ``t``: its own, or the substitute for unknown ones."""
    p = t.primal if isinstance(t, TracedTensor) else t
    if isinstance(p, torch.Tensor) and p.is_meta:
        return subst[id(t)]
    return p.cpu() if isinstance(p, torch.Tensor) else p


def _write_map(b: dict, name: str, subst: dict):
    """(source, target position of each written element, source element of each) of a scatter-like
    op; the source ids are ``None`` for a scalar source."""
    pos = _positions(tuple(b["self"].shape))
    if name in ("index_add", "index_reduce"):
        src = b["source"]
        return src, torch.index_select(pos, b["dim"], _values(b["index"], subst)), _positions(tuple(src.shape))
    if name in ("scatter_add", "scatter_reduce", "scatter"):
        src = b.get("src")
        index = _values(b["index"], subst)
        tgt = torch.gather(pos, b["dim"], index)
        if src is None or not isinstance(src, torch.Tensor):  # scatter.value_reduce: a scalar source
            return src, tgt, None
        return src, tgt, _positions(tuple(src.shape))[tuple(slice(0, s) for s in index.shape)]
    if name == "index_put":
        src = b["values"]
        # ATen's None index is a whole dimension (``x[:, idx]``), not Python's new axis
        tgt = pos[tuple(_values(i, subst) if i is not None else slice(None) for i in b["indices"])]
        return src, tgt, _positions(tuple(src.shape)).broadcast_to(tgt.shape)
    src = b["source"]  # put
    return src, pos.reshape(-1)[_values(b["index"], subst).reshape(-1)], _positions(tuple(src.shape)).reshape(-1)


def accumulate(call: Call) -> list:
    """index_add, scatter_add, scatter_reduce, index_reduce, put and index_put (accumulating or not),
    scatter (with or without ``reduce``). Overwriting writes with distinct targets are pure movement.
    Indices computed from the input (unknown under global tracing) may take any value: the union
    over every choice, and the target keeps its own sets (it may not be written)."""
    b = call.bound()
    name = call.func.overloadpacket.__name__.strip("_").replace("index_put_impl", "index_put")
    overwrite = ((name in ("index_put", "put") and not b.get("accumulate"))
                 or (name == "scatter" and b.get("reduce") is None))
    if overwrite and (name == "scatter" and not isinstance(b.get("src"), torch.Tensor)):
        return movement(call)
    unknown = selector_ranges(call)
    if unknown is None or unknown:
        warn_unknown_indices(call)
        choices = index_choices(call)
        if choices is None:
            return conservative(call)
    else:
        choices = [{}]
    maps = [_write_map(b, name, subst) for subst in choices]
    src = maps[0][0]
    if overwrite and not unknown:
        tgt = maps[0][1]
        if len(np.unique(tgt.reshape(-1).numpy())) == tgt.numel():
            return movement(call)
        # Several writes to one place: the value keeps one of them (which one is unspecified) and
        # reverse mode credits all of them, so the written element depends on every source.
    out = call.outs[0]
    self_ = b["self"]
    parts = []
    s_self = call.sets(self_)
    include_self = False if overwrite else b.get("include_self", True)
    if s_self is not None:
        if include_self is False and not unknown:
            keep = np.arange(self_.numel())
            keep[np.unique(maps[0][1].reshape(-1).numpy())] = -1
            s_self = S.take_rows(s_self, keep)
        parts.append(s_self)
    s_src = call.sets(src) if maps[0][2] is not None else None
    if s_src is not None:
        tgt = np.concatenate([m[1].reshape(-1).numpy() for m in maps])
        src_ids = np.concatenate([m[2].reshape(-1).numpy() for m in maps])
        parts.append(S.gather_union(s_src, tgt, src_ids, out.numel()))
    return [S.union(parts, out.numel(), call.n)]


register_rule(aten_ops("index_add", "index_add_", "scatter_add", "scatter_add_", "index_put", "index_put_",
                       "_index_put_impl_", "put", "put_")
              + [aten.scatter.src, aten.scatter.value, aten.scatter.src_out, aten.scatter.value_out,
                 aten.scatter_.src, aten.scatter_.value],
              accumulate, second_order="linear", family="movement")
# the reduction modes may multiply (prod); the sum, mean, amax and amin modes alone would be linear
register_rule(aten_ops("scatter_reduce", "scatter_reduce_", "index_reduce", "index_reduce_")
              + [aten.scatter.reduce, aten.scatter.value_reduce, aten.scatter.reduce_out,
                 aten.scatter.value_reduce_out, aten.scatter_.reduce, aten.scatter_.value_reduce],
              accumulate, second_order="nonlinear", family="movement")


# -- complex views: (..., 2) real pairs <-> complex elements -------------------------------------------

def complex_pairs(call: Call) -> list:
    """``view_as_complex``: each complex element depends on its real pair (a copy, not a view)."""
    s = call.sets(call.args[0])
    if s is None:
        return [None]
    m = call.outs[0].numel()
    return [S.gather_union(s, np.repeat(np.arange(m), 2), np.arange(2 * m), m)]


def real_pairs(call: Call) -> list:
    s = call.sets(call.args[0])
    return [None if s is None else S.take_rows(s, np.repeat(np.arange(call.args[0].numel()), 2))]


register_rule(aten.view_as_complex, complex_pairs, second_order="linear", family="movement")
register_rule(aten.view_as_real, real_pairs, second_order="linear", family="movement")
