"""Decompression: compressed derivative products back into CSR values.

``asd.decompression`` imports no numba: the CPU substitution kernel is loaded on first use.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DecompressionError
from .direct import gather
from .substitution import prepare_substitution, substitute

__all__ = ["Decompressor", "gather", "substitute", "prepare_substitution"]


class Decompressor:
    """A coloring's decompression plan and CSR structure as index tensors on one device.

    Parameters
    ----------
    coloring
        An :class:`asd.coloring.Coloring` (anything with ``plan``, ``indptr``, ``indices``, ``shape``).
    device
        Where the compressed products will live.
    """

    def __init__(self, coloring, device: torch.device | str):
        self.device = torch.device(device)
        self.shape = tuple(coloring.shape)
        self.plan = coloring.plan
        self.crow = torch.as_tensor(np.asarray(coloring.indptr, dtype=np.int64)).to(self.device)
        self.col = torch.as_tensor(np.asarray(coloring.indices, dtype=np.int64)).to(self.device)
        self.size = int(self.plan.compressed_size)
        if self.plan.kind == "direct":
            self.index = torch.as_tensor(np.asarray(self.plan.gather, dtype=np.int64)).to(self.device)
        else:
            self.index = None
            self._prepared = None  # level-wise index tensors, built on first use off the CPU fast path

    def values(self, compressed: torch.Tensor) -> torch.Tensor:
        """Values of the stored entries, in CSR order, from the flat compressed buffer."""
        if compressed.numel() != self.size:
            raise DecompressionError(f"compressed buffer has {compressed.numel()} elements, the plan "
                                     f"expects {self.size}")
        if self.index is not None:
            return gather(self.index, compressed)
        if compressed.device.type == "cpu" and not compressed.requires_grad:
            return substitute(self.plan, compressed).to(compressed.dtype)
        if self._prepared is None:
            self._prepared = prepare_substitution(self.plan, self.device)
        return substitute(self._prepared, compressed)

    def csr(self, values: torch.Tensor) -> torch.Tensor:
        """A ``torch.sparse_csr`` tensor with this pattern and ``values``."""
        return torch.sparse_csr_tensor(self.crow, self.col, values, size=self.shape,
                                       dtype=values.dtype, device=values.device, check_invariants=False)

    def __call__(self, compressed: torch.Tensor) -> torch.Tensor:
        return self.csr(self.values(compressed))
