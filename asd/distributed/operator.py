"""Distributed sparse derivative operators: color batches split over the ranks of a process group.

Rank 0 detects the pattern and colors it (through :class:`asd.SparseJacobian` /
:class:`asd.SparseHessian`) and broadcasts the pattern and the coloring; every rank then
evaluates a contiguous block of seed rows with the same batched product function as one process
(:meth:`~asd.backends.base.SingleDirection.batched`) on fewer seeds at once. Every product then
has the bits of one process wherever a product does not depend on how many seeds ``vmap``
batches (elementwise and indexing code, as in the benchmark problems; a batched BLAS reduction
may round differently in the last bit).

* Direct plans (column, row, bidirectional, star): each rank reads the CSR values its products
  own and only those values travel.
* Substitution plans (acyclic): the compressed shares are gathered and substituted on every rank
  that returns values (substitution reads the whole buffer).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import singledispatch
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

import warnings

from ..backends import HVP_BACKENDS, BatchedProducts, ForwardJVP, ReverseVJP, flatten_function, scalar_function
from ..backends.hvp import ReverseOverReverseHVP
from ..coloring.result import ColumnSeeds
from ..decompression.device import Decompressor, handed_out
from ..decompression.plans import DirectPlan, SubstitutionPlan
from ..detection.jacobian import check_input
from .. import arg_values
from ..cache import fingerprint
from ..checks import probe
from ..decompression.precision import judge_substitution
from ..errors import ADGapWarning, AsdError, CheckError, InputError
from ..guards import ModuleStateGuard
from ..memory import auto_batch_size
from ..operators import (_WRITES_ANYWAY, EVAL_LOCK, HVP_MODES, SparseHessian, SparseJacobian, _check_call_input,
                         _copying_input, _WritesInput, check_context, run_on_copy)
from ..options import check_batch_size, check_choice, check_compile
from ..patterns import SparsityPattern
from . import layout
from .layout import AllGather, AllToAll, Exchange, GatherToRoot

__all__ = ["Replicated", "Rows", "Root", "OUTPUTS", "DistributedOperator", "DistributedJacobian",
           "DistributedHessian"]


@dataclass(frozen=True)
class Replicated:
    """The full matrix on every rank."""


@dataclass(frozen=True)
class Rows:
    """Rows ``row_range`` of the matrix on each rank (rows split evenly, in rank order)."""


@dataclass(frozen=True)
class Root:
    """The full matrix on rank 0; ``None`` on the other ranks."""


#: the ``output=`` option
OUTPUTS = {"replicated": Replicated(), "rows": Rows(), "root": Root()}


class PreparationFailed(AsdError):
    """Rank 0 could not prepare the operator (the other ranks raise this)."""


@dataclass(frozen=True)
class _Prepared:
    """What rank 0 broadcasts: the detected pattern, its coloring and the input it was prepared for."""

    pattern: SparsityPattern
    coloring: object
    shape: tuple
    dtype: torch.dtype
    unsafe: dict  # AD modes the trace ruled out (asd.detection.ad_gaps.unsafe_modes)


#: options of the single-process operators that a distributed operator does not take
_REFUSED = {"backend": "the products always use the coloring's vmap backend",
            "check": "check one process with asd.prepare_jacobian / asd.prepare_hessian instead",
            "trace": "the products are evaluated eagerly"}


def _refuse(options: dict) -> None:
    for name in options:
        if name in _REFUSED:
            raise InputError(f"asd.distributed does not take the {name}= option ({_REFUSED[name]}); remove it")


def _group_info(group):
    if not (dist.is_available() and dist.is_initialized()):
        raise InputError("asd.distributed needs an initialized torch.distributed process group: call "
                         "torch.distributed.init_process_group(...) on every rank first (torchrun sets up "
                         "the environment for init_process_group()), or use asd.prepare_jacobian / "
                         "asd.prepare_hessian in a single process")
    try:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    except Exception as exc:  # noqa: BLE001 - torch raises different types across versions
        raise InputError(f"group must be a torch.distributed process group this rank belongs to, got {group!r}") from exc
    if rank < 0:
        raise InputError("this rank is not a member of group: call asd.distributed only on the group's ranks")
    src = 0 if group is None else dist.get_global_rank(group, 0)
    return rank, world, src


def _broadcast_preparation(make: Callable, x: torch.Tensor, group, rank: int, src: int) -> _Prepared:
    """``make()`` (an asd operator) on rank 0; its pattern and coloring on every rank. A failure on
    rank 0 raises there and, as :class:`PreparationFailed`, on every other rank."""
    box: list = [None]
    error = None
    if rank == 0:
        try:
            op = make()
            box[0] = _Prepared(op.pattern, op.coloring, tuple(x.shape), x.dtype, dict(op.unsafe))
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the other ranks are told
            error = exc
            box[0] = f"{type(exc).__name__}: {exc}"
    device = x.device if x.device.type == "cuda" else None
    dist.broadcast_object_list(box, src=src, group=group, device=device)
    if error is not None:
        raise error
    if isinstance(box[0], str):
        raise PreparationFailed(f"rank 0 failed to prepare the operator: {box[0]}")
    prepared: _Prepared = box[0]
    own = prepared.shape == tuple(x.shape) and prepared.dtype == x.dtype
    # every rank learns whether some rank's x differs (one raising alone would leave the others
    # waiting in their first call's collective)
    stamps = [None] * dist.get_world_size(group)
    with _on_device(x.device):
        dist.all_gather_object(stamps, stamp(x, torch.float64) if own else None, group=group)
    if not own:
        raise InputError(f"every rank must pass the same x: rank 0 has shape {prepared.shape} and dtype "
                         f"{prepared.dtype}, this rank {tuple(x.shape)} and {x.dtype}")
    if any(s is None for s in stamps):
        raise InputError(f"every rank must pass the same x: rank(s) {[r for r, s in enumerate(stamps) if s is None]} "
                         "passed another shape or dtype (their own error is raised there)")
    if len(set(stamps)) > 1:
        raise InputError("every rank must pass the same x: the ranks' values differ")
    return prepared


def _on_device(device: torch.device):
    """The CUDA device of ``x`` made current around an object collective: NCCL runs those on the
    current device, which is cuda:0 on every rank that did not call ``torch.cuda.set_device``."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def stamp(x: torch.Tensor, dtype: torch.dtype, extra: int = 0) -> float:
    """A number at least 1 that differs between different bit patterns of ``x`` (and different
    ``extra``, a digest of the call's extra arguments) but for chance (about 2^-p, ``p`` the mantissa
    bits of ``dtype``, in which it is exact): what each rank sends beside its products, to find
    ranks called with different inputs."""
    h = arg_values.bits_digest(x)
    bits = int(round(-math.log2(torch.finfo(dtype).eps)))
    return float((h * 1000003 + extra) % (1 << bits) + 1)


def _row_lengths(coloring) -> np.ndarray:
    shp = coloring.plan.compressed_shape
    blocks = shp if shp and isinstance(shp[0], tuple) else (shp,)
    return np.concatenate([np.full(int(k), int(length), dtype=np.int64) for k, length in blocks])


@singledispatch
def _exchange(output, plan, coloring, S: layout.Shares, rank: int) -> Exchange:
    raise TypeError(f"no exchange for output {output!r}")


@_exchange.register
def _(output: Replicated, plan, coloring, S, rank):
    if isinstance(plan, DirectPlan):
        return layout.direct_all_gather(plan.gather, S, rank)
    return layout.buffer_all_gather(S, rank)


@_exchange.register
def _(output: Root, plan, coloring, S, rank):
    if isinstance(plan, DirectPlan):
        return layout.direct_to_root(plan.gather, S, rank)
    return layout.buffer_to_root(S, rank)


@_exchange.register
def _(output: Rows, plan, coloring, S, rank):
    if isinstance(plan, DirectPlan):
        return layout.direct_to_rows(plan.gather, coloring.rows(), coloring.indptr, coloring.shape[0], S, rank)
    return layout.buffer_all_gather(S, rank)  # substitution needs the whole buffer on every rank


@singledispatch
def _communicate(ex: Exchange, payload: torch.Tensor, group, src: int, rank: int, world: int):
    """``(received buffer or None, elements sent to other ranks, elements received from them)``."""
    raise TypeError(f"no collective for {type(ex).__name__}")


@_communicate.register
def _(ex: AllGather, payload, group, src, rank, world):
    parts = [torch.empty_like(payload) for _ in range(world)]
    dist.all_gather(parts, payload, group=group)
    return torch.cat(parts), (world - 1) * ex.width, (world - 1) * ex.width


@_communicate.register
def _(ex: GatherToRoot, payload, group, src, rank, world):
    parts = [torch.empty_like(payload) for _ in range(world)] if rank == 0 else None
    dist.gather(payload, parts, dst=src, group=group)
    if rank == 0:
        return torch.cat(parts), 0, (world - 1) * ex.width
    return None, ex.width, 0


@_communicate.register
def _(ex: AllToAll, payload, group, src, rank, world):
    out = payload.new_empty(sum(ex.recv_splits))
    dist.all_to_all_single(out, payload, list(ex.recv_splits), list(ex.send_splits), group=group)
    sent = sum(ex.send_splits) - ex.send_splits[rank]
    received = sum(ex.recv_splits) - ex.recv_splits[rank]
    return out, sent, received


def _t(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.int64)).to(device)


class DistributedOperator:
    """A sparse derivative whose color batches are split over the ranks of a process group.

    Built by :func:`asd.distributed.prepare_jacobian` / :func:`asd.distributed.prepare_hessian`
    on every rank; calling it is a collective: every rank must call it, with the same ``x``.

    Attributes
    ----------
    pattern : asd.SparsityPattern
    coloring : asd.Coloring
    output : Replicated, Rows or Root
    rank, world_size : int
        This rank's index in the group and the group's size.
    color_range : tuple of int
        The colors (seed rows of the flat compressed buffer) this rank evaluates.
    row_range : tuple of int
        The rows this rank returns with ``output="rows"``.
    last_call_bytes : int
        Bytes this rank sent to and received from other ranks in the latest call (payload,
        padding and status slots included; 0 before the first call).
    last_call_bytes_sent, last_call_bytes_received : int
    """

    _what = "this distributed operator"

    def __init__(self, f: Callable, x: torch.Tensor, make: Callable, flat: Callable, *, output: str, group,
                 batch_size, compile: bool | str, args: tuple, kwargs: dict | None, options: dict):
        check_input(x)
        rank, world, src = _group_info(group)
        check_choice("output", output, tuple(OUTPUTS))
        self._always_checked = options.get("local", False) is True or options.get("pattern") is not None
        if self._always_checked and output == "rows":
            raise InputError("asd.distributed with local=True or a given pattern= checks every call's values with "
                             "a probe, which needs the whole matrix on a rank: use output='replicated' or 'root'")
        batch_size = check_batch_size(batch_size)
        check_compile(compile)
        check_context(x)
        if not isinstance(args, tuple):
            raise TypeError(f"args must be a tuple of f's extra arguments, got {type(args).__name__}")
        prepared = _broadcast_preparation(make, x, group, rank, src)
        self.f = f
        self.group, self.rank, self.world_size, self._src = group, rank, world, src
        self.output = OUTPUTS[output]
        self.pattern, self.coloring = prepared.pattern, prepared.coloring
        self.unsafe = prepared.unsafe
        self.shape, self.dtype, self.device = tuple(x.shape), x.dtype, x.device
        self._prepared_args = (args, dict(kwargs or {}))
        self._call_args = self._prepared_args
        self._args_fingerprint = fingerprint(self._prepared_args)
        self._args_snapshot = arg_values.snapshot(self._prepared_args)
        self._guard = ModuleStateGuard(f)
        g = flat(lambda z: f(z, *self._call_args[0], **self._call_args[1]), self.shape)

        coloring = self.coloring
        S = layout.shares(_row_lengths(coloring), world)
        self._shares = S
        a, b = int(S.colors[rank]), int(S.colors[rank + 1])
        self.color_range = (a, b)
        if batch_size == "auto":
            m, n = coloring.shape
            batch_size = auto_batch_size(b - a, n, m, x.element_size(), x.device)
        self.batch_size = batch_size
        self._share = (x, a, b, batch_size, compile)  # what the products are made of, for _local_products
        self._products = self._share_products(g, *self._share)
        self._g = g
        rb = layout.row_bounds(coloring.shape[0], world)
        self.row_range = (int(rb[rank]), int(rb[rank + 1]))
        self.decompressor = Decompressor(coloring, x.device)
        ex = _exchange(self.output, coloring.plan, coloring, S, rank)
        self._exchange = ex
        self._send, self._take = _t(ex.send, x.device), _t(ex.take, x.device)
        self._flags = _t(ex.flags, x.device)
        self.last_call_bytes = self.last_call_bytes_sent = self.last_call_bytes_received = 0

    def _share_products(self, g, x, a: int, b: int, batch_size, compile) -> list[BatchedProducts]:
        """Batched products of colors ``a:b`` of the flat buffer, block by block of the coloring."""
        out, start = [], 0
        for block in self.coloring.seed_blocks(x.dtype, x.device):
            k = int(block.matrix.shape[0])
            lo, hi = max(a - start, 0), min(b - start, k)
            if hi > lo:
                backend = self._backend_for(block)
                out.append(BatchedProducts(backend.batched(g, self.coloring), block.matrix[lo:hi],
                                           batch_size=batch_size, compile=compile))
            start += k
        return out

    def _backend_for(self, block):
        """The single-direction backend whose ``batched`` products evaluate ``block``'s seeds."""
        raise NotImplementedError

    def _safe(self, candidates: list, explicit: bool = False):
        """The first backend of ``candidates`` that needs none of the AD modes the trace ruled out
        (:mod:`asd.detection.ad_gaps`); an explicit first choice that is passed over warns. Batched
        products are all a distributed operator evaluates: with none safe, it refuses."""
        for i, cls in enumerate(candidates):
            clash = sorted(set(cls.modes) & set(self.unsafe))
            if not clash:
                if i and explicit:
                    warnings.warn(f"asd: {candidates[0].name} would be wrong for this function: "
                                  f"{self.unsafe[sorted(set(candidates[0].modes) & set(self.unsafe))[0]]}; "
                                  f"using {cls.name}", ADGapWarning, stacklevel=5)
                return cls()
        mode = sorted(set(candidates[-1].modes) & set(self.unsafe))[0]
        raise InputError(f"{self._what} evaluates batched products, and every one it has would be wrong for this "
                         f"function: {self.unsafe[mode]} ({mode} mode). Use asd.prepare_jacobian / "
                         "asd.prepare_hessian in one process, which falls back to plain autograd.")

    @property
    def ncolors(self) -> int:
        """Number of products per evaluation, over all ranks."""
        return int(self.coloring.ncolors)

    @property
    def local_ncolors(self) -> int:
        """Number of products this rank evaluates."""
        return self.color_range[1] - self.color_range[0]

    def _local_products(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's products at a private copy of ``x``. A function that writes into its input
        (every rank runs the same ``f`` at the same ``x``, so every rank sees it) is called on a
        copy made inside the call from then on, with new seed rows, as in
        :meth:`asd.SparseJacobian._evaluate`."""
        try:
            return run_on_copy(self._local, x, getattr(self._g, "copies_input", False))
        except _WritesInput:
            if getattr(self._g, "copies_input", False):
                raise AsdError(_WRITES_ANYWAY) from None
        self._g = _copying_input(self._g)
        self._products = self._share_products(self._g, *self._share)
        try:
            return run_on_copy(self._local, x, True)
        except _WritesInput:
            raise AsdError(_WRITES_ANYWAY) from None

    def _local(self, xf: torch.Tensor) -> torch.Tensor:
        parts = [p(xf) for p in self._products]
        if not parts:
            return xf.new_zeros(0)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def values(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor | None:
        """The stored values of the output (a collective: every rank calls it with the same ``x``).

        ``output="replicated"``: every value, CSR order of :attr:`pattern`; ``"rows"``: the values of
        rows :attr:`row_range`; ``"root"``: every value on rank 0, ``None`` elsewhere. ``args`` /
        ``kwargs`` replace ``f``'s extra arguments for this call.
        """
        failure, local = None, None
        pair = (tuple(args), dict(kwargs)) if args or kwargs else self._prepared_args
        try:  # decided before anything can fail: every rank called alike joins the same collectives
            checked = self._checks(pair)
        except Exception:  # noqa: BLE001 - arguments the fingerprint cannot read are checked
            checked = True
        digest = 0
        try:  # a failure travels in the status slot: raised before the exchange, the others would wait forever
            digest = self._digest(pair)
            if isinstance(x, np.ndarray):
                raise InputError(f"{self._what} takes a torch.Tensor of shape {self.shape} (a collective), got a "
                                 "numpy array: convert it with torch.from_numpy")
            _check_call_input(x, self.shape, self.dtype, self.device, self._what)
            with EVAL_LOCK, self._guard.protect(args=pair):
                self._call_args = pair
                local = self._local_products(x)
        except Exception as exc:  # noqa: BLE001 - raised after the exchange, so no rank waits forever
            failure = exc
        if failure is not None:
            local = torch.zeros(self._shares.size(self.rank), dtype=self.dtype, device=self.device)
        # the status slot: -1 for a failure, else a stamp of x, the same on every rank called alike
        status = -1.0 if failure is not None else stamp(x, self.dtype, digest)
        flag = torch.full((1,), status, dtype=self.dtype, device=self.device)
        payload = torch.cat([local.detach().to(self.dtype), flag]).index_select(0, self._send)
        received, sent, got = _communicate(self._exchange, payload, self.group, self._src, self.rank,
                                           self.world_size)
        item = payload.element_size()
        self.last_call_bytes_sent, self.last_call_bytes_received = sent * item, got * item
        self.last_call_bytes = self.last_call_bytes_sent + self.last_call_bytes_received
        values, error = None, failure
        if failure is None and received is not None:
            flags = received.index_select(0, self._flags)
            failed = torch.nonzero(flags < 0).reshape(-1).tolist()
            if failed:
                error = AsdError(f"rank(s) {failed} of the group failed to evaluate their products (their own "
                                 "error is raised there)")
            elif bool((flags != flags[0]).any()):
                error = InputError(f"{self._what} was called with different x (or extra arguments) on different "
                                   "ranks (a collective: every rank must pass the same ones); their products do "
                                   "not make one matrix")
            else:
                values = self._finish(received.index_select(0, self._take))
        if checked:
            error = self._verdict(x, values, error)
        if error is not None:
            raise error
        return values

    def _digest(self, pair: tuple) -> int:
        """:func:`asd.arg_values.digest` of the call's extra arguments, every call (a prepared tensor
        argument may have been written since)."""
        return arg_values.digest(pair)

    def _checks(self, pair: tuple) -> bool:
        """Whether the probe checks this call: a pattern that holds at a point (``local=True``) or is
        the user's, or extra arguments other than those the pattern was detected with (a pattern may
        follow their structure or values), as in one process."""
        if self._always_checked:
            return True
        if pair is self._prepared_args:
            return False
        return fingerprint(pair) != self._args_fingerprint or not arg_values.same(pair, self._args_snapshot)

    def _verdict(self, x: torch.Tensor, values, error):
        """The probe's verdict on this call's values (:func:`asd.checks.probe`), the same on every
        rank: each rank of a replicated output probes the same values; rank 0 of a root output
        probes and sends its verdict (a collective every rank joins)."""
        verdict = error
        if isinstance(self.output, Rows):
            return error or InputError(
                f"{self._what} was called with extra arguments other than the prepared ones, which may change "
                "the pattern: their values are checked by a probe, which needs the whole matrix on a rank; use "
                "output='replicated' or 'root', or prepare the operator with these arguments")
        if error is None and values is not None:
            try:
                report = probe(self, x, values)
                if not report.ok:
                    verdict = CheckError(f"{self._what} failed its cross-mode check at this x ({report}): the "
                                         "sparsity pattern does not hold here (local=True, a given pattern, or "
                                         "extra arguments that change it); prepare the operator again")
            except Exception as exc:  # noqa: BLE001 - told to the other ranks as a failed check
                verdict = exc
        if isinstance(self.output, Root):
            box = [None if verdict is None else f"{type(verdict).__name__}: {verdict}"]
            with _on_device(self.device):
                dist.broadcast_object_list(box, src=self._src, group=self.group)
            if verdict is None and box[0] is not None:
                verdict = CheckError(f"rank 0 could not vouch for this call's values: {box[0]}")
        return verdict

    def _finish(self, assembled: torch.Tensor) -> torch.Tensor:
        if isinstance(self.coloring.plan, SubstitutionPlan):
            values = self.decompressor.values(assembled)
            # substitution's rounding, at every call as in one process (warned only)
            judge_substitution(self.coloring.plan, self.coloring.pattern, values, self.ncolors, stacklevel=4,
                               excess=self.decompressor.excess(values))
            if isinstance(self.output, Rows):
                lo, hi = (int(self.coloring.indptr[r]) for r in self.row_range)
                return values[lo:hi]
            return values
        return assembled

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor | None:
        """The derivative at ``x`` as ``torch.sparse_csr`` (a collective, see :meth:`values`): the
        full matrix, this rank's row block (shape ``(rows, n)`` for rows :attr:`row_range`), or the
        full matrix on rank 0 and ``None`` elsewhere."""
        values = self.values(x, *args, **kwargs)
        if values is None:
            return None
        if isinstance(self.output, Rows):
            r0, r1 = self.row_range
            crow = self.decompressor.crow[r0:r1 + 1]
            col = handed_out(self.decompressor.col[int(crow[0]):int(crow[-1])])
            return torch.sparse_csr_tensor(crow - crow[0], col, values, size=(r1 - r0, self.coloring.shape[1]),
                                           dtype=values.dtype, device=values.device, check_invariants=False)
        return self.decompressor.csr(values)

    def __reduce__(self):
        raise TypeError(f"a {type(self).__name__} belongs to one process group and cannot be pickled; prepare it "
                        "on every rank with asd.distributed.prepare_jacobian / prepare_hessian")

    def __repr__(self) -> str:
        m, n = self.coloring.shape
        return (f"{type(self).__name__}(shape=({m}, {n}), nnz={self.pattern.nnz}, "
                f"coloring={self.coloring.problem!r}, ncolors={self.ncolors}, rank={self.rank}/{self.world_size}, "
                f"colors={self.color_range}, output={type(self.output).__name__})")


class DistributedJacobian(DistributedOperator):
    """A sparse Jacobian evaluated over a process group (see :func:`asd.distributed.prepare_jacobian`)."""

    _what = "this DistributedJacobian"

    def __init__(self, f: Callable, x: torch.Tensor, *, output: str = "replicated", group=None,
                 batch_size: int | str | None = None, compile: bool | str = False, args: tuple = (),
                 kwargs: dict | None = None, **options):
        _refuse(options)

        def make():
            return SparseJacobian(f, x, args=args, kwargs=kwargs, check=False, trace=False, **options)

        super().__init__(f, x, make, flatten_function, output=output, group=group, batch_size=batch_size,
                         compile=compile, args=args, kwargs=kwargs, options=options)

    def _backend_for(self, block):
        return self._safe([ForwardJVP] if isinstance(block, ColumnSeeds) else [ReverseVJP])


class DistributedHessian(DistributedOperator):
    """A sparse Hessian evaluated over a process group (see :func:`asd.distributed.prepare_hessian`)."""

    _what = "this DistributedHessian"

    def __init__(self, f: Callable, x: torch.Tensor, *, output: str = "replicated", group=None,
                 hvp: str = "auto", batch_size: int | str | None = None, compile: bool | str = False,
                 args: tuple = (), kwargs: dict | None = None, **options):
        check_choice("hvp", hvp, HVP_MODES)
        self.hvp = hvp
        _refuse(options)

        def make():
            return SparseHessian(f, x, args=args, kwargs=kwargs, check=False, trace=False, **options)

        super().__init__(f, x, make, scalar_function, output=output, group=group, batch_size=batch_size,
                         compile=compile, args=args, kwargs=kwargs, options=options)

    def _backend_for(self, block):
        flavours = [*HVP_BACKENDS.values(), ReverseOverReverseHVP]
        if self.hvp != "auto":
            flavours.remove(HVP_BACKENDS[self.hvp])
            flavours.insert(0, HVP_BACKENDS[self.hvp])
        return self._safe(flavours, explicit=self.hvp != "auto")
