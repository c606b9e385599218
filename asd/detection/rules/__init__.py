"""Propagation rules, one module per op family; importing this package registers them all, then
gives every in-place variant (``elu_``) without a rule of its own its out-of-place rule, and marks
them asd's own (:func:`asd.detection.table.seal_builtin`: their returns are trusted)."""

from ..table import register_inplace_twins, seal_builtin
from . import (complex, elementwise, fft, interpolate, linalg, linear, movement, nn,  # noqa: F401
               reductions, structured_linalg)

register_inplace_twins()
seal_builtin()
