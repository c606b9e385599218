"""Exceptions and warnings raised by asd.

This module imports neither torch nor numba, so every subpackage may use it.
"""

from __future__ import annotations


class AsdError(Exception):
    """Base class of asd's errors."""


class TracingError(AsdError):
    """Sparsity tracing cannot continue (value-dependent control flow, data-dependent shapes, ...)."""


class UnsupportedOpError(TracingError):
    """An operator without a propagation rule was met under ``strict=True``."""


class ColoringError(AsdError):
    """A coloring is invalid for its problem, or a coloring request is malformed."""


class DecompressionError(AsdError):
    """Compressed products cannot be decompressed with the given plan."""


class InputError(AsdError, ValueError):
    """Bad user input: wrong dtype, shape, device, or an unusable function output."""


class UnsupportedOpWarning(UserWarning):
    """An operator was traced with the conservative fallback rule (sound but dense)."""


class ConvergenceWarning(UserWarning):
    """An iterative solver stopped before reaching its tolerance."""


class CheckError(AsdError):
    """A prepared operator's derivative failed its cross-mode check: the decompressed matrix times
    a random vector disagrees with one product of the other AD mode."""


class StalePatternWarning(UserWarning):
    """A cached operator no longer matched its function and was prepared again."""


class TransformUnsupported(InputError):
    """The function cannot run under ``torch.func``'s batched transforms (sparse tensors built
    inside it, randomness under ``vmap``, in-place updates of captured tensors, ...)."""


class ADGapError(AsdError):
    """No AD mode of PyTorch gives the function's derivative: one of its ops has a derivative
    formula known to be wrong in every mode (:data:`asd.detection.ad_gaps.EVERY_MODE`)."""


class ADGapWarning(UserWarning):
    """An explicitly chosen AD mode would meet a PyTorch derivative formula known to be wrong (or a
    ``no_grad`` region or ``autograd`` call that the mode cannot follow) for this function; asd
    evaluates in another mode (see :mod:`asd.detection.ad_gaps`)."""


class PrecisionWarning(UserWarning):
    """Substitution (an acyclic coloring's decompression) may have put more rounding into some
    Hessian entries than a check tolerates at this point (:mod:`asd.decompression.precision`); an
    operator that chose the coloring itself decompresses directly (a star coloring) from then on."""


class HostFallbackWarning(UserWarning):
    """A step copied values to the host and back because its device has no kernel for it (a
    direct factorization, a symbolic sparse product, a triangular sweep off CUDA).  Warned once
    per kind of step in a process; silence it with ``warnings.filterwarnings``."""
