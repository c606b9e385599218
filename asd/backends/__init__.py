"""Evaluation backends: batched JVP / VJP / HVP for compressed derivatives."""

from .torch_func import Products, flatten_function, scalar_function

__all__ = ["Products", "flatten_function", "scalar_function"]
