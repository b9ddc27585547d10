"""Fusion undone: ``DefuseOps`` inlines the functions fusion and partitioning create.

This layer needs no patterns: it reads function attributes
(:mod:`patternkit.ir.kinds`) and inlines calls, so every other layer may use it.
"""

from .defuser import DEFUSE_KINDS, DefuseOps, defuse, function_kinds

__all__ = ["DEFUSE_KINDS", "DefuseOps", "defuse", "function_kinds"]
