"""The illustrated guide's figures, computed by asd on the guide's examples."""

from .figures import make_figures

__all__ = ["make_figures"]
