"""Decompression: compressed derivative products back into CSR values.

* :mod:`asd.decompression.plans` - the plan of every coloring result (numpy; imports no torch).
* :mod:`asd.decompression.device` - :class:`Decompressor`: a plan's index tensors on one device,
  one gather (direct) or the substitution (Numba on the CPU, level-wise on any device).

``asd.decompression`` imports no numba (the kernels load on first use) and, until
:class:`Decompressor` is asked for, no torch.
"""

from __future__ import annotations

from .plans import DirectPlan, SubstitutionPlan, build_plan

__all__ = ["DirectPlan", "SubstitutionPlan", "build_plan", "Decompressor", "substitute", "prepared",
           "clear_prepared"]


def __getattr__(name):
    if name in ("Decompressor", "substitute", "prepared", "clear_prepared"):
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module 'asd.decompression' has no attribute {name!r}")
