"""Prepared sparse derivative operators.

A prepared operator holds everything that does not depend on the input's values: the sparsity
pattern, the coloring (with its decompression plan), the evaluation backend's state and the
decompressor with its index tensors on the input's device. Calling it runs only the batched
derivative products and one decompression.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from typing import Callable

import numpy as np
import torch

from ._fork import fork_safe
from .backends import HVP_BACKENDS, Backend, BatchedProducts, default_backend, flatten_function, scalar_function
from .backends.base import ProductState, SingleDirection
from .backends.fused import FusedGather, FusedState
from .backends.hvp import ForwardOverReverseHVP, ReverseOverReverseHVP, value_grad_hvp
from .coloring.choose import choose_hessian, choose_jacobian
from .coloring.result import BiColoring, ColumnColoring, RowColoring
from .decompression.device import Decompressor, same_memory
from .detection.jacobian import check_input
from .backends.traced import (CALLS_BEFORE_TRACING, GraphWritesInput, Tracing, _rng_state, _set_rng_state, default_device,
                              inside_transform, under_transform)
from . import arg_values
from .autograd_hooks import unhooked
from .cache import ValueGuard, fingerprint
from .checks import CheckReport, checks_forced, custom_function_hint, probe
from .backends.autograd_loop import AutogradLoop
from .detection.ad_gaps import refusal_fix, unsafe_modes
from .errors import ADGapError, ADGapWarning, AsdError, CheckError, InputError, TransformUnsupported
from .decompression.plans import SubstitutionPlan
from .guards import ModuleStateGuard
from .memory import auto_batch_size
from .options import check_batch_size, check_bool, check_choice, check_compile
from .patterns import SparsityPattern, as_pattern

JACOBIAN_COLORINGS = ("column", "row", "bidirectional")
HESSIAN_COLORINGS = ("star", "acyclic")
MODES = ("auto", "forward", "reverse")
HVP_MODES = ("auto", *HVP_BACKENDS)
MAX_GPU_SUBSTITUTION_LEVELS = 64
#: Hessians with at most this many colors (on the CPU, default strategy) evaluate by double
#: backward - one forward and backward pass that keeps its graph, then one backward pass per color -
#: until the batched products run as a recorded graph: eagerly that is 1.8-4x faster than
#: torch.func's vmap(jvp(grad)) (chained Rosenbrock n=1e3..1e5, total variation, the cart-pole
#: Lagrangian; a tie at 10 colors)
LOOP_MAX_COLORS = 8
_MODE_OF = {ColumnColoring: "forward", RowColoring: "reverse", BiColoring: "bidirectional"}
_HVP_NAMES = {**{cls: name for name, cls in HVP_BACKENDS.items()}, ReverseOverReverseHVP: "reverse_over_reverse",
              AutogradLoop: "double_backward"}
CHECKS = (False, "first", True)

# PyTorch's forward-AD levels are process-global: two threads inside forward-mode transforms at
# once corrupt each other's tangents. Every evaluation runs under this lock.
EVAL_LOCK = fork_safe(threading.RLock())


def _private(x: torch.Tensor) -> torch.Tensor:
    """A flat copy of ``x`` for the transforms: a function that writes into its input must never
    change the caller's tensor (a copy of the input is cheap next to one derivative product)."""
    return x.reshape(-1).clone()


#: the text of autograd's refusal of an in-place write into a leaf (or a view of one) that requires grad
_IN_PLACE_ON_LEAF = "leaf Variable that requires grad is being used in an in-place operation"


_WRITES_ANYWAY = "asd: f changed its input although it was given a copy of it; this operator cannot evaluate it"


class _WritesInput(AsdError):
    """Raised inside :meth:`_SparseOperator._evaluate` when ``f`` wrote into its input during an
    evaluation: the products are evaluated again on a copy made inside ``f``'s call."""


def run_on_copy(run: Callable, x: torch.Tensor, copies: bool):
    """``run(xf)`` on a private flat copy ``xf`` of ``x``; raises :class:`_WritesInput` where ``f``
    wrote into it (its version count moved) or autograd refused such a write into the leaf it was
    handed (reverse mode, Hessians), unless ``f`` is called on a copy already (``copies``: then a
    refusal is ``f``'s own, a write into a parameter that requires grad)."""
    xf = _private(x)
    version = xf._version
    try:
        out = run(xf)
    except GraphWritesInput:
        # the recording found writes into the point that no version counter saw (xf may hold them)
        if not copies:
            raise _WritesInput() from None
        return run(_private(x))  # (the recording is off: the transforms evaluate this call)
    except RuntimeError as exc:
        if not copies and _IN_PLACE_ON_LEAF in str(exc):
            raise _WritesInput() from exc
        raise
    if xf._version != version:
        raise _WritesInput()
    return out


def _copying_input(g: Callable) -> Callable:
    """``g`` called on a copy of its argument. Under ``jvp`` the copy is a new dual tensor: a
    function that writes into its input then writes into the copy's tangent, not into the
    operator's seed rows (which every later call reuses), and not into the point shared by the
    products of one batch or one loop."""
    def copying(z, *rest):
        return g(z.clone(), *rest)
    copying.copies_input = True
    return copying


#: colorings that need more than this fraction of the columns (rows) warn: compression barely pays
DENSE_WARNING_FRACTION = 0.5


def _warn_if_dense(coloring, pattern: SparsityPattern) -> None:
    nv = pattern.shape[1] if isinstance(coloring, (ColumnColoring, BiColoring)) else pattern.shape[0]
    if nv >= 8 and coloring.ncolors > DENSE_WARNING_FRACTION * nv:
        hint = ("coloring='bidirectional' reads dense rows and columns from the other mode; " if
                isinstance(coloring, (ColumnColoring, RowColoring)) else "")
        what = "columns" if nv == pattern.shape[1] else "rows"
        if coloring.order == "dense":  # asd.coloring.hopeless: not colored at all
            advice = (f"the coloring was skipped and asd evaluates dense AD, one product per {what[:-1]} "
                      f"(as torch.func.jacrev/jacfwd would); {hint}where the density comes from a dense constant "
                      "with zeros (an adjacency matrix), local=True reads its values")
        else:
            advice = f"{hint}dense AD (torch.func.jacrev/jacfwd) costs about the same"
        warnings.warn(f"asd: the {coloring.problem} coloring needs {coloring.ncolors} products for {nv} "
                      f"{what} (density {pattern.density:.2g}): compression barely pays; {advice}",
                      RuntimeWarning, stacklevel=4)


def _grad_and_value(g: Callable, x: torch.Tensor):
    """``(grad g(x), g(x))`` with torch.func, or with plain autograd where torch.func refuses."""
    try:
        return torch.func.grad_and_value(g)(x)
    except Exception:  # noqa: BLE001 - the same refusals as the batched products
        with torch.enable_grad():
            xr = x.detach().clone().requires_grad_(True)
            value = g(xr)
            (grad,) = torch.autograd.grad(value, xr, allow_unused=True)
        return (torch.zeros_like(x) if grad is None else grad), value.detach()


def _check_option(check, default: bool):
    if check is None:
        check = default
    if not (check is False or check is True or check == "first"):
        raise InputError(f"check must be False, 'first' or True, got {check!r}")
    return True if checks_forced() else check


def check_context(x: torch.Tensor) -> None:
    """Refuse what autograd cannot differentiate, warn about reduced precision."""
    if torch.is_inference_mode_enabled():
        raise InputError("asd was called inside torch.inference_mode(), where autograd records nothing: call it "
                         "outside the inference_mode block (torch.no_grad() around the rest is fine)")
    if x.is_inference():
        raise InputError("x is an inference tensor (created under torch.inference_mode()), which autograd cannot "
                         "differentiate: pass x.clone() made outside inference mode")
    kind = x.device.type
    if kind in _AUTOCAST_DEVICES and torch.is_autocast_enabled(kind):
        warnings.warn(f"asd: called inside torch.autocast: the derivative is computed in the autocast precision "
                      f"({torch.get_autocast_dtype(kind)}), not in {x.dtype}", RuntimeWarning, stacklevel=4)


_AUTOCAST_DEVICES = frozenset({"cpu", "cuda", "xpu", "mps"})


def example_input(x):
    """The example input of a prepared operator: a tensor as it is, a real numpy array (SciPy's
    callbacks pass them) as a tensor of its dtype (float64 for integers and booleans)."""
    if isinstance(x, np.ndarray) and (x.dtype.kind in "biuf"):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=x.dtype if x.dtype.kind == "f" else np.float64))
    return x


def call_input(x, shape, dtype, device):
    """A call's input: a tensor as it is; a real numpy array as a tensor of the operator's dtype and
    device, a flat one reshaped to the input shape when it has that many elements (SciPy passes flat
    arrays; an array of another shape is refused by the shape check, as a tensor would be)."""
    if isinstance(x, np.ndarray) and (x.dtype.kind in "biuf"):
        t = torch.as_tensor(x, dtype=dtype, device=device)
        n = 1
        for d in shape:
            n *= d
        return t.reshape(shape) if t.dim() == 1 and t.numel() == n else t
    return x


def _check_call_input(x, shape, dtype, device, what: str) -> None:
    if isinstance(x, np.ndarray) and x.dtype.kind == "c":
        raise InputError(f"{what} takes real inputs, got a complex numpy array ({x.dtype}): split it into real "
                         "and imaginary parts (np.stack([x.real, x.imag], -1)) as at preparation")
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{what} expects a torch.Tensor (or a real numpy array), got {type(x).__name__}")
    check_context(x)
    if tuple(x.shape) != tuple(shape):
        raise InputError(f"{what} was prepared for inputs of shape {tuple(shape)}, got {tuple(x.shape)}; "
                         "prepare a new operator for this shape")
    if x.dtype != dtype:
        raise InputError(f"{what} was prepared for dtype {dtype}, got {x.dtype}; convert with x.to({dtype})")
    if x.device != device:
        raise InputError(f"{what} was prepared for device {device}, got {x.device}; move x with x.to('{device}')")


class _Warmup:
    """An eager strategy for the calls before the batched products run as a recorded graph
    (``limit=None``), or for the first ``limit`` calls while torch.func has not been used in this
    process (its first use imports ``torch._dynamo``: 0.6-1 s of cold start)."""

    def __init__(self, backend: Backend, state, tracing: Tracing | None, limit: int | None):
        self.backend, self.state, self.tracing, self.limit = backend, state, tracing, limit
        self.calls = 0


COLD_LOOP_SECONDS = 5.0
"""The evaluation time the autograd loop may spend in a process where torch.func is cold. Past it, the
next evaluation runs torch.func's batched products, whose first use costs 2-3 s once (importing
``torch._dynamo`` and setting up the transforms; B1 N=64 on this 2-core machine) and which then
evaluate about twice as fast as the loop: the loop's excess has by then cost about that much (ski
rental)."""


class _ColdLoopTime:
    """The evaluation time the cold-process autograd loop has spent in this process (what
    :func:`_torch_func_cold` weighs against :data:`COLD_LOOP_SECONDS`)."""

    seconds = 0.0


def _torch_func_cold() -> bool:
    """Whether torch.func's first use in this process is still to come (and would import
    ``torch._dynamo``), and the autograd loop evaluating instead has not yet cost what importing it
    does."""
    return "torch._dynamo" not in sys.modules and _ColdLoopTime.seconds < COLD_LOOP_SECONDS


def _tracing_of(state) -> Tracing | None:
    products = getattr(state, "fused", None) or getattr(state, "products", None)
    return getattr(products, "tracing", None)


class _CallArgs:
    """The extra arguments of the call being evaluated, shared by an operator and the closures it
    hands to its backends (``f`` bound to them). The closures hold this box, not the operator: an
    operator in a reference cycle would keep its arrays (hundreds of MB at 10^6 unknowns) until the
    garbage collector runs, and every later allocation would fault in fresh memory meanwhile."""

    __slots__ = ("value",)

    def __init__(self, value: tuple):
        self.value = value


def _tracing_factory(f: Callable, box: _CallArgs) -> Callable[[], Tracing]:
    """What makes the operator's :class:`Tracing`: its guard watches ``f``, the call's extra
    arguments, the default dtype (``torch.tensor(0.1)`` in ``f`` records a constant of that
    dtype) and the default device (``torch.zeros(3)`` in ``f``)."""

    def make() -> Tracing:
        guard = ValueGuard()
        return Tracing(lambda: guard((f, box.value, torch.get_default_dtype(), default_device())))

    return make


class _SparseOperator:
    """Evaluation shared by the prepared operators: (pattern, coloring, backend state, decompressor).

    A prepared operator holds the pattern of ``f`` as it was at preparation, as a jitted function
    holds its trace: it is not detected again when what ``f`` reads changes its structure (a
    Python flag or loop count, an index tensor written in place, a float argument or global that a
    Python ``if`` compares). Values follow such changes; a pattern that no longer holds is found
    only by the probe, with ``check=True`` or extra arguments that differ from the prepared ones
    (and from the latest checked call's; in float values too unless ``check=False``), and the probe
    judges each row at its own scale, so an entry many orders below the largest of its row can be
    missed. Prepare again after such a change; :func:`asd.sparse_jacobian` and
    :func:`asd.sparse_hessian` do that themselves where the fingerprint of what ``f`` reads (float
    values aside) changes.
    """

    #: what the lean path of a repeated call needs (:meth:`_steady_plan`), or ``None``
    _steady: tuple | None = None
    #: ``(f, own coloring, coloring, backend, state, decompressor)``: the strategy that evaluated a
    #: call the operator's own could not inside a transform (nested forward mode), for the next such
    #: call while the operator's function and coloring are those it was set up for
    _transform_fallback: tuple | None = None

    _what = "this operator"
    pattern: SparsityPattern

    def _bind_input(self, f: Callable, x: torch.Tensor, *, batch_size, compile, local, strict, args=(),
                    kwargs=None) -> None:
        """Validate ``f``, ``x`` and the common options; record what calls must match."""
        if not callable(f):
            raise TypeError(f"f must be a callable (a function of one tensor), got {type(f).__name__}")
        check_input(x)
        check_context(x)
        check_batch_size(batch_size)
        self._local = local
        check_compile(compile)
        for name, value in (("local", local), ("strict", strict)):
            check_bool(name, value)
        if not isinstance(args, tuple):
            raise TypeError(f"args must be a tuple of f's extra arguments, got {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"kwargs must be a dict of f's extra keyword arguments, got {type(kwargs).__name__}")
        self.f = f
        self.shape, self.dtype, self.device = tuple(x.shape), x.dtype, x.device
        self.timings: dict[str, float] = {}
        self._guard = ModuleStateGuard(f)
        # f's extra, non-differentiated arguments: those given at preparation, replaced per call
        self._with_grad: BatchedProducts | None = None
        self._prepared_args = (args, dict(kwargs or {}))
        self._args_fingerprint = fingerprint(self._prepared_args)
        self._args = _CallArgs(self._prepared_args)
        # the values of the extra arguments known to be right: the prepared ones, and those of the
        # latest call the probe checked (see _call_with), each with the arguments themselves (kept
        # alive: a snapshot of an object names it by identity)
        self._checked_args = [(self._prepared_args, arg_values.snapshot(self._prepared_args))]
        self._trust_arg_values = False

    @property
    def _call_args(self) -> tuple:
        """``(args, kwargs)`` of the call being evaluated."""
        return self._args.value

    @_call_args.setter
    def _call_args(self, value: tuple) -> None:
        self._args.value = value

    def _bound(self, f: Callable) -> Callable:
        """``f`` of ``x`` alone, with the extra arguments of the current call (read from the box, so
        that the closure does not hold the operator)."""
        box = self._args
        return lambda z: f(z, *box.value[0], **box.value[1])

    def _call_with(self, args: tuple, kwargs: dict):
        """The argument pair of a call (the prepared one when none is given) and whether the probe
        checks the call: its arguments differ structurally from the prepared ones, or in value from
        both the prepared ones and those of the latest checked call (a pattern may follow a value:
        ``if c > 0``, ``torch.where(M > 0, ...)``), unless ``check=False`` was given."""
        if not args and not kwargs:
            pair = self._prepared_args
            if not pair[0] and not pair[1]:
                return pair, False
            # a prepared argument changed in place since (a tensor filled anew) is compared as well
            if fingerprint(pair) != self._args_fingerprint:
                return pair, True
        else:
            pair = (tuple(args), dict(kwargs))
            if fingerprint(pair) != self._args_fingerprint:
                return pair, True
        if self._trust_arg_values:
            return pair, False
        return pair, not any(arg_values.same(pair, snap) for _, snap in self._checked_args)

    def _checked_with(self, pair: tuple) -> None:
        """Remember the values of arguments a call was checked with: the prepared arguments' own
        (changed in place since) or, beside them, another call's."""
        if pair is self._prepared_args:
            self._checked_args[0] = (pair, arg_values.snapshot(pair))
        else:
            self._checked_args[1:] = [(pair, arg_values.snapshot(pair))]

    def _prepare_pattern(self, detect: Callable, given, conform: Callable) -> None:
        """``self.pattern``: detected (``detect()`` returns the pattern and the trace's
        :class:`~asd.detection.torch_tracer.TraceInfo`), or the user's ``given`` pattern checked by
        ``conform``. ``self.unsafe``: the AD modes the trace rules out
        (:func:`asd.detection.ad_gaps.unsafe_modes`); with a given pattern ``f`` is still traced
        once for them (a function the tracer cannot follow leaves them unknown, and the probe on)."""
        t0 = time.perf_counter()
        self._user_pattern = given is not None
        with self._guard.protect(always=True, args=self._prepared_args):  # preparing leaves no trace in the user's modules
            if given is None:
                self.pattern, self.trace_info = detect()
            else:
                self.pattern = conform(as_pattern(given, name="pattern"))
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        self.trace_info = detect()[1]
                except Exception:  # noqa: BLE001 - not traceable: the modes stay unknown
                    self.trace_info = None
        self.unsafe = unsafe_modes(self.trace_info)
        if "reverse" in self.unsafe and self._needs_reverse():
            reasons = dict.fromkeys(self.unsafe[m] for m in ("reverse", "forward") if m in self.unsafe)
            raise ADGapError(f"asd: {'; and '.join(reasons)}, so no evaluation of this function's derivative "
                             f"would be right; asd refuses rather than return a wrong matrix. "
                             f"{refusal_fix(self.trace_info)}")
        self.timings["detection"] = time.perf_counter() - t0

    def _choose_coloring(self, choose: Callable):
        t0 = time.perf_counter()
        result = choose()
        self.timings["coloring"] = time.perf_counter() - t0
        return result

    def _setup(self, g: Callable, coloring, x: torch.Tensor, backend: Backend | None, batch_size, compile,
               check, trace, hvp=None, explicit: bool = False) -> None:
        self.coloring = coloring
        self._g = g
        self.check_mode = check
        self._checked = False
        self.last_check: CheckReport | None = None
        self._user_backend = backend is not None  # a backend the user chose is never replaced
        self._settled = self._user_backend  # the strategy has evaluated once
        batch_size = check_batch_size(batch_size)  # a numpy integer as a plain int
        if batch_size == "auto":
            m, n = coloring.shape
            batch_size = auto_batch_size(coloring.ncolors, n, m, x.element_size(), x.device)
        self.batch_size = batch_size
        if backend is None:
            kw = {} if hvp is None else {"hvp": hvp}
            backend = default_backend(coloring, batch_size=batch_size, **kw)
        self._x0 = x.detach().reshape(-1)
        if trace is None:  # the pattern must hold everywhere for a recorded graph to be replayed
            trace = not (self._local or self._user_pattern)
        self._options = dict(batch_size=self.batch_size, compile=compile,
                             trace=_tracing_factory(self.f, self._args) if check_bool("trace", trace) else None)
        self.ad_gap: str | None = None
        self._warmup: _Warmup | None = None
        coloring, backend = self._avoid_gaps(coloring, backend, user_backend=self._user_backend, explicit=explicit)
        self._adopt(coloring, backend)
        self.fallback_reason: str | None = None

    def _clash(self, coloring, backend: Backend) -> str | None:
        """The reason ``backend`` would be wrong on ``coloring`` for this function, or ``None``."""
        for mode in sorted(backend.ad_modes(coloring)):
            if mode in self.unsafe:
                return f"{self.unsafe[mode]} ({mode} mode)"
        return None

    def _avoid_gaps(self, coloring, backend: Backend, *, user_backend: bool, explicit: bool):
        """``(coloring, backend)``, or the first strategy of :meth:`_fallbacks` that needs none of the
        AD modes the trace ruled out (PyTorch formulas known to be wrong for ``f``'s ops, or
        ``no_grad``/``autograd`` calls in ``f`` that forward mode cannot follow). An explicit
        choice that is replaced, or a user backend that is kept, warns with :class:`asd.ADGapWarning`."""
        reason = self._clash(coloring, backend)
        if reason is None:
            return coloring, backend
        self.ad_gap = reason
        if user_backend:
            warnings.warn(f"asd: the given backend {backend.name} may be wrong for this function: {reason}",
                          ADGapWarning, stacklevel=4)
            return coloring, backend
        self.coloring, self.backend = coloring, backend  # what _fallbacks() starts from
        for make in self._fallbacks():
            c, b = make()
            if self._clash(c, b) is None:
                if explicit:
                    warnings.warn(f"asd: {backend.name} would be wrong for this function: {reason}; using "
                                  f"{b.name} instead", ADGapWarning, stacklevel=4)
                return c, b
        warnings.warn(f"asd: every evaluation strategy may be wrong for this function: {reason}",
                      ADGapWarning, stacklevel=4)
        return coloring, backend

    def _adopt(self, coloring, backend: Backend) -> None:
        self.coloring = coloring
        self.backend = backend
        self.decompressor = Decompressor(coloring, self.device, bounds=self._screening, arithmetic=self._arithmetic())
        self.state = backend.init(self._g, self._x0, coloring, **self._options)

    def _arithmetic(self) -> torch.dtype | None:
        """The least precise floating dtype ``f``'s traced ops computed in, where coarser than the
        operator's (``None`` otherwise, or where nothing was traced): the precision of the products."""
        info = self.trace_info
        return info.coarsest() if info is not None and info.computes_coarser_than(self.dtype) else None

    @property
    def strategy(self) -> str:
        """How the products are evaluated (e.g. ``"vmap(jvp) + fused gather"``, ``"autograd loop"``)."""
        return self.backend.name

    def _fallbacks(self):
        """Other (coloring, backend) pairs to try, in order, when the first evaluation fails."""
        return []

    def _evaluate(self, run: Callable, x: torch.Tensor, call_args=None):
        """``run(backend, state, decompressor, xf)`` under the evaluation lock and the module guard.
        An evaluation that torch.func refuses (at the first call, or at a later point where a
        backward formula takes another branch) falls back to the next strategy that runs.

        A function that writes into its input (``z.mul_(2)``, ``ReLU(inplace=True)``) would write
        into the tangents of forward-mode products, the operator's own seed rows, and into the point
        the products of one batch share: when one evaluation changes its copy of ``x``, the operator
        from then on calls ``f`` on a copy made inside the call (:func:`_copying_input`), with new
        seed rows, and the evaluation runs again."""
        with EVAL_LOCK:
            try:
                return self._evaluate_once(run, x, call_args)
            except _WritesInput:
                if getattr(self._g, "copies_input", False):
                    raise AsdError(_WRITES_ANYWAY) from None
                self._copy_input()
            try:
                return self._evaluate_once(run, x, call_args)
            except _WritesInput:
                raise AsdError(_WRITES_ANYWAY) from None

    def _copy_input(self) -> None:
        """Evaluate ``f`` on a copy of its input from now on (see :meth:`_evaluate`): every state
        built on the old function (and its seed rows) is made anew."""
        self._g = _copying_input(self._g)
        self.state = self.backend.init(self._g, self._x0, self.coloring, **self._options)
        if self._warmup is not None:
            self._start_warmup(self._warmup.backend, self._warmup.limit)
        self._with_grad = None

    def _run_private(self, run: Callable, backend, state, decompressor, x: torch.Tensor):
        """``run`` on a private copy of ``x`` (:func:`run_on_copy`)."""
        return run_on_copy(lambda xf: run(backend, state, decompressor, xf), x,
                           getattr(self._g, "copies_input", False))

    def _evaluate_once(self, run: Callable, x: torch.Tensor, call_args=None):
        with self._guard.protect(args=call_args or self._prepared_args):
            self._call_args = call_args or self._prepared_args
            # what f's random ops draw from: a strategy that raised may have drawn, the next evaluation
            # of this call draws what the first would have
            rng = _rng_state(x)
            warm = self._warmup_now(x)
            if warm is not None:
                start = time.perf_counter()
                try:
                    out = self._run_private(run, warm.backend, warm.state, self.decompressor, x)
                except _WritesInput:
                    raise
                except Exception:  # noqa: BLE001 - refused here (twice): the operator's own strategy from now on
                    out = self._again(lambda: self._run_private(run, warm.backend, warm.state, self.decompressor, x), x,
                                      rng)
                    if out is None:
                        self._warmup = None
                finally:
                    if warm.limit is not None:  # evaluated instead of a cold torch.func
                        _ColdLoopTime.seconds += time.perf_counter() - start
                if out is not None:
                    # double backward gives NaN where torch.func's products are finite (a norm's
                    # Hessian at 0): such a call is evaluated by the operator's own strategy. A NaN
                    # or an infinity makes the sum non-finite (so does an overflowing sum: then the
                    # operator's strategy evaluates a call it did not need to)
                    if out.is_meta:  # shapes only: nothing to be finite
                        return out
                    total = out.detach().sum(dtype=torch.float64) if out.is_floating_point() else out.detach().sum()
                    if bool(torch.isfinite(total)):
                        return out
            if self._user_backend:
                return self._run_private(run, self.backend, self.state, self.decompressor, x)
            cached = self._transform_fallback
            if (cached is not None and cached[0] is self._g and cached[1] is self.coloring and under_transform(x)
                    and not getattr(run, "compressed", False)):
                try:  # the strategy that evaluated such a call before (see below)
                    return self._run_private(run, *cached[3:], x)
                except _WritesInput:
                    raise
                except Exception:  # noqa: BLE001 - the operator's own strategy, then the others
                    self._transform_fallback = None
                    _set_rng_state(x, rng)
            try:
                out = self._run_private(run, self.backend, self.state, self.decompressor, x)
            except Exception as exc:  # noqa: BLE001 - refused by torch.func: try the other strategies
                if isinstance(exc, AsdError) and not isinstance(exc, TransformUnsupported):
                    raise
                out = self._again(lambda: self._run_private(run, self.backend, self.state, self.decompressor, x), x,
                                  rng)
                if out is not None:
                    self._settled = True
                    return out
                first, reason = self.strategy, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                last = exc
                # refused by the transform around this call (nested forward mode): values by another
                # strategy for this call only (kept for the next such call), the operator's own for the
                # calls outside it. (A compressed buffer is in its coloring's layout: not this way.)
                # Forward-mode AD's level is the process's: a nested-level error without a tangent or
                # transform of this thread's came from another thread's dual_level, a passing clash
                elsewhere = "Nested forward mode AD" in str(exc) and not inside_transform(x)
                this_call = (under_transform(x) or elsewhere) and not getattr(run, "compressed", False)
                for make in self._fallbacks():
                    coloring, backend = make()
                    if self._clash(coloring, backend) is not None:
                        continue
                    _set_rng_state(x, rng)
                    try:
                        state = backend.init(self._g, self._x0, coloring, **self._options)
                        decompressor = Decompressor(coloring, self.device, bounds=self._screening,
                                                    arithmetic=self._arithmetic())
                        out = self._run_private(run, backend, state, decompressor, x)
                    except _WritesInput:
                        raise
                    except Exception as exc2:  # noqa: BLE001 - this one does not run either: next
                        last = exc2
                        continue
                    if this_call:
                        self._transform_fallback = (self._g, self.coloring, coloring, backend, state, decompressor)
                        return out
                    self.coloring, self.backend, self.state, self.decompressor = coloring, backend, state, decompressor
                    self.fallback_reason = reason
                    self._warmup = None
                    warnings.warn(f"asd: {first} cannot evaluate this function ({reason}); using {self.strategy}",
                                  RuntimeWarning, stacklevel=4)
                    break
                else:
                    # the last strategy is plain autograd: its error is the function's own
                    raise last from (exc if last is not exc else None)
            self._settled = True
            return out

    def _start_warmup(self, backend: Backend, limit: int | None = None) -> None:
        """Evaluate with ``backend`` until the operator's batched products have a recorded graph
        (for good where they are never recorded), or for the first ``limit`` calls while
        torch.func is cold (see :class:`_Warmup`); ``backend`` must avoid the unsafe AD modes."""
        self._warmup = None
        if self._clash(self.coloring, backend) is None:
            self._warmup = _Warmup(backend, backend.init(self._g, self._x0, self.coloring, **self._options),
                                   _tracing_of(self.state), limit)

    def _warming(self, x: torch.Tensor) -> bool:
        """Whether the warm-up strategy evaluates a call at ``x``: not for an input that requires
        grad (its values are not differentiable), and not once the batched products are recorded."""
        w = self._warmup
        if w is None or (x.requires_grad and torch.is_grad_enabled()) or under_transform(x):
            return False  # (the loop detaches x: no gradient, tangent or batch would reach the values)
        if w.limit is not None:
            return w.calls < w.limit and _torch_func_cold()
        t = w.tracing
        return t is None or t.disabled or (not t.graphs and w.calls < CALLS_BEFORE_TRACING)

    def _warmup_now(self, x: torch.Tensor) -> _Warmup | None:
        """The warm-up strategy if it evaluates this call (counted), else ``None``."""
        if not self._warming(x):
            w = self._warmup
            if w is not None and w.limit is None and w.tracing is not None and w.calls >= CALLS_BEFORE_TRACING:
                w.tracing.calls_before = 0  # the batched products record at their next call
            return None
        self._warmup.calls += 1
        return self._warmup

    def _again(self, evaluate: Callable, x: torch.Tensor, rng: tuple):
        """After a strategy raised at ``x``: ``f``'s own error where ``f`` fails here, else the
        strategy's result evaluated once more (an error that passed), or ``None`` where it fails again
        (then it cannot evaluate ``f``, and another takes over). Each evaluation starts from the
        random-number state ``rng`` the call started from."""
        _set_rng_state(x, rng)
        self._raise_if_f_fails(x)
        _set_rng_state(x, rng)
        try:
            return evaluate()
        except _WritesInput:
            raise
        except Exception:  # noqa: BLE001 - the strategy's own failure
            _set_rng_state(x, rng)
            return None

    def _raise_if_f_fails(self, x: torch.Tensor) -> None:
        """Raise ``f``'s own error at ``x`` (not a transform's): a strategy (a warm-up, the first
        choice) is only replaced when ``f`` itself runs here."""
        with torch.enable_grad(), self._guard.protect(always=True, args=self._call_args):
            xr = _private(x)
            if xr.is_floating_point():
                xr = xr.requires_grad_(True).clone()  # not a leaf: f may write into its input
            self._g(xr)

    def _check(self, x) -> torch.Tensor:
        """``x`` checked against the prepared shape, dtype and device (a numpy array converted)."""
        x = call_input(x, self.shape, self.dtype, self.device)
        _check_call_input(x, self.shape, self.dtype, self.device, self._what)
        return x

    @property
    def ncolors(self) -> int:
        """Number of batched products per evaluation."""
        return int(self.coloring.ncolors)

    def compressed(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """The flat compressed product (batch-first layout of the coloring's plan)."""
        with unhooked():
            x = self._check(x)
            call_args, _ = self._call_with(args, kwargs)

            def run(backend, state, dec, xf):
                return backend.compute(state, xf)

            run.compressed = True  # in the coloring's layout (see _evaluate_once)
            return self._evaluate(run, x, call_args)

    def values(self, x: torch.Tensor, *args, out: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Only the stored values (CSR order of :attr:`pattern`): for solvers that keep a fixed structure.

        ``x`` is a tensor of the prepared shape, dtype and device, or a numpy array (what SciPy's
        callbacks pass), converted to them (a flat array of the right size is reshaped).

        ``args``/``kwargs`` are ``f``'s extra, non-differentiated arguments (default: those given at
        preparation). With ``check=True`` (or ``"first"`` on the first call), or extra arguments that
        differ from the prepared ones and from those of the latest checked call (in structure, or in
        value: a pattern may follow a value, ``if c > 0``), the values are verified by :meth:`check`
        before they are returned; a failed check raises :class:`asd.CheckError`. An operator
        prepared with ``check=False`` checks only structural differences.

        ``out``: a preallocated buffer (1-D, ``nnz`` elements, the operator's dtype and device) that
        receives the values and is returned, for solver loops that keep one array of Jacobian or
        Hessian values. It is written only once the values are complete (and checked): a call that
        raises leaves it as it was. It records no gradient: with an input or parameters that
        require grad, call without ``out`` or under ``torch.no_grad()``. (``out`` is asd's keyword: an
        ``out`` argument of ``f`` itself can only be given at preparation, ``kwargs=``.)
        """
        with unhooked():
            if out is not None:
                x = self._check(x)  # x's errors before out's
                self._check_out_values(out)
            vals = self._steady_values(x) if not args and not kwargs else None
            if vals is None:
                vals = self._values(self._check(x), args, kwargs)
            if out is None:
                return vals
            if vals.requires_grad and torch.is_grad_enabled():
                raise InputError(f"out= cannot hold values that record gradients (x or a parameter of f requires grad): "
                                 f"call {self._what} without out=, or under torch.no_grad()")
            return out.copy_(vals)

    def _values(self, x: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        call_args, changed = self._call_with(args, kwargs)
        with EVAL_LOCK:  # the values and their screen: no other thread's call changes the strategy between
            vals = self._evaluate(lambda backend, state, dec, xf: backend.values(state, xf, dec), x, call_args)
            if vals.dtype != self.dtype:
                vals = vals.to(self.dtype)
            if self._screen(x, vals):  # another strategy from now on: this call evaluated again
                vals = self._evaluate(lambda backend, state, dec, xf: backend.values(state, xf, dec), x, call_args)
                vals = vals.to(self.dtype)
            self._steady = self._steady_plan()
        if changed or self.check_mode is True or (self.check_mode == "first" and not self._checked):
            self._verify(x, vals, call_args)
            if changed:
                self._checked_with(call_args)
        return vals

    def _steady_plan(self) -> tuple | None:
        """What :meth:`_steady_values` needs, where the operator's strategy is batched products in one
        chunk, through a :class:`~asd.backends.traced.Tracing`, and its calls have no extra arguments
        and reach no ``nn.Module`` (whose buffers every call would snapshot)."""
        state, backend = self.state, type(self.backend)
        # the path below is what these classes' own methods do: a backend (a user's) or products
        # class that overrides them evaluates by the full path
        if isinstance(state, FusedState) and backend.values is FusedGather.values:
            products, gathered = state.fused, True
        elif (isinstance(state, ProductState) and backend.values is Backend.values
              and backend.compute is SingleDirection.compute):
            products, gathered = state.products, False
        else:
            return None
        pair = self._prepared_args
        if (type(products) is not BatchedProducts or products.tracing is None or products.nseeds == 0
                or not self._settled or pair[0] or pair[1] or self._guard.watches_modules
                or (products.batch_size is not None and products.batch_size < products.nseeds)):
            return None
        return state, self.decompressor, products, gathered

    def _steady_values(self, x) -> torch.Tensor | None:
        """A repeated call's values by the lean path: a plain tensor of the prepared shape, dtype
        and device that requires no grad, outside inference mode, on an operator that needs no
        check at this call and whose products replay a recorded graph with nothing else to do
        (:meth:`~asd.backends.traced.Tracing.steady`); ``None`` anywhere else (then the full path
        evaluates the call). It is :meth:`values`'s path, without the layers a settled operator
        passes through unchanged."""
        plan = self._steady
        if (plan is None or type(x) is not torch.Tensor or x.requires_grad or x.shape != self.shape
                or x.dtype != self.dtype or x.device != self.device or x.is_inference()
                or torch.is_inference_mode_enabled()
                or self.check_mode is True or (self.check_mode == "first" and not self._checked)):
            return None
        state, decompressor, products, gathered = plan
        with EVAL_LOCK:
            if (self.state is not state or self.decompressor is not decompressor or products.sparse_constants is True
                    or self._warming(x)):
                return None
            self._call_args = self._prepared_args
            out = products.tracing.steady(x.reshape(-1), products.seeds)  # (copied there unless it need not be)
            if out is None:
                return None
            vals = out if gathered else decompressor.values(out)
            if vals.dtype != self.dtype:
                vals = vals.to(self.dtype)
            if self._screen(x, vals):
                return None
        return vals

    def _check_out_values(self, out) -> None:
        nnz = int(self.pattern.nnz)
        if not isinstance(out, torch.Tensor) or out.layout != torch.strided:
            raise InputError(f"out must be a dense 1-D torch.Tensor of {nnz} values, got "
                             f"{type(out).__name__ if not isinstance(out, torch.Tensor) else out.layout}")
        if tuple(out.shape) != (nnz,) or out.dtype != self.dtype or out.device != self.device:
            raise InputError(f"out must have shape ({nnz},), dtype {self.dtype} and device {self.device} (the "
                             f"operator's values), got shape {tuple(out.shape)}, {out.dtype}, {out.device}; allocate "
                             f"it with torch.empty({nnz}, dtype={self.dtype}, device='{self.device}')")
        if out.requires_grad and torch.is_grad_enabled():
            raise InputError("out requires grad: pass a buffer that does not (out.detach()) or call under "
                             "torch.no_grad()")
        if out.is_inference():
            raise InputError("out is an inference tensor (made under torch.inference_mode()), which cannot be "
                             "written outside it: allocate the buffer outside inference mode")
        if nnz > 1 and out.stride(0) == 0:
            raise InputError("out's elements share memory (an expanded tensor): allocate a buffer of its own, "
                             f"torch.empty({nnz}, dtype={self.dtype})")

    def _check_out_csr(self, out) -> torch.Tensor:
        """The values buffer of ``out``, a CSR tensor with this operator's structure."""
        if not isinstance(out, torch.Tensor) or out.layout != torch.sparse_csr:
            raise InputError(f"out must be a torch.sparse_csr tensor with {self._what}'s structure (one it returned "
                             f"before), got {type(out).__name__ if not isinstance(out, torch.Tensor) else out.layout}; "
                             "for the values alone use op.values(x, out=buffer)")
        dec = self.decompressor
        if (tuple(out.shape) != dec.shape or out.dtype != self.dtype or out.device != self.device
                or out.crow_indices().dtype != dec.crow.dtype or out.col_indices().dtype != dec.col.dtype):
            raise InputError(f"out must be a CSR tensor of shape {dec.shape}, dtype {self.dtype} on {self.device} with "
                             f"{dec.col.dtype} indices, got {tuple(out.shape)}, {out.dtype}, {out.device}; pass a "
                             f"result of this operator")
        crow, col = out.crow_indices(), out.col_indices()
        same = same_memory(crow, dec.crow) and same_memory(col, dec.col)
        if not same and not (col.shape == dec.col.shape and torch.equal(crow, dec.crow) and torch.equal(col, dec.col)):
            raise InputError(f"out has another sparsity structure than {self._what}'s pattern; pass a result of "
                             "this operator (its crow and column indices must be the pattern's)")
        return out.values()

    def check(self, x: torch.Tensor, values: torch.Tensor | None = None, *, args: tuple = (),
              kwargs: dict | None = None) -> CheckReport:
        """Probe the derivative at ``x`` with one product of the other AD mode (see :mod:`asd.checks`).

        Returns the :class:`~asd.checks.CheckReport`; ``report.ok`` is ``False`` when the sparse
        derivative disagrees with the matrix-free product beyond rounding (a pattern that does not
        hold at ``x``, a function changed since preparation, or a wrong AD formula in PyTorch).
        """
        with unhooked():
            x = self._check(x)
            call_args, _ = self._call_with(args, kwargs or {})
            return self._probe(x, values, call_args)

    def _probe(self, x, values, call_args) -> CheckReport:
        if values is None:
            values = self._evaluate(lambda backend, state, dec, xf: backend.values(state, xf, dec), x, call_args)
            values = values.to(self.dtype)
        with EVAL_LOCK, self._guard.protect(always=True, args=call_args):  # the probe's own run of f leaves no trace
            self._call_args = call_args
            report = probe(self, x, values)
        self.last_check = report
        return report

    def rebind(self, f: Callable) -> "_SparseOperator":
        """This operator's pattern, coloring and plan evaluating another function object, e.g. the
        same ``lambda z: F(t, z)`` written anew: nothing is detected or colored again."""
        with EVAL_LOCK:  # not halfway through another thread's change of strategy
            return self._rebound(f)

    def _rebound(self, f: Callable) -> "_SparseOperator":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.f = f
        new._guard = ModuleStateGuard(f)
        new._args = _CallArgs(self._prepared_args)  # its own: f is bound to the box, not to the operator
        new._checked_args = list(self._checked_args)  # what one checks does not vouch for the other
        new._g = new._flat(f)
        new.last_check = None
        new._with_grad = None
        if new._options["trace"] is not None:
            new._options = dict(new._options, trace=_tracing_factory(f, new._args))
        new.state = new.backend.init(new._g, new._x0, new.coloring, **new._options)
        if new._warmup is not None:
            new._start_warmup(new._warmup.backend, new._warmup.limit)
        return new

    #: whether substitution's rounding is bounded at every call (a Hessian's, unless ``check=False``)
    _screening = False

    def _screen(self, x: torch.Tensor, values: torch.Tensor) -> bool:
        """Judge this call's values beyond the probe; ``True`` where the operator changed its
        strategy because of them (the call is then evaluated again)."""
        return False

    def _default_check(self, local: bool):
        """``check``'s default: every call where the pattern holds at a point or is the user's, the
        first where ``f`` computes through a custom ``autograd.Function`` (whose derivative may not
        follow the forward ops the detection traced), else none."""
        if local or self._user_pattern:
            return True
        return "first" if custom_function_hint(self.trace_info) else False

    def _verify(self, x: torch.Tensor, values: torch.Tensor, call_args=None) -> None:
        if inside_transform(x):
            # the probe draws random vectors and differentiates f again: vmap refuses the draws, and
            # the transforms' wrapped tensors meet the probe's own autograd calls
            raise InputError(f"{self._what} checks this call (check=True, or extra arguments that differ from the "
                             "prepared ones), and its cross-mode check cannot run inside a torch.func transform "
                             "(vmap, jacrev, grad, jvp, also over f's extra arguments): prepare it with check=False "
                             "to batch or differentiate over the arguments (values follow them; a pattern that "
                             "depends on them is then not checked again), or call it outside the transform")
        report = self._probe(x, values, call_args or self._prepared_args)
        self._checked = self._checked or report.ok  # a failed first check is made again at the next call
        if not report.ok:
            raise CheckError(f"{self._what} failed its cross-mode check at this x ({report}). "
                             f"{custom_function_hint(self.trace_info)}The sparsity "
                             "pattern does not hold here, the function changed since preparation, or one of "
                             "PyTorch's derivative formulas is wrong for it in this AD mode: prepare the "
                             "operator again (for local=True at this point), pass local=False, or try another "
                             "mode= / hvp=.")

    def __call__(self, x: torch.Tensor, *args, out: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """The derivative at ``x`` as a ``torch.sparse_csr`` tensor (``args``/``kwargs``: ``f``'s extra
        arguments, see :meth:`values`). ``out``: a CSR tensor this operator returned before, whose
        values are overwritten and which is returned (see :meth:`values`).

        Every result's crow and column index tensors are copy-on-write clones of the operator's:
        editing one result's indices copies them then, and changes no other result."""
        if out is not None:
            self.values(x, *args, out=self._check_out_csr(out), **kwargs)
            return out
        return self.decompressor.csr(self.values(x, *args, **kwargs))

    def __reduce__(self):
        raise TypeError(f"a prepared {type(self).__name__} holds compiled functions and device tensors and cannot be "
                        "pickled; save what it found with op.pattern.save(path) and asd.coloring.save(op.coloring, "
                        "path), and prepare it again in the other process with pattern=asd.SparsityPattern.load(path)")


class SparseJacobian(_SparseOperator):
    """A reusable sparse Jacobian of ``f`` for inputs shaped like ``x``.

    Parameters
    ----------
    f
        Function of one tensor returning one tensor.
    x
        Example input: fixes shape, dtype and device (and, with ``local=True``, the point at which
        the pattern is detected).
    mode
        ``"forward"`` (column coloring, batched JVPs), ``"reverse"`` (row coloring, batched VJPs)
        or ``"auto"`` (the one with fewer colors; on a tie reverse when evaluating eagerly, as one
        VJP batch shares one forward pass, and forward with ``compile=True``, where compiled JVPs
        are the faster). ``"auto"`` avoids a mode in which one of ``f``'s ops has a PyTorch
        derivative formula known to be wrong (:mod:`asd.detection.ad_gaps`), and forward mode when
        ``f`` calls ``torch.autograd`` or computes under ``torch.no_grad()``, which JVPs cannot
        follow; an explicit mode that would be wrong there is replaced with an
        :class:`asd.ADGapWarning` (``op.ad_gap`` says why).
    coloring
        Overrides ``mode`` with an explicit problem: ``"column"``, ``"row"`` or ``"bidirectional"``
        (rows and columns together, one batch of JVPs plus one of VJPs).
    order
        Vertex order of the greedy coloring (see :data:`asd.coloring.ORDERS`, or ``"best"``).
    batch_size
        Colors per batched call (bounds memory); ``None`` evaluates all colors at once; ``"auto"``
        picks it from the memory free on ``x``'s device and the size of one product
        (:mod:`asd.memory`); ``op.batch_size`` is the value in use.
    compile
        Evaluate through ``torch.compile`` (falls back to eager with a warning if it fails).
        ``"reduce-overhead"``: compiled, and on a CUDA input the compiled products are replayed
        as a captured CUDA graph (one launch per call; :mod:`asd.backends.cudagraph`).
    local
        Detect the pattern at ``x`` with its values (valid at that point only).
    strict
        Raise on ops without a sparsity rule instead of tracing them conservatively.
    pattern
        A known sparsity pattern (an :class:`asd.SparsityPattern`, a scipy sparse matrix or a dense
        bool array); skips detection.
    backend
        An explicit evaluation backend (see :mod:`asd.backends`) for the chosen coloring. Without
        one (and without ``compile``), a reverse-mode operator's first call in a process where
        torch.func has not run yet evaluates with plain autograd (the autograd loop): the first use
        of torch.func imports ``torch._dynamo``, 0.6-1 s; later calls use torch.func.
    trace
        Record the batched products as a graph of ATen operations after the first calls and replay
        it (faster eagerly; the same bits; with ``compile=True`` the recorded graph is what is
        compiled), guarded on every call by a value fingerprint of ``f`` and its arguments
        (:mod:`asd.backends.traced`). ``None`` (default): on unless ``local=True`` or a user
        ``pattern``, and only while the fingerprint sees everything ``f`` reads.
    args, kwargs
        Extra arguments of ``f`` that are not differentiated (``f(x, *args, **kwargs)``), used for
        detection; each call may pass others (``op(x, *args, **kwargs)``).
    check
        Verify calls with the cross-mode probe (:meth:`check`): ``False``, ``"first"`` (the first
        call only) or ``True`` (every call; the default with ``local=True`` or a user ``pattern``,
        whose validity at other points is not known). ``ASD_CHECK=1`` turns it on everywhere.
        Whatever it is, a call whose extra arguments differ from the prepared ones (and from the
        latest checked call's) is checked; ``check=False`` given explicitly limits that to
        structural differences (float values are then trusted not to change the pattern).

    Attributes
    ----------
    pattern : asd.SparsityPattern
    coloring : asd.Coloring
    ncolors : int
    mode : str
    timings : dict
        Seconds spent in ``detection`` and ``coloring`` while preparing.
    last_check : asd.checks.CheckReport or None
        The outcome of the latest probe.
    """

    _what = "this SparseJacobian"

    def _needs_reverse(self) -> bool:
        """Whether plain reverse mode being wrong leaves no evaluation: forward mode is wrong too."""
        return "forward" in self.unsafe

    def __init__(self, f: Callable, x: torch.Tensor, *, mode: str = "auto", coloring: str | None = None,
                 order: str = "natural", batch_size: int | None = None, compile: bool | str = False,
                 local: bool = False, strict: bool = False, pattern=None, backend: Backend | None = None,
                 check: bool | str | None = None, args: tuple = (), kwargs: dict | None = None,
                 trace: bool | None = None):
        with unhooked():
            from .detection import jacobian_pattern

            x = example_input(x)  # a numpy array as a tensor
            self._bind_input(f, x, batch_size=batch_size, compile=compile, local=local, strict=strict, args=args,
                             kwargs=kwargs)
            fx = self._bound(f)
            check_choice("mode", mode, MODES)
            if coloring is not None:
                check_choice("coloring (of a Jacobian)", coloring, JACOBIAN_COLORINGS)

            def conform(P: SparsityPattern) -> SparsityPattern:
                if P.shape[1] != x.numel():
                    raise InputError(f"the given pattern has {P.shape[1]} columns but x has {x.numel()} elements")
                with torch.no_grad():
                    y = fx(x)
                m = y.numel() if isinstance(y, torch.Tensor) else None
                if m != P.shape[0]:
                    raise InputError(f"the given pattern has {P.shape[0]} rows but f(x) has "
                                     f"{m if m is not None else 'no tensor'} elements")
                return P.with_shapes(tuple(x.shape), tuple(y.shape))

            self._prepare_pattern(lambda: jacobian_pattern(fx, x, local=local, strict=strict, return_info=True), pattern,
                                  conform)
            problem = coloring or {"forward": "column", "reverse": "row"}.get(mode)
            explicit = problem is not None
            if problem is None and "forward" in self.unsafe:
                problem = "row"
            elif problem is None and "batched_reverse" in self.unsafe:
                problem = "column"
            result = self._choose_coloring(lambda: choose_jacobian(self.pattern, problem, order,
                                                                   prefer="column" if compile else "row"))
            _warn_if_dense(result, self.pattern)
            self._order = order
            self._trust_arg_values = check is False and not checks_forced()
            check = _check_option(check, default=self._default_check(local))
            self._setup(self._flat(f), result, x, backend, batch_size, compile, check, trace, explicit=explicit)
            loop = AutogradLoop()
            # reverse mode only: forward-mode AD runs Python reference kernels that import
            # torch._dynamo themselves
            if backend is None and not compile and _torch_func_cold() and "forward" not in loop.ad_modes(self.coloring):
                self._start_warmup(loop, limit=1)  # the same AD mode, without torch.func

    def _flat(self, f: Callable) -> Callable:
        return flatten_function(self._bound(f), self.shape)

    @property
    def mode(self) -> str:
        """``"forward"``, ``"reverse"`` or ``"bidirectional"``: the kind of products evaluated."""
        return _MODE_OF[type(self.coloring)]

    def _fallbacks(self):
        from .coloring import color

        first = self.coloring
        others = [p for p in ("column", "row") if p != first.problem]

        def other_mode(problem):
            def make():
                c = color(self.pattern, problem, order=self._order)
                return c, default_backend(c, batch_size=self._options["batch_size"])
            return make

        def loop(problem):
            def make():
                return (first if problem == first.problem else color(self.pattern, problem, order=self._order),
                        AutogradLoop())
            return make

        # the row loop (one plain VJP per color) comes last: it needs no transform and no forward mode
        return [other_mode(p) for p in others] + [loop(p) for p in (first.problem, *others)]

    def __repr__(self) -> str:
        m, n = self.pattern.shape
        return (f"SparseJacobian(shape=({m}, {n}), nnz={self.pattern.nnz}, mode={self.mode!r}, "
                f"ncolors={self.ncolors})")


class SparseHessian(_SparseOperator):
    """A reusable sparse Hessian of the scalar function ``f`` for inputs shaped like ``x``.

    Parameters
    ----------
    f
        Function of one tensor returning a tensor with one element.
    x
        Example input: fixes shape, dtype and device.
    coloring
        ``"star"`` (direct decompression), ``"acyclic"`` (fewer colors, substitution) or ``None``:
        star, unless acyclic needs fewer colors (and, off the CPU, its substitution has at most
        ``MAX_GPU_SUBSTITUTION_LEVELS`` sequential levels). Below float64 the default is always
        star: substitution accumulates rounding errors on small entries (so too where ``f``
        computes in float32 on a float64 ``x``: the trace's dtypes count). Substitution's rounding is
        bounded at the first call, at checked calls and at every one-off call
        (:mod:`asd.decompression.precision`): where some entries may hold more than a check
        tolerates (a large entry feeding a chain of small ones), an :class:`asd.PrecisionWarning`,
        and with ``coloring=None`` the operator colors again with star and evaluates anew.
        ``check=False`` skips the bound.
    order
        Vertex order of the coloring (see :data:`asd.coloring.ORDERS`, or ``"best"``).
    hvp
        ``"forward_over_reverse"`` (``jvp`` of ``grad``), ``"reverse_over_forward"`` (``grad`` of
        ``jvp``: often faster eagerly, but PyTorch's double-backward formulas of a few ops
        (``cumprod`` at a zero) give NaN where forward-over-reverse is exact) or ``"auto"`` (the
        default: forward-over-reverse, unless one of ``f``'s ops has a PyTorch formula known to be
        wrong in it (:mod:`asd.detection.ad_gaps`); then the first flavour that avoids it, down to
        reverse-over-reverse and the plain autograd loop). An explicit flavour that would be wrong
        is replaced with an :class:`asd.ADGapWarning`. With ``"auto"`` on the CPU and at most
        :data:`LOOP_MAX_COLORS` colors, the calls before the batched products run as a recorded
        graph (see ``trace``) use double backward (the autograd loop), several times faster eagerly;
        so does every call where no graph is recorded.
    batch_size, compile, local, strict, pattern, backend, check, args, kwargs, trace
        As for :class:`SparseJacobian`.
    reuse
        ``False``: the operator is prepared for one evaluation (as :func:`asd.sparse_hessian` does
        where it keeps no operator: ``cache=False``, ``local=True`` or ``pattern=``). With
        ``coloring=None``, a large pattern of a cheap function then takes star without coloring
        acyclic (:func:`asd.coloring.choose.one_call_prefers_star`): an acyclic coloring's
        substitution plan and rounding bound cost more there than the products it saves, and
        are paid back only by later calls. Default ``True``.

    Attributes
    ----------
    pattern : asd.SparsityPattern
        Symmetric pattern, both triangles.
    coloring : asd.Coloring
    ncolors : int
    timings : dict
    """

    _what = "this SparseHessian"

    def _needs_reverse(self) -> bool:
        """Every Hessian-vector product differentiates a gradient: plain reverse mode is needed."""
        return True

    def __init__(self, f: Callable, x: torch.Tensor, *, coloring: str | None = None, order: str = "natural",
                 hvp: str = "auto", batch_size: int | None = None, compile: bool | str = False,
                 local: bool = False, strict: bool = False, pattern=None, backend: Backend | None = None,
                 check: bool | str | None = None, args: tuple = (), kwargs: dict | None = None,
                 trace: bool | None = None, reuse: bool = True):
        with unhooked():
            from .coloring import symmetric_pattern
            from .detection import hessian_pattern

            x = example_input(x)  # a numpy array as a tensor
            self._bind_input(f, x, batch_size=batch_size, compile=compile, local=local, strict=strict, args=args,
                             kwargs=kwargs)
            fx = self._bound(f)
            reuse = check_bool("reuse", reuse)
            if coloring is not None:
                check_choice("coloring (of a Hessian)", coloring, HESSIAN_COLORINGS)
            check_choice("hvp", hvp, HVP_MODES)
            def conform(P: SparsityPattern) -> SparsityPattern:
                if P.shape != (x.numel(), x.numel()):
                    raise InputError(f"a Hessian pattern must be ({x.numel()}, {x.numel()}), got {P.shape}")
                return symmetric_pattern(P).with_shapes(tuple(x.shape), tuple(x.shape))

            self._prepare_pattern(lambda: hessian_pattern(fx, x, local=local, strict=strict, return_info=True), pattern,
                                  conform)
            # off the CPU, substitution runs level by level: worth it only for shallow trees
            one_call = not reuse and self.trace_info is not None
            # float64 arithmetic throughout: x's dtype, and no coarser one inside f (f computing in float32
            # on a float64 x has float32's rounding in its products, which substitution would accumulate)
            exact = x.dtype == torch.float64 and not (self.trace_info is not None
                                                      and self.trace_info.computes_coarser_than(torch.float64))
            result = self._choose_coloring(lambda: choose_hessian(
                self.pattern, coloring, order, exact_arithmetic=exact,
                max_levels=None if x.device.type == "cpu" else MAX_GPU_SUBSTITUTION_LEVELS,
                one_call_elements=self.trace_info.elements if one_call else None))
            _warn_if_dense(result, self.pattern)
            explicit = hvp != "auto"
            self._hvp = "forward_over_reverse" if hvp == "auto" else hvp
            self._g = self._flat(f)
            self._compile = compile
            self._trust_arg_values = check is False and not checks_forced()
            # substitution's rounding is screened at every call unless check=False;
            # an operator that chose acyclic itself may choose again (star), with what _setup needs
            self._screening = check is not False or checks_forced()
            self._rechoose = (order, batch_size, trace, explicit) if coloring is None and backend is None else None
            check = _check_option(check, default=self._default_check(local))
            self._setup(self._g, result, x, backend, batch_size, compile, check, trace, hvp=HVP_BACKENDS[self._hvp],
                        explicit=explicit)
            if not explicit and backend is None and not compile:
                self._default_warmup(x)

    def _default_warmup(self, x: torch.Tensor) -> None:
        if x.device.type == "cpu" and 0 < self.ncolors <= LOOP_MAX_COLORS:
            self._start_warmup(AutogradLoop())
        elif _torch_func_cold():
            self._start_warmup(AutogradLoop(), limit=1)

    def _screen(self, x: torch.Tensor, values: torch.Tensor) -> bool:
        """Substitution's rounding (:func:`asd.decompression.precision.substitution_excess`), at every
        call (the bound of the walk that solved the values, on the CPU): beyond what a check
        tolerates, a :class:`asd.PrecisionWarning`, and an operator that chose the acyclic coloring
        itself colors again with star (direct). The rounding follows the values: a point where a
        large entry feeds a chain of small ones may come at any call."""
        if not isinstance(self.coloring.plan, SubstitutionPlan) or not self._screening:
            return False
        from .decompression.precision import judge_substitution

        def recolor() -> int:
            order, batch_size, trace, explicit = self._rechoose
            result = self._choose_coloring(lambda: choose_hessian(self.pattern, "star", order, exact_arithmetic=True,
                                                                  max_levels=None))
            # (the prepared point, not this call's: inside a transform x is a wrapped tensor, and a
            # vmap's would keep its whole batch alive under the operator)
            self._setup(self._g, result, self._x0.reshape(self.shape), None, batch_size, self._compile,
                        self.check_mode, trace, hvp=HVP_BACKENDS[self._hvp], explicit=explicit)
            self._rechoose = None
            self._with_grad = None  # value_grad_hessian's products: on the new coloring's seeds
            if not explicit and not self._compile:
                self._default_warmup(x)
            return self.ncolors

        return judge_substitution(self.coloring.plan, self.coloring.pattern, values, self.ncolors,
                                  None if self._rechoose is None else recolor, stacklevel=4,
                                  excess=self.decompressor.excess(values))

    def _fallbacks(self):
        coloring = self.coloring
        batch_size = self._options["batch_size"]
        flavours = [cls for name, cls in HVP_BACKENDS.items() if name != self.hvp] + [ReverseOverReverseHVP]
        return ([(lambda cls=cls: (coloring, default_backend(coloring, batch_size=batch_size, hvp=cls)))
                 for cls in flavours] + [lambda: (coloring, AutogradLoop())])

    def _flat(self, f: Callable) -> Callable:
        return scalar_function(self._bound(f), self.shape)

    @property
    def hvp(self) -> str:
        """The Hessian-vector-product flavour evaluated now: ``"forward_over_reverse"``,
        ``"reverse_over_forward"``, ``"reverse_over_reverse"`` or ``"double_backward"`` (the
        autograd loop); it differs from the one asked for where that would meet an AD gap."""
        backend = getattr(self, "backend", None)
        return _HVP_NAMES.get(type(getattr(backend, "inner", backend)), self._hvp)

    def value_grad_hessian(self, x: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(f(x), grad f(x), Hessian)``: from one batched forward-over-reverse evaluation when that
        is the operator's strategy, otherwise the Hessian and one gradient evaluation.

        The gradient has ``x``'s shape; the Hessian is ``torch.sparse_csr``.
        """
        with unhooked():
            x = self._check(x)
            call_args, changed = self._call_with(args, kwargs)
            with EVAL_LOCK:  # the strategy read here is the one evaluated: another thread's call may recolor
                return self._value_grad_hessian(x, call_args, changed, args, kwargs)

    def _value_grad_hessian(self, x, call_args, changed: bool, args, kwargs):
        one_pass = (self._settled and self.ncolors > 0 and not self._warming(x)
                    and isinstance(getattr(self.backend, "inner", self.backend), ForwardOverReverseHVP))
        if not one_pass:
            H = self.values(x, *args, **kwargs)
            with self._guard.protect(args=call_args):
                self._call_args = call_args
                grad, value = _grad_and_value(self._g, _private(x))
            return value, grad.reshape(self.shape), self.decompressor.csr(H)
        if self._with_grad is None:
            self._with_grad = BatchedProducts(value_grad_hvp(self._g), self.coloring.seeds(x.dtype, x.device),
                                              batch_size=self.batch_size, compile=self._compile)
        xf = _private(x)
        parts, value, grad = [], None, None
        with self._guard.protect(args=call_args):
            self._call_args = call_args
            for seeds in self._with_grad.chunks():
                value, grad, hs = self._with_grad.run(xf, seeds)
                parts.append(hs.reshape(-1))
        vals = self.decompressor.values(torch.cat(parts) if len(parts) > 1 else parts[0]).to(self.dtype)
        if self._screen(x, vals):
            return self.value_grad_hessian(x, *args, **kwargs)
        if changed or self.check_mode is True or (self.check_mode == "first" and not self._checked):
            self._verify(x, vals, call_args)
            if changed:
                self._checked_with(call_args)
        return value, grad.reshape(self.shape), self.decompressor.csr(vals)

    def __repr__(self) -> str:
        n = self.pattern.shape[0]
        return (f"SparseHessian(shape=({n}, {n}), nnz={self.pattern.nnz}, coloring={self.coloring.problem!r}, "
                f"ncolors={self.ncolors})")
