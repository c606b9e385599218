"""Traced evaluation: the batched products recorded once as a graph of ATen operations.

``torch.func``'s transforms cost tens of microseconds of Python and batching-rule work per
operation on every call. After a prepared operator's first calls, :class:`Tracing` records the
batched products with ``make_fx`` into a graph of plain ATen operations (the same operations, so
the same bits) and runs that graph instead. A graph bakes in the Python values ``f`` read while it
was recorded and holds its tensors by reference, so every call first compares a value fingerprint
of ``f`` and its extra arguments (:func:`asd.cache.value_fingerprint`, revalidated without walking
``f`` again by :class:`asd.cache.ValueGuard` while nothing it read changed) with the recorded one: a
change drops the graph (and after :data:`MAX_MISSES` changes tracing stops for good). Tracing is
only used when that fingerprint is complete - nothing ``f`` reads is summarized by identity alone -
and the operator's pattern holds everywhere (not ``local=True``, not a user ``pattern=``).
"""

from __future__ import annotations

import operator
import time
import weakref
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import AsdError

__all__ = ["Tracing", "CALLS_BEFORE_TRACING", "MAX_MISSES", "under_transform", "inside_transform"]


class _NoPythonNumbers(TorchDispatchMode):
    """Refuses a tensor read as a Python number (``.item()``, ``float()``) while the products are
    recorded: the graph would keep the number while the tensor changes. Notes the tensors whose
    values an output's shape follows (``w.nonzero()``, ``x[w > 0]``): a size read from that shape
    (``k = (w > 0).nonzero().shape[0]``) is kept in the graph as well, so the graph holds only while
    they are not written (:meth:`Tracing._shapes_hold`). Those are the tensors the recording did not
    compute itself (``w``, not the mask ``w > 0``, which the graph computes anew at every call)."""

    def __init__(self):
        super().__init__()
        #: ``(weak reference, version, copy)`` of every tensor such a shape followed
        self.shape_sources: list = []
        #: ``id(t) -> (weak reference to t, sources)`` for each tensor ``t`` the recording computed: the
        #: tensors it did not compute that ``t`` was computed from (by identity: a tensor's == is elementwise)
        self._sources: dict = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # otherwise TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose first
        # call imports torch._dynamo (2-3 s of a fresh process); nothing here is ever compiled
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _returns_a_value(func):
            raise RuntimeError(f"f reads tensor values as a Python number or bool ({func}: .item(), float(), "
                               "torch.equal, torch.allclose, ...): a recorded graph would keep that value")
        sources: dict = {}
        for t in (*args, *kwargs.values()):
            for u in (t if isinstance(t, (list, tuple)) else (t,)):
                if isinstance(u, torch.Tensor):
                    entry = self._sources.get(id(u))
                    if entry is None or entry[0]() is not u:
                        sources[id(u)] = (weakref.ref(u), u._version)
                    else:
                        sources.update(entry[1])
        if func in _DATA_SHAPED and _data_shaped(func, args, kwargs):
            # their contents too: a write through .data moves no version counter
            self.shape_sources.extend((ref, version, _snapshot(ref())) for ref, version in sources.values())
        out = func(*args, **kwargs)
        for o in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(o, torch.Tensor) and not any(o is u for u in (*args, *kwargs.values())):
                self._sources[id(o)] = (weakref.ref(o), sources)
        return out


#: ops that answer a bool from a tensor's layout, never its values
_LAYOUT_ANSWERS = frozenset({"is_same_size", "is_coalesced", "is_pinned", "is_contiguous", "is_non_overlapping_and_dense",
                             "is_strides_like_format", "is_complex", "is_floating_point", "is_signed", "is_set_to",
                             "is_conj", "is_neg", "is_inference", "_is_zerotensor", "_has_same_storage_numel",
                             "_has_compatible_shallow_copy_type", "is_leaf", "is_vulkan_available"})
_RETURNS_A_VALUE: dict = {}


def _returns_a_value(func) -> bool:
    """Whether an op hands back a Python bool or number computed from its tensors' values
    (``_local_scalar_dense``, ``equal``, ``allclose``, ``is_nonzero``): a recorded graph would keep it."""
    known = _RETURNS_A_VALUE.get(func)
    if known is None:
        try:
            returns = [str(r.type) for r in func._schema.returns]
            takes_tensor = any("Tensor" in str(a.type) for a in func._schema.arguments)
            name = func._schema.name.split("::")[-1]
        except AttributeError:
            returns, takes_tensor, name = [], False, ""
        known = _RETURNS_A_VALUE[func] = (
            takes_tensor and name not in _LAYOUT_ANSWERS
            and any(k in t for t in returns for k in ("bool", "float", "complex", "Scalar", "number")))
    return known


#: ops whose output shape (or a size read from it) follows the values of their tensor arguments
_DATA_SHAPED = frozenset(getattr(packet, o) for packet in (
    torch.ops.aten.nonzero, torch.ops.aten.masked_select, torch.ops.aten._unique, torch.ops.aten._unique2,
    torch.ops.aten.unique_dim, torch.ops.aten.unique_consecutive, torch.ops.aten.bincount,
    torch.ops.aten.repeat_interleave, torch.ops.aten.one_hot, torch.ops.aten.index, *(
        getattr(torch.ops.aten, n) for n in ("_to_sparse", "_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr",
                                             "_to_sparse_bsc", "to_sparse", "to_sparse_csr", "to_sparse_csc",
                                             "to_sparse_bsr", "to_sparse_bsc", "sparse_mask")
        if hasattr(torch.ops.aten, n)))
    for o in packet.overloads())


def _snapshot(t: torch.Tensor | None) -> torch.Tensor | None:
    """A private copy of a shape source's values (``None`` for a tensor without plain storage)."""
    if t is None or t.layout != torch.strided or t.device.type == "meta":
        return None
    with torch.no_grad():
        return t.detach().clone()


def _same_contents(t: torch.Tensor, copy: torch.Tensor | None) -> bool:
    """Whether ``t`` holds ``copy``'s bits; ``False`` where there is no copy to compare (the graph
    is recorded anew)."""
    from .replay import _same

    return copy is not None and t.device == copy.device and _same(t.detach(), copy)


def _data_shaped(func, args, kwargs) -> bool:
    """Whether this call of an op of :data:`_DATA_SHAPED` takes its output shape from values:
    indexing only with a boolean mask, ``one_hot`` only without ``num_classes``, ``repeat_interleave``
    only with tensor repeats."""
    packet = func.overloadpacket
    if packet is torch.ops.aten.index:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if packet is torch.ops.aten.one_hot:
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        return classes == -1
    if packet is torch.ops.aten.repeat_interleave:
        if kwargs.get("output_size") is not None:
            return False
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) or (len(args) == 1 and "repeats" not in kwargs)
    return True


#: the descriptors of ``Tensor.grad`` (their ``__get__`` is what a torch function mode sees)
_GRAD_ATTRIBUTES = tuple(d for d in (torch._C.TensorBase.__dict__.get(n) for n in ("grad", "_grad")) if d is not None)

_HOST_READS = frozenset(getattr(cls, n) for cls in (torch.Tensor, torch._C.TensorBase)
                        for n in ("tolist", "numpy", "__array__", "__dlpack__", "data_ptr", "untyped_storage",
                                  "storage")
                        if hasattr(cls, n))
#: properties that hand a tensor's memory to another library (cupy, Numba's CUDA arrays): their
#: ``__get__`` is what a torch function mode sees
_HOST_PROPERTIES = tuple(d for d in (torch.Tensor.__dict__.get(n) for n in ("__cuda_array_interface__",))
                         if d is not None)


class _NoHostReads(TorchFunctionMode):
    """Refuses, while the products are recorded, the reads of a tensor's memory that bypass
    dispatch (``.tolist()``, ``.numpy()``, ``np.asarray``): their values would be kept too."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        owner = getattr(func, "__self__", None)
        prop = next((d for d in _HOST_PROPERTIES if owner is d), None)
        if prop is not None and not (args and isinstance(args[0], torch.Tensor) and args[0].is_cuda):
            prop = None  # (elsewhere the property raises AttributeError: hasattr() answers False, as without the mode)
        if func in _HOST_READS or prop is not None:
            name = prop.fget.__name__ if prop is not None else getattr(func, "__name__", func)
            raise RuntimeError(f"f reads a tensor's memory outside PyTorch's operations ({name}): "
                               "a recorded graph would keep those values")
        if any(owner is d for d in _GRAD_ATTRIBUTES):
            raise RuntimeError("f reads a tensor's .grad: a recorded graph would keep that tensor after a "
                               "backward pass (or zero_grad) replaces it")
        return func(*args, **(kwargs or {}))


#: calls evaluated through torch.func before the products are recorded: recording costs tens of
#: eager calls (0.5 s for the cart-pole Hessian, whose IPOPT solve makes about 15 calls and took
#: 1.4 s with recording after 2 or 10 calls, 0.57 s without), so only operators in long loops pay it
CALLS_BEFORE_TRACING = 50
#: fingerprint changes after which the operator stops tracing
MAX_MISSES = 2


def _outside_graphs(x: torch.Tensor) -> bool:
    """Whether this call runs without recorded graphs: under autocast (its casts would be recorded
    and then replayed outside it; ``asd.operators.check_context`` warns there), with a global
    module hook registered (``torch.nn.modules.module.register_module_forward_hook``: what it does
    is not part of the graph's guard), or under a mode of the caller's (:func:`_caller_modes`)."""
    if torch.is_autocast_enabled("cpu") or (x.device.type != "cpu" and torch.is_autocast_enabled(x.device.type)):
        return True
    return any(_GLOBAL_MODULE_HOOKS) or _caller_modes()


def _caller_modes() -> bool:
    """Whether a ``TorchFunctionMode`` or ``TorchDispatchMode`` is active (``make_fx``'s and
    FakeTensor's among them): it may change what ``f`` computes at every call, while a recorded
    graph replays the ops ``f`` ran at the recording, without the mode. PyTorch's default-device
    mode (``torch.set_default_device``, ``with torch.device(...)``) only sets the device of the
    tensors ``f`` creates: the operator's guard watches the default device instead."""
    for i in range(torch._C._len_torch_function_stack()):
        if type(torch._C._get_function_stack_at(i)) is not DeviceContext:
            return True
    return torch._C._len_torch_dispatch_stack() > 0


#: the global hook dicts of ``torch.nn.Module`` (each non-empty while a global hook is registered)
_GLOBAL_MODULE_HOOKS = tuple(
    d for d in (getattr(torch.nn.modules.module, n, None) for n in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks",
        "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called"))
    if isinstance(d, dict))


def default_device() -> torch.device | None:
    """The device ``torch.set_default_device`` / ``with torch.device(...)`` sets (``None``: none is
    set): what ``torch.get_default_device`` reads, without its cost (8 us)."""
    for i in range(torch._C._len_torch_function_stack() - 1, -1, -1):
        mode = torch._C._get_function_stack_at(i)
        if type(mode) is DeviceContext:
            return mode.device
    return None


def under_transform(x: torch.Tensor) -> bool:
    """Whether this call runs inside a ``torch.func`` transform (``jacrev``, ``vmap``, ...), at a
    forward-mode AD level, or on a tensor a transform wrapped. Such a call is evaluated by the
    plain transforms, which carry the tangents and batches through: a graph recorded there would
    hold the transform's wrapped tensors (the products of this very point among them) as constants
    and answer every later point with them; a replayed one gathers with Numba (no tangent), and
    compiled kernels and the lean path read storage that wrapped tensors do not have."""
    return (torch._C._functorch.peek_interpreter_stack() is not None
            or torch.autograd.forward_ad._current_level >= 0
            or torch._C._functorch.is_functorch_wrapped_tensor(x))


def inside_transform(x: torch.Tensor) -> bool:
    """Whether this thread's call certainly runs inside a ``torch.func`` transform or
    differentiates ``x`` in forward mode: functorch's interpreter stack (the thread's own), a
    wrapped ``x``, or an ``x`` that carries a tangent. Forward-mode AD's level is the process's
    (another thread's ``dual_level`` - asd's own cross-mode check among them - sets it), so it
    alone decides nothing here: :func:`under_transform` takes it as a reason to evaluate by the
    transforms, never as one to refuse a call."""
    return (torch._C._functorch.peek_interpreter_stack() is not None
            or torch._C._functorch.is_functorch_wrapped_tensor(x)
            or (torch.autograd.forward_ad._current_level >= 0
                and torch.autograd.forward_ad.unpack_dual(x).tangent is not None))


def _rng_state(x: torch.Tensor) -> tuple:
    """The random-number state ``f``'s random ops draw from on ``x``'s device (and the CPU's)."""
    cuda = torch.cuda.get_rng_state(x.device) if x.device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _same_rng_state(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and (a[1] is None) == (b[1] is None) and (a[1] is None or torch.equal(a[1], b[1]))


def _set_rng_state(x: torch.Tensor, state: tuple) -> None:
    """Set the generators back to ``state`` (not where it is their state still). The generators
    are the process's: a thread that drew since draws the same numbers again, so callers set them
    back only where ``f`` draws, or on the rare paths (a retry, a recording) that must."""
    if _same_rng_state(_rng_state(x), state):
        return
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, x.device)


def _reason(exc: BaseException) -> str:
    """``"Type: first line of the message"`` (an exception without a message: its type)."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:160]}" if lines else type(exc).__name__


def _records_grad(compiled) -> bool:
    """Whether a call of the compiled products would have to record gradients: compiled kernels
    record none, so a parameter of ``f`` that requires grad (with grad enabled) sends the call to
    the transforms, whose results carry its gradient."""
    if not torch.is_grad_enabled():
        return False
    compiled = getattr(compiled, "fn", compiled)  # a CUDA-graphed one: the compiled products it replays
    watched = getattr(compiled, "watched", None)
    if watched is None:
        watched = [t for t in getattr(compiled, "extras", ()) if isinstance(t, torch.Tensor)]
    return any(t.requires_grad for t in watched)


def _replay_records_grad(graph) -> bool:
    """Whether an eager replay with grad enabled records a gradient through a tensor the graph
    holds (a parameter of ``f`` that requires grad); ``False`` where the graph does not say."""
    records = getattr(graph, "records_grad", None)
    return records is not None and records()


def _draws(graph) -> bool:
    """Whether a recorded graph draws random numbers (an op tagged ``nondeterministic_seeded``;
    anything but a graph module is taken to draw)."""
    if not isinstance(graph, torch.fx.GraphModule):
        return True
    seeded = torch.Tag.nondeterministic_seeded
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and seeded in n.target.tags
               for n in graph.graph.nodes)


def _agrees(graph, fn: Callable, x: torch.Tensor, seeds: torch.Tensor, rng: tuple | None):
    """``graph``'s products at ``(x, seeds)`` where they are bit for bit those of ``fn`` (the
    transforms), both drawing from the random state ``rng`` (``None``: the products draw nothing,
    and the generators, which are the process's, are left alone); else ``None``, also where either
    raises (the transforms then evaluate the call, and raise ``f``'s own error)."""
    try:
        if rng is not None:
            _set_rng_state(x, rng)
        want = fn(x, seeds)
        if rng is not None:
            _set_rng_state(x, rng)
        got = graph(x, seeds)
    except Exception:  # noqa: BLE001 - see above
        return None
    from .compile_cache import parts_agree
    from .replay import _same

    return got if parts_agree(got, want, _same) else None


#: non-pointwise ATen operators whose result is always a new tensor of their own (the pointwise
#: ones are recognised by their tag); any other operator reading the point may return memory of it
#: without saying so in its schema (``_unsafe_view``, ``unsafe_chunk``, ``lift``, ...)
_FRESH_RESULTS = frozenset({
    "clone", "_to_copy", "index_select", "cat", "stack", "roll", "flip", "mm", "bmm", "addmm", "mv", "dot",
    "sum", "mean", "prod", "amax", "amin", "cumsum", "cumprod", "gather", "scatter", "scatter_add",
    "index_add", "index_copy", "index_put", "index", "constant_pad_nd", "repeat", "convolution",
    "convolution_backward", "slice_backward", "select_backward", "diagonal_backward", "slice_scatter",
    "select_scatter", "diagonal_scatter", "as_strided_scatter", "zeros_like", "ones_like", "empty_like",
    "full_like", "new_zeros", "new_ones", "new_empty", "new_full", "embedding", "embedding_dense_backward",
    "sort", "topk", "max", "min", "var", "std", "norm", "linalg_vector_norm", "_softmax", "_log_softmax",
    "_softmax_backward_data", "_log_softmax_backward_data", "tril", "triu", "trace",
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
    "_native_batch_norm_legit_no_training", "native_batch_norm_backward", "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward", "mse_loss", "mse_loss_backward", "nll_loss_forward", "nll_loss_backward",
    "_cdist_forward", "_cdist_backward", "im2col", "col2im", "logsumexp", "linalg_cross",
    "_new_zeros_with_same_feature_meta"})


def _fresh_result(target) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return False
    name = target.overloadpacket.__name__
    if "unsafe" in name or name in ("lift", "lift_fresh", "conj_physical"):
        return False
    return torch.Tag.pointwise in target.tags or name in _FRESH_RESULTS


#: operators that write into arguments their schema does not annotate as written
_UNANNOTATED_WRITERS = frozenset({"native_batch_norm", "_batch_norm_impl_index", "cudnn_batch_norm",
                                  "miopen_batch_norm"})


def _reaches(graph, inputs: int | None, strict: bool) -> str:
    """How a recorded graph reaches the memory of its first ``inputs`` inputs (``None``: all):
    ``"written"`` (an operator may write into it), ``"returned"`` (an output may be it),
    ``"opaque"`` (an operator reading it that is not an ATen operator; with ``strict``, also one
    neither known to allocate nor a view nor a pointwise in-place write into other memory), or
    ``"read"``. Schemas do not say everything (``unsafe_chunk`` returns memory of its input
    unannotated, ``native_batch_norm`` writes its running statistics unannotated). With
    ``strict`` (handing the caller's tensor over) every result of an operator reading such memory
    may be such memory too, unless the operator is known to return a new tensor of its own
    (:func:`_fresh_result`); without (whether a recording may be replayed at all) only views and
    the operators :func:`_aliases_unannotated` names are followed, so that an allocating operator
    missing from the list costs no recording."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return "opaque"
    maybe = set(placeholders if inputs is None else placeholders[:inputs])

    def touched(value) -> bool:
        return any(isinstance(a, torch.fx.Node) and a in maybe for a in tree_flatten(value)[0])

    for n in graph.graph.nodes:
        if n.op == "output":
            return "returned" if touched(n.args) else "read"
        if n.op in ("placeholder", "get_attr") or not touched((n.args, n.kwargs)):
            continue
        target = n.target
        if target is operator.getitem:
            maybe.add(n)  # an element of a view's list (unbind, split)
            continue
        if n.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            return "opaque"
        if _fresh_result(target):
            continue
        name, schema = target.overloadpacket.__name__, target._schema
        if name in _UNANNOTATED_WRITERS or name in ("set_", "set"):
            return "written"
        for i, arg in enumerate(schema.arguments):
            value = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write and touched(value):
                return "written"
        if schema.is_mutable:
            if strict and torch.Tag.pointwise not in target.tags:
                return "opaque"
            continue
        if not schema.returns or any(r.alias_info is None for r in schema.returns):
            if strict:
                return "opaque"
            if not _aliases_unannotated(name):
                continue  # read as allocating (the recording's reading: no write seen, no replay lost)
        maybe.add(n)  # a view of such memory (or possibly one)
    return "read"


def _aliases_unannotated(name: str) -> bool:
    """Whether an operator (packet name) may return memory of its input without an alias
    annotation: the ``unsafe`` views and splits (not the ``_unsafe_index`` gathers) and ``lift``."""
    return name == "lift" or ("unsafe" in name and not name.startswith(("_unsafe_index", "_unsafe_masked_index")))


def _input_free(graph) -> bool:
    """Whether a recorded graph neither writes into its first input (the point ``x``) nor returns
    memory of it, read strictly (:func:`_reaches`): then its replay may read the caller's tensor
    instead of a private copy."""
    return isinstance(graph, torch.fx.GraphModule) and _reaches(graph, 1, strict=True) == "read"


def _may_write(graph, inputs: int | None) -> bool:
    """Whether a recorded graph may write into the memory of its first ``inputs`` inputs (``None``:
    all of them), the point's and the seeds'. A function that writes into its input through memory
    PyTorch does not count as a view of it (``torch.unsafe_chunk(z, 2)[0].clamp_()``) moves no
    version counter: the recorded graph would write into the operator's own buffers at every replay."""
    return _reaches(graph, inputs, strict=False) in ("written", "opaque")


class GraphWritesInput(AsdError):
    """The products' recorded graph may write into the point it is given (see :func:`_may_write`):
    the operator evaluates ``f`` on a copy made inside its call from then on."""


def _layouts_hold(graph) -> bool:
    """Whether the tensors a compiled graph reads still have the layout it was compiled for."""
    hold = getattr(getattr(graph, "fn", graph), "layouts_hold", None)
    return hold is None or hold()


class Tracing:
    """Records and replays one :class:`~asd.backends.base.BatchedProducts`' function.

    Parameters
    ----------
    guard
        Returns ``(fingerprint, complete)`` of what the function reads now.
    compile
        Compile the recorded graph (recorded at the first call) with Inductor, specialized on the
        operator's constants, without a Dynamo frame in front of each call; the compiled artifact
        is cached on disk, so another process preparing the same operator loads it
        (:mod:`asd.backends.compile_cache`).
    """

    def __init__(self, guard: Callable[[], tuple], compile: bool = False):
        self.guard = guard
        self.compile = compile
        #: replay the compiled graph of a CUDA input as a captured CUDA graph
        #: (:mod:`asd.backends.cudagraph`; ``compile="reduce-overhead"``)
        self.cuda_graphs = False
        #: why the compiled products of a CUDA input are not replayed as a CUDA graph (``None`` where
        #: they are, and where there is nothing to capture: an input that is not on CUDA); a graph given
        #: up later says why in its own ``error`` (:class:`~asd.backends.cudagraph.CudaGraphed`)
        self.cuda_graph_error: str | None = None
        #: the seed rows passed to :meth:`run` are constants of the operator (never written): the
        #: compiled graph is specialized on them (:mod:`asd.backends.specialize`)
        self.constant_seeds = False
        #: tensors the recorded function captures that are the operator's own constants (a fused
        #: gather's index): specialized on as well
        self.owned: tuple = ()
        #: how the compiled graph was obtained (:class:`~asd.backends.compile_cache.CompiledProducts`)
        self.compiled = None
        #: how the latest recorded graph is replayed eagerly (:class:`~asd.backends.replay.Replay`)
        self.replay = None
        self.graphs: dict = {}
        self.stamp = None
        #: ``(weak reference, version)`` of the tensors whose values shapes in the graphs followed
        self.shape_sources: list = []
        self.calls = 0
        #: eager calls before the products are recorded (an operator that evaluated its first calls
        #: another way sets it to 0 to record at the next call)
        self.calls_before = CALLS_BEFORE_TRACING
        self.misses = 0
        #: graphs dropped because a tensor they read changed layout (see :meth:`_relayout`); past
        #: :data:`MAX_MISSES` of them the products are evaluated by the plain transforms
        self.relayouts = 0
        self.layout_unstable = False
        self.disabled = False
        self.error: str | None = None
        #: why the recorded products were not compiled (the graph was recorded, the compilation or
        #: its check failed): they are then evaluated by the plain transforms, not by torch.compile,
        #: whose kernels share what made Inductor's wrong
        self.compile_refused: str | None = None
        #: the products cannot be recorded as a graph (what f reads cannot be summarized, or the
        #: recording failed): the only case in which a compiled operator uses torch.compile; every
        #: other call the graph does not answer goes to the plain transforms
        self.unrecordable = False
        #: the compiled graph answered its first call and raised at a later one (``compile_refused``
        #: says why): later calls are evaluated by the plain transforms
        self.failed_later = False
        #: recordings that raised before their graph was complete (at two, the products are not recorded)
        self.record_failures = 0
        #: keys of the eagerly replayed graphs not yet compared with the transforms at a later call
        self.unverified: set = set()
        #: whether the latest recorded graph draws random numbers
        self.draws = True
        #: per key, whether the recorded graph reads its input only (:func:`_input_free`)
        self.input_free: dict = {}
        #: keys whose eager replay recorded a gradient at a lean call (a parameter of f requires
        #: grad): the autograd graph may keep its input, so :meth:`steady` replays a copy (until a
        #: new graph is recorded under the key)
        self.records_grad: set = set()
        #: :meth:`steady`'s replay raised: the next :meth:`run` (the same call's full path, or another
        #: thread's call that took the lock in between) answers ``None``
        self._replay_failed = False

    def _record(self, make_fx, fn: Callable, x: torch.Tensor, seeds: torch.Tensor):
        """The products' graph: a compiled operator records it without ``make_fx`` (which imports
        Dynamo: a second of a fresh process that only loads a cached compiled artifact). A tensor
        read as a Python number (``w.item()``, ``float(w)``) refuses the recording: the graph would
        keep the number while the tensor changes in place. The tensors that output shapes followed
        are added to :attr:`shape_sources`."""
        with _NoPythonNumbers() as mode, _NoHostReads():
            try:
                if self.compile:
                    from .record import RecordingError, record

                    try:
                        return record(fn, x, seeds)
                    except RecordingError:
                        pass
                return make_fx(lambda a, b: fn(a, b))(x, seeds)
            finally:
                self.shape_sources.extend(s for s in mode.shape_sources if s[0]() is not None)

    def _shapes_hold(self) -> bool:
        """Whether no tensor that an output shape in a recorded graph followed was written since
        (its version counter, and its contents: a write through ``.data`` moves no counter)."""
        for ref, version, copy in self.shape_sources:
            t = ref()
            if t is not None and (t._version != version or not _same_contents(t, copy)):
                return False
        return True

    def run(self, fn: Callable, x: torch.Tensor, seeds: torch.Tensor):
        """The products through the recorded graph, or ``None`` (evaluate ``fn`` itself)."""
        if self._replay_failed:
            # :meth:`steady` replayed this call and the replay raised: what run() does after that
            self._replay_failed = False
            return None
        if self.disabled:
            return None
        if _outside_graphs(x) or under_transform(x):
            return None
        self.calls += 1
        try:
            stamp, complete = self.guard()
        except Exception:  # noqa: BLE001 - what f reads cannot be summarized: f itself runs
            stamp, complete = None, False
        if not complete:
            self.disabled = self.unrecordable = True
            return None
        if stamp != self.stamp or (self.shape_sources and not self._shapes_hold()):
            self.shape_sources = []
            if self.graphs:
                self.misses += 1
                self.graphs.clear()
                if self.misses >= MAX_MISSES:
                    self.disabled = True
                    return None
            self.stamp = stamp
        if self.compile and x.requires_grad and torch.is_grad_enabled():
            return None  # compiled kernels record no autograd graph: the transforms do
        key = self._key(seeds)
        graph = self.graphs.get(key)
        if graph is not None and self.compile and not _layouts_hold(graph):
            # a tensor the compiled kernels read has other strides, offset or dtype under the same object
            # (W.t_(), p.data = q): the kernels are specialized on the old layout, compile anew
            if not self._relayout(key):
                return None
            graph = None
        if graph is None:
            if self.calls <= (0 if self.compile else self.calls_before):
                return None
            started = time.perf_counter()
            from torch.fx.experimental.proxy_tensor import make_fx

            from .graph_passes import simplify
            from .replay import eager_replay

            recorded = False
            rng = _rng_state(x)
            try:
                graph = self._record(make_fx, fn, x, seeds)
                recorded = True  # a failure from here on is asd's or the compiler's, not f's
                self.draws = _draws(graph)
                if isinstance(graph, torch.fx.GraphModule) and _may_write(graph, None):
                    # f writes into its input where no version counter sees it: never replayed
                    self.disabled = self.unrecordable = True
                    self.error = "the recorded graph may write into its inputs"
                    if self.draws:  # the transforms evaluate this call: the draws of an unrecorded one
                        _set_rng_state(x, rng)
                    if _may_write(graph, 1):
                        raise GraphWritesInput(self.error)
                    return None
                self.input_free[key] = _input_free(graph)  # (asd's graph passes write fresh buffers only)
                self.records_grad.discard(key)  # a new graph: whether its replay records one is seen anew
                # the compiled products are never compared bit for bit again: the recording is, here
                if self.compile and _agrees(graph, fn, x, seeds, rng if self.draws else None) is None:
                    return self._disagreed(x, rng if self.draws else None)
                graph = simplify(graph)
                if self.compile:
                    from .compile_cache import compile_products

                    graph = self.compiled = compile_products(graph, x, seeds, constant_seeds=self.constant_seeds,
                                                             owned=self.owned)
                    if _records_grad(graph):  # this call's products go through the transforms
                        self.graphs[key] = graph
                        if self.draws:
                            _set_rng_state(x, rng)
                        return None
                    graph = self._graphed(graph, x, seeds)
                else:
                    graph = self.replay = eager_replay(graph, x, seeds, constant_seeds=self.constant_seeds,
                                                       owned=self.owned)
                # the draws of f's random ops at this call: those an evaluation without recording makes
                if self.draws:
                    _set_rng_state(x, rng)
                out = graph(x, seeds)
            except Exception as exc:  # noqa: BLE001 - not traceable: keep the transforms
                if isinstance(exc, GraphWritesInput):
                    raise
                _set_rng_state(x, rng)  # the transforms evaluate this call: the draws of an unrecorded one
                self.error = _reason(exc)
                if not recorded:
                    # f's own error (raised again by the transforms that evaluate this call), one that
                    # passed, or one make_fx meets at every call: recorded again once before giving up
                    self.record_failures += 1
                    if self.record_failures < 2:
                        return None
                self.disabled = True
                self.unrecordable = not recorded
                if recorded and self.compile:  # compiling, its check, or the compiled graph's first call failed
                    self.compile_refused = self.error
                return None
            finally:
                if self.compile:
                    from .compile_cache import STATS

                    STATS.graph_seconds += time.perf_counter() - started
            self.graphs[key] = graph
            if not self.compile:
                self.unverified.add(key)
            return out
        if self.compile and _records_grad(graph):
            return None
        if key in self.unverified:
            # the first replay of a recorded graph: bit for bit the transforms' products, or what f
            # read when it was recorded was not what f reads now (another thread changed a value and
            # back meanwhile, which the stamps, taken before, cannot tell)
            self.unverified.discard(key)
            rng = _rng_state(x) if self.draws else None
            out = _agrees(graph, fn, x, seeds, rng)
            if out is None:
                self.graphs.pop(key, None)
                return self._disagreed(x, rng)
            return out
        if self._uncaptured(graph, x):
            graph = self.graphs[key] = self._graphed(graph, x, seeds)  # compiled at a call that needed grad
        return self._replay(key, graph, x, seeds)

    def _key(self, seeds: torch.Tensor) -> tuple:
        key = (tuple(seeds.shape), seeds.dtype)
        if self.constant_seeds:  # the operator's own seed rows, in one chunk: graphs are specialized on them
            # (their version counter too: a write into them must not meet constants folded from before)
            key = key + (seeds.data_ptr(), seeds.stride(), seeds._version)
        return key

    def _uncaptured(self, graph, x: torch.Tensor) -> bool:
        """Whether a compiled graph is still to be captured as a CUDA graph at this call."""
        return (self.cuda_graphs and x.device.type == "cuda" and self.cuda_graph_error is None
                and not getattr(graph, "captured", False))

    def _replay(self, key, graph, x: torch.Tensor, seeds: torch.Tensor):
        """``graph(x, seeds)``; ``None`` where it raised (a compiled graph is given up, an eager
        one recorded again at the next call)."""
        if self.compile:
            try:
                return graph(x, seeds)
            except Exception as exc:  # noqa: BLE001 - the compiled kernels failed after their first call
                return self._compiled_failed(exc)
        try:
            return graph(x, seeds)
        except Exception:  # noqa: BLE001 - a recorded view of a tensor whose strides changed (W.t_())
            self._relayout(key)  # this call through the transforms; recorded again at the next
            return None

    def steady(self, x: torch.Tensor, seeds: torch.Tensor):
        """The products through a graph recorded, checked and replayed before, where :meth:`run`
        would do nothing but replay it (same stamp, shapes, layouts; nothing drawn, no gradient
        recorded by compiled kernels, no CUDA graph still to capture); ``None`` anywhere else, and
        then :meth:`run` decides. The lean path of a prepared operator's repeated call.

        ``x`` is the caller's flat point (a view of its tensor): it is copied first unless the graph
        reads it only (:func:`_input_free`) and the replay records no gradient that would keep it
        (compiled kernels, grad disabled, or no tensor the graph holds requires grad; a replay that
        records one all the same runs again on a copy); a result that aliases it is copied."""
        if self.disabled or self.draws or _outside_graphs(x) or under_transform(x):
            return None
        key = self._key(seeds)
        graph = self.graphs.get(key)
        if graph is None or key in self.unverified or self._uncaptured(graph, x):
            return None
        if self.compile and ((x.requires_grad and torch.is_grad_enabled()) or _records_grad(graph)
                             or not _layouts_hold(graph)):
            return None
        try:
            stamp, complete = self.guard()
        except Exception:  # noqa: BLE001 - run() meets it again and stops recording
            return None
        if not complete or stamp != self.stamp or (self.shape_sources and not self._shapes_hold()):
            return None
        self.calls += 1
        # shared only where the graph sees what a private copy would show it: a contiguous tensor of
        # its own storage (recorded views, as_strided among them, address the storage from its start)
        grads = not self.compile and torch.is_grad_enabled()
        shared = (self.input_free.get(key, False) and x.storage_offset() == 0 and x.is_contiguous()
                  and x.untyped_storage().nbytes() == x.numel() * x.element_size()
                  and not (x.is_neg() or x.is_conj())  # (resolved by the copy: compiled kernels ignore the bits)
                  and not (grads and (key in self.records_grad or _replay_records_grad(graph))))
        xf = x if shared else x.clone()
        version = xf._version
        out = self._replay(key, graph, xf, seeds)
        if shared and grads and out is not None and out.requires_grad:
            # a tensor read that the graph does not hold requires grad (not expected: the graph holds
            # every tensor of f's it reads): its autograd graph may keep the caller's tensor
            self.records_grad.add(key)
            out = None  # (its autograd graph is freed before the second replay builds one)
            shared, xf = False, x.clone()
            version = xf._version
            out = self._replay(key, graph, xf, seeds)
        # the full path takes this call over: its run() answers as it would after its own failed
        # replay. (A replay whose failure disabled the recording leaves no flag: run() answers None
        # anyway, and the full path may evaluate that call by a warm-up strategy, which evaluates
        # every call of a disabled recording.)
        self._replay_failed = out is None and not self.disabled
        if out is None or xf._version != version:  # (f wrote into its input: the full path handles it)
            return None
        if shared and out.untyped_storage().data_ptr() == xf.untyped_storage().data_ptr():
            out = out.clone()
        return out

    def _disagreed(self, x: torch.Tensor, rng: tuple | None) -> None:
        """A recorded graph that gave other products than the transforms: none is kept (past
        :data:`MAX_MISSES` such graphs the products are no longer recorded); this call is
        evaluated by the transforms, with the random draws it started from (``rng``, where the
        products draw)."""
        self.misses += 1
        self.error = "the recorded graph's products differ from the transforms' (or raised where they did not)"
        if self.misses >= MAX_MISSES:
            self.disabled = True
        if rng is not None:
            _set_rng_state(x, rng)
        return None

    def _compiled_failed(self, exc: Exception) -> None:
        """A compiled graph raised at a call after its compilation: this call and every later one
        are evaluated by the plain transforms (never by ``torch.compile``, whose kernels share
        Inductor's); :class:`~asd.backends.base.BatchedProducts` warns once with the reason."""
        self.error = self.compile_refused = _reason(exc)
        self.failed_later = True
        self.disabled = True
        self.graphs.clear()
        self.compiled = None  # its kernels and folded constants are not kept alive
        return None

    def _relayout(self, key) -> bool:
        """Drop the graph of ``key``, recorded for tensors whose layout changed since; ``False``
        (and no tracing from now on) after :data:`MAX_MISSES` such changes: a tensor whose layout
        changes at every call would be recorded and compiled at every call."""
        self.graphs.pop(key, None)
        self.relayouts += 1
        if self.relayouts > MAX_MISSES:
            self.disabled = True
            # torch.compile's guards do not see a storage offset either: the plain transforms
            self.layout_unstable = True
            return False
        return True

    def _graphed(self, compiled, x: torch.Tensor, seeds: torch.Tensor):
        """The compiled products replayed as a CUDA graph where asked for and possible (not while
        the caller is capturing a graph of its own: capturing would break it)."""
        if not (self.cuda_graphs and x.device.type == "cuda") or torch.cuda.is_current_stream_capturing():
            return compiled
        from .cudagraph import graphed

        graph, self.cuda_graph_error = graphed(compiled, x, seeds, constant_seeds=self.constant_seeds)
        return graph
