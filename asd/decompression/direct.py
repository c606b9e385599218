"""Direct decompression: one gather from the compressed product into CSR values."""

from __future__ import annotations

import torch


def gather(index: torch.Tensor, compressed: torch.Tensor) -> torch.Tensor:
    """``compressed.reshape(-1)[index]``: works on any device and keeps autograd."""
    return compressed.reshape(-1).index_select(0, index)
