"""Propagation rules, one module per op family; importing this package registers them all."""

from . import elementwise, fft, linalg, linear, movement, nn, reductions  # noqa: F401
