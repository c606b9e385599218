"""Propagation rules, one module per op family; importing this package registers them all."""

from . import elementwise, linear, movement, reductions  # noqa: F401
