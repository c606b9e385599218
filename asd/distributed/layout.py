"""Who computes which colors and who sends which numbers: the index plans of a distributed call.

Pure numpy, computed once per operator and identical on every rank (each rank derives every
other rank's share from the broadcast coloring, so no sizes are exchanged per call).

The flat, batch-first compressed buffer of a coloring (see :mod:`asd.decompression.plans`) is
split into contiguous blocks of seed rows, one per rank (:class:`Shares`). Every rank sends a
*payload*: values indexed from its local buffer extended by one status slot (``1`` when its
products failed), with that slot as the payload's last element and as padding. An
:class:`Exchange` says which collective moves the payloads (:class:`AllGather`,
:class:`GatherToRoot` or :class:`AllToAll`), what this rank sends and how the received buffer is
read back (``take``) into the CSR values (direct plans) or the full compressed buffer
(substitution plans).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Shares", "AllGather", "GatherToRoot", "AllToAll", "Exchange", "shares", "row_bounds",
           "direct_all_gather", "direct_to_root", "direct_to_rows", "buffer_all_gather", "buffer_to_root"]

_I = np.int64


def _ro(a) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=_I)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Shares:
    """Contiguous blocks of seed rows: rank ``r`` computes colors ``colors[r]:colors[r+1]``, which
    fill the elements ``flat[r]:flat[r+1]`` of the flat compressed buffer."""

    colors: np.ndarray
    flat: np.ndarray

    @property
    def world(self) -> int:
        return len(self.colors) - 1

    def size(self, rank: int) -> int:
        """Elements of the compressed buffer that ``rank`` computes."""
        return int(self.flat[rank + 1] - self.flat[rank])

    def owner(self, flat_index: np.ndarray) -> np.ndarray:
        """The rank that computes each element of the flat compressed buffer."""
        return np.searchsorted(self.flat, flat_index, side="right").astype(_I) - 1


def shares(row_lengths, world: int) -> Shares:
    """Colors split as evenly as possible over ``world`` ranks, in the order of the flat buffer.

    ``row_lengths[c]`` is the length of color ``c``'s product (``m`` for a JVP, ``n`` for a VJP or
    an HVP).
    """
    lengths = np.asarray(row_lengths, dtype=_I)
    k = len(lengths)
    colors = np.array([r * k // world for r in range(world + 1)], dtype=_I)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(_I)
    return Shares(_ro(colors), _ro(offsets[colors]))


def row_bounds(nrows: int, world: int) -> np.ndarray:
    """Row blocks of ``output="rows"``: rank ``r`` gets rows ``b[r]:b[r+1]``."""
    return _ro([r * nrows // world for r in range(world + 1)])


@dataclass(frozen=True, eq=False)
class Exchange:
    """What this rank sends (indices into its local buffer extended by the status slot) and how the
    received buffer is read (``take``; ``flags`` are the status slots received)."""

    send: np.ndarray
    take: np.ndarray
    flags: np.ndarray


@dataclass(frozen=True, eq=False)
class AllGather(Exchange):
    """Payloads of ``width`` elements from every rank, stacked in rank order, on every rank."""

    width: int


@dataclass(frozen=True, eq=False)
class GatherToRoot(Exchange):
    """Payloads of ``width`` elements stacked in rank order on the root; ``take`` and ``flags``
    are empty on the other ranks."""

    width: int


@dataclass(frozen=True, eq=False)
class AllToAll(Exchange):
    """``send_splits[d]`` elements of the payload go to rank ``d``, ``recv_splits[q]`` come from ``q``."""

    send_splits: tuple
    recv_splits: tuple


def _within(groups: np.ndarray, ngroups: int) -> np.ndarray:
    """Index of every element among the elements of its group (in order of appearance)."""
    order = np.argsort(groups, kind="stable")
    counts = np.bincount(groups, minlength=ngroups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out = np.empty(len(groups), dtype=_I)
    out[order] = np.arange(len(groups), dtype=_I) - np.repeat(starts, counts)
    return out


def _stacked(owner: np.ndarray, local: np.ndarray, S: Shares, rank: int):
    """Fixed-width payloads of every rank's owned elements and where each element lands when the
    payloads are stacked in rank order."""
    counts = np.bincount(owner, minlength=S.world)
    width = int(counts.max(initial=0)) + 1
    mine = local[owner == rank]
    flag = S.size(rank)
    send = np.concatenate([mine, np.full(width - len(mine), flag, dtype=_I)])
    take = owner * width + _within(owner, S.world)
    flags = np.arange(S.world, dtype=_I) * width + width - 1
    return width, send, take, flags


def direct_all_gather(gather: np.ndarray, S: Shares, rank: int) -> AllGather:
    """Every rank sends the CSR values its colors own; every rank assembles all of them."""
    owner = S.owner(gather)
    width, send, take, flags = _stacked(owner, gather - S.flat[owner], S, rank)
    return AllGather(_ro(send), _ro(take), _ro(flags), width)


def direct_to_root(gather: np.ndarray, S: Shares, rank: int) -> GatherToRoot:
    """As :func:`direct_all_gather`, assembled on rank 0 only."""
    ex = direct_all_gather(gather, S, rank)
    empty = np.zeros(0, dtype=_I)
    return GatherToRoot(ex.send, _ro(ex.take if rank == 0 else empty), _ro(ex.flags if rank == 0 else empty), ex.width)


def direct_to_rows(gather: np.ndarray, entry_rows: np.ndarray, indptr: np.ndarray, nrows: int, S: Shares,
                   rank: int) -> AllToAll:
    """Every CSR value goes from the rank that computed it to the rank whose row block holds it;
    ``take`` gives this rank's block in CSR order."""
    W = S.world
    owner = S.owner(gather)
    dest = np.searchsorted(row_bounds(nrows, W), entry_rows, side="right").astype(_I) - 1
    pair = owner * W + dest
    counts = np.bincount(pair, minlength=W * W).reshape(W, W)  # counts[q, d]: from q to d
    local = gather - S.flat[owner]
    flag = S.size(rank)
    send, send_splits = [], []
    for d in range(W):  # entries are in CSR order inside each (owner, dest) pair
        send.append(local[pair == rank * W + d])
        send.append(np.array([flag], dtype=_I))
        send_splits.append(int(counts[rank, d]) + 1)
    recv_splits = [int(counts[q, rank]) + 1 for q in range(W)]
    offsets = np.concatenate([[0], np.cumsum(recv_splits)]).astype(_I)
    b = row_bounds(nrows, W)
    lo, hi = int(indptr[b[rank]]), int(indptr[b[rank + 1]])
    block_owner = owner[lo:hi]
    take = offsets[block_owner] + _within(block_owner, W)
    flags = offsets[1:] - 1
    return AllToAll(_ro(np.concatenate(send)), _ro(take), _ro(flags), tuple(send_splits), tuple(recv_splits))


def _buffer(S: Shares, rank: int):
    width = int(max(S.size(r) for r in range(S.world))) + 1
    size = S.size(rank)
    send = np.concatenate([np.arange(size, dtype=_I), np.full(width - size, size, dtype=_I)])
    total = int(S.flat[-1])
    idx = np.arange(total, dtype=_I)
    owner = S.owner(idx)
    take = owner * width + (idx - S.flat[owner])
    flags = np.arange(S.world, dtype=_I) * width + width - 1
    return width, send, take, flags


def buffer_all_gather(S: Shares, rank: int) -> AllGather:
    """Every rank sends its whole share of the compressed buffer; every rank assembles the buffer
    (for substitution, which reads it everywhere)."""
    width, send, take, flags = _buffer(S, rank)
    return AllGather(_ro(send), _ro(take), _ro(flags), width)


def buffer_to_root(S: Shares, rank: int) -> GatherToRoot:
    """As :func:`buffer_all_gather`, assembled on rank 0 only."""
    width, send, take, flags = _buffer(S, rank)
    empty = np.zeros(0, dtype=_I)
    return GatherToRoot(_ro(send), _ro(take if rank == 0 else empty), _ro(flags if rank == 0 else empty), width)
