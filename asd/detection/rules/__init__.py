"""Propagation rules, one module per op family; importing this package registers them all."""

from . import elementwise, fft, interpolate, linalg, linear, movement, nn, reductions  # noqa: F401
