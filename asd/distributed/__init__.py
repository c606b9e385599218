"""Distributed evaluation of sparse Jacobians and Hessians with ``torch.distributed``.

Imported explicitly (``import asd.distributed``); ``import asd`` does not load it.

Call :func:`prepare_jacobian` or :func:`prepare_hessian` on every rank of an initialized process
group (gloo for CPU processes, NCCL for GPUs; ``torchrun`` sets up the environment). Rank 0
detects the pattern and colors it once and broadcasts both; each rank evaluates a contiguous
block of the colors' products and decompresses the entries they own. Calling the operator is a
collective (every rank calls it, with the same ``x``) and returns, by ``output=``:

* ``"replicated"`` (default): the full ``torch.sparse_csr`` matrix on every rank;
* ``"rows"``: this rank's block of rows (``op.row_range``; rows split evenly in rank order), as a
  ``torch.sparse_csr`` of shape ``(rows, n)``;
* ``"root"``: the full matrix on rank 0, ``None`` on the others.

The values have the same bits as one process's :func:`asd.prepare_jacobian` /
:func:`asd.prepare_hessian` operator with the same flavour (for a Hessian, the explicit
``hvp=`` this operator runs: ``hvp="auto"`` in one process evaluates its first calls by double
backward) wherever a product does not depend on how many seeds are batched together (see
:mod:`asd.distributed.operator`): every product is computed by the same batched function.
Direct colorings (column, row, bidirectional, star) send only the CSR values; acyclic colorings
(substitution) send each rank's compressed products to the ranks that substitute. ``op.last_call_bytes``
counts the bytes a rank sent and received in its latest call.

Example (``torchrun --nproc_per_node=4 script.py``)::

    import torch, torch.distributed as dist
    import asd, asd.distributed
    dist.init_process_group("gloo")
    op = asd.distributed.prepare_jacobian(f, x)
    J = op(x)          # the same torch.sparse_csr on every rank
"""

from __future__ import annotations

from typing import Callable

import torch

from .operator import (OUTPUTS, DistributedHessian, DistributedJacobian, DistributedOperator, PreparationFailed,
                       Replicated, Root, Rows)

__all__ = ["prepare_jacobian", "prepare_hessian", "DistributedJacobian", "DistributedHessian",
           "DistributedOperator", "PreparationFailed", "OUTPUTS", "Replicated", "Rows", "Root"]


def prepare_jacobian(f: Callable, x: torch.Tensor, **options) -> DistributedJacobian:
    """The sparse Jacobian of ``f`` with its products split over the ranks of a process group.

    A collective: call it on every rank with the same ``f`` and ``x``.

    Parameters
    ----------
    f, x
        As for :func:`asd.prepare_jacobian`.
    **options
        ``output`` (``"replicated"``, ``"rows"`` or ``"root"``), ``group`` (a process group; default
        the default group), and the options of :class:`asd.SparseJacobian` except ``backend``,
        ``check`` and ``trace``: ``mode``, ``coloring``, ``order``, ``local``, ``strict`` and
        ``pattern`` are used on rank 0 to detect and color; ``batch_size``, ``compile``, ``args``
        and ``kwargs`` on every rank. As in one process, the values of an operator with
        ``local=True`` or a given ``pattern``, and of a call with extra arguments other than the
        prepared ones, are checked by a probe (:class:`asd.CheckError` on every rank where the
        pattern does not hold); the probe needs the whole matrix on a rank, so ``output="rows"``
        refuses them. A call whose ``x`` or extra arguments differ between ranks raises
        :class:`asd.InputError` on every rank that receives values, as does one rank's bad input
        (the others raise :class:`asd.AsdError`); with ``output="root"`` only rank 0 receives them,
        and the other ranks return ``None`` (a probed call's verdict reaches every rank). ``f``
        must be the same on every rank: that is not checked.

    Raises
    ------
    asd.InputError
        Without an initialized process group, with an unknown ``output`` or a refused option.
    PreparationFailed
        On ranks other than 0 when rank 0 failed to prepare (rank 0 raises its own error).
    """
    return DistributedJacobian(f, x, **options)


def prepare_hessian(f: Callable, x: torch.Tensor, **options) -> DistributedHessian:
    """The sparse Hessian of the scalar ``f`` with its products split over the ranks of a process group.

    A collective: call it on every rank with the same ``f`` and ``x``. ``options`` as for
    :func:`prepare_jacobian`, with the Hessian's ``coloring`` (``"star"`` or ``"acyclic"``) and
    ``hvp`` (see :class:`asd.SparseHessian`).
    """
    return DistributedHessian(f, x, **options)
