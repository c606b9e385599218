"""Validation of the options every public entry point takes: a clear error naming the argument
and the fix, raised before any work is done."""

from __future__ import annotations

import numbers

from .errors import InputError

__all__ = ["check_bool", "check_batch_size", "check_choice", "check_seed", "check_compile", "COMPILE_MODES"]


def check_bool(name: str, value) -> bool:
    """``value`` must be ``True`` or ``False`` (``"no"`` is truthy: refusing it avoids surprises)."""
    if value is not True and value is not False:
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_batch_size(value) -> int | None:
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InputError(f"batch_size must be a positive integer (colors per batched call), 'auto' or None, "
                         f"got {value!r}")
    return int(value)


def check_choice(name: str, value, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InputError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def check_seed(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"seed must be a non-negative integer, got {value!r}")
    return value


#: the ``compile=`` values: ``"reduce-overhead"`` also replays the compiled products of a CUDA input
#: as a captured CUDA graph (PyTorch's name for the same in ``torch.compile``)
COMPILE_MODES = (False, True, "reduce-overhead")


def check_compile(value) -> bool | str:
    """``compile=``: ``False``, ``True`` or ``"reduce-overhead"``."""
    if value is True or value is False or (isinstance(value, str) and value in COMPILE_MODES):
        return value
    raise TypeError(f"compile must be True, False or 'reduce-overhead' (compiled, and replayed as a CUDA graph on a "
                    f"GPU), got {value!r} ({type(value).__name__})")
