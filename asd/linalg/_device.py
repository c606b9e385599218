"""Device residency rules shared by :mod:`asd.linalg`.

* CPU tensors run the Numba kernels; other devices run torch operations on the device.
* ``meta`` tensors carry shapes but no values: every step that would read values (input
  validation, convergence tests, factorizations) is skipped there and kernels return shape-only
  results, so a call on ``meta`` propagates shapes, dtypes and layouts without touching the host.
* A step with no kernel on the tensors' device copies values to the host and back and says so,
  once per kind of step, with :class:`~asd.errors.HostFallbackWarning`.
"""

from __future__ import annotations

import warnings

import torch

from asd.errors import HostFallbackWarning

_WARNED: set[str] = set()


def is_meta(t: torch.Tensor) -> bool:
    """``t`` lives on the ``meta`` device (shapes only, no values)."""
    return t.device.type == "meta"


def warn_host_fallback(kind: str, device: torch.device, detail: str) -> None:
    """Warn (once per ``kind`` in this process) that ``kind`` copies to the host and back."""
    if kind in _WARNED:
        return
    _WARNED.add(kind)
    warnings.warn(HostFallbackWarning(
        f"{kind} has no kernel on {device.type}: its values are copied to the host and back "
        f"({detail})"), stacklevel=3)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite (one boolean read back; ``True`` on meta)."""
    return is_meta(t) or bool(torch.isfinite(t).all())
