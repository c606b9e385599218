"""Memory-aware batching: how many colors one batched call can evaluate.

``batch_size="auto"`` takes the memory free on the input's device (``torch.cuda.mem_get_info``
on a GPU, ``MemAvailable`` of ``/proc/meminfo`` on the CPU), keeps a safety share of it, and
divides by the estimated memory of one product: the seed row, the product row, and
:data:`WORKSPACE_FACTOR` copies of the function's input and output for the intermediates the
derivative keeps (measured on the benchmark problems: stencils, convolutions and reductions need
4-12 copies).
"""

from __future__ import annotations

import os

import torch

__all__ = ["free_bytes", "auto_batch_size"]

#: copies of the input and output one product keeps alive (intermediates of f and its derivative)
WORKSPACE_FACTOR = 16
#: share of the free memory the batched products may use
SAFETY_SHARE = 0.5


def free_bytes(device: torch.device) -> int:
    """Bytes free on ``device`` (``meta``: unbounded)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "meta":
        return 1 << 62
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
    return int(pages) * int(os.sysconf("SC_PAGE_SIZE")) if pages else 8 << 30


def auto_batch_size(ncolors: int, n: int, m: int, itemsize: int, device, *, free: int | None = None) -> int | None:
    """Colors per batched call so that the batch fits in the free memory of ``device``: ``None``
    (all at once) when they all fit, otherwise at least 1."""
    if ncolors <= 1:
        return None
    per_color = itemsize * (2 * max(n, m) + WORKSPACE_FACTOR * (n + m))
    budget = SAFETY_SHARE * (free_bytes(device) if free is None else free)
    k = int(budget // max(per_color, 1))
    return None if k >= ncolors else max(1, k)
