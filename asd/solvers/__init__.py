"""Solver hookups: Newton's method, SciPy's least_squares/minimize, and IPOPT (cyipopt, optional).

Each keeps one prepared operator (pattern, coloring and seeds computed once) and hands the solver
the derivative in the fixed structure it asks for.
"""

from .newton import NewtonResult, newton
from .scipy import least_squares, minimize

__all__ = ["newton", "NewtonResult", "least_squares", "minimize"]
