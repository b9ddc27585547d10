"""The pattern language: Relay's dataflow patterns on Relax, and the matcher.

:mod:`~patternkit.dpl.pattern` holds the pattern nodes and Relay's constructors,
:mod:`~patternkit.dpl.matcher` matches them against Relax code (looking through
bindings), and :mod:`~patternkit.dpl.near_miss` explains why a pattern did not match.
This layer knows the IR layer only; the rewrite engine is built on it.
"""

from .combinators import PLUMBING_OPS, divide_by_sqrt, square, through, up_to_cast
from .matcher import Match, find_match, match
from .near_miss import explain
from .pattern import (AltPattern, AttrPattern, CallPattern, ConstantPattern, DataTypePattern,
                      DFPattern, ExprPattern, ScalarPattern, ShapePattern, TupleGetItemPattern,
                      TuplePattern, TypePattern, VarPattern, WildcardPattern, as_pattern, has_attr,
                      has_dtype, has_shape, has_type, is_const, is_constant, is_expr, is_op,
                      is_scalar, is_tuple, is_tuple_get_item, is_var, wildcard)

__all__ = [
    "DFPattern", "WildcardPattern", "ExprPattern", "ConstantPattern", "ScalarPattern",
    "VarPattern",
    "CallPattern", "TuplePattern", "TupleGetItemPattern", "AltPattern", "AttrPattern",
    "TypePattern", "DataTypePattern", "ShapePattern",
    "wildcard", "is_op", "is_constant", "is_const", "is_scalar", "is_var", "is_expr", "is_tuple",
    "is_tuple_get_item", "has_attr", "has_dtype", "has_shape", "has_type", "as_pattern",
    "match", "find_match", "Match", "explain", "through", "up_to_cast", "PLUMBING_OPS",
    "square", "divide_by_sqrt",
]
