"""Rule families of the JAX front end; importing this package fills :data:`asd.jax.table.RULES`."""

from . import control, elementwise, indexing, linear, movement, reductions  # noqa: F401
