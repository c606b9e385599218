"""Figures: sparsity patterns colored by their coloring, coloring graphs, benchmark plots.

matplotlib is imported by the functions that draw, never at ``import asd``.
"""
