"""patternkit: Relay-style dataflow-pattern rewriting, partitioning and fusion on TVM Relax.

This module only re-exports the public API; see the submodules for the code.
"""

from .callback import DFPatternCallback, NodeMap
from .errors import (CallbackError, MalformedIRError, PatternError, PatternkitError,
                     RewriteDidNotConverge)
from .explain import explain
from .exprs import from_expr, to_expr
from .grouping import reject
from .matcher import Match, find_match, match
from .numeric import Comparison, assert_same_numerics, compare
from .partition import partition
from .pattern import (AltPattern, AttrPattern, CallPattern, ConstantPattern, DataTypePattern,
                      DFPattern, ExprPattern, ShapePattern, TupleGetItemPattern, TuplePattern,
                      TypePattern, VarPattern, WildcardPattern, has_attr, has_dtype, has_shape,
                      has_type, is_const, is_constant, is_expr, is_op, is_tuple,
                      is_tuple_get_item, is_var, wildcard)
from .rewrite import Rewrite, RewriteLog, RewriteRecord, SkippedMatch, rewrite
from .viz import DotUnavailable, VizError, VizGraph, viz_diff, viz_expr

__version__ = "0.1.0"

__all__ = [
    # pattern language
    "DFPattern", "WildcardPattern", "ExprPattern", "ConstantPattern", "VarPattern",
    "CallPattern", "TuplePattern", "TupleGetItemPattern", "AltPattern", "AttrPattern",
    "TypePattern", "DataTypePattern", "ShapePattern",
    "wildcard", "is_op", "is_constant", "is_const", "is_var", "is_expr", "is_tuple",
    "is_tuple_get_item", "has_attr", "has_dtype", "has_shape", "has_type",
    "match", "find_match", "Match", "explain",
    # rewriting and partitioning
    "DFPatternCallback", "NodeMap", "reject", "rewrite", "Rewrite", "RewriteLog",
    "RewriteRecord", "SkippedMatch", "partition",
    # expressions and numerics
    "from_expr", "to_expr", "compare", "assert_same_numerics", "Comparison",
    # visualiser
    "viz_expr", "viz_diff", "VizGraph", "VizError", "DotUnavailable",
    # errors
    "PatternkitError", "PatternError", "CallbackError", "RewriteDidNotConverge",
    "MalformedIRError",
]
