"""The pattern language: Relay's dataflow patterns on Relax, and the matcher.

:mod:`~patternkit.dpl.pattern` holds the pattern nodes and Relay's constructors,
:mod:`~patternkit.dpl.matcher` matches them against Relax code (looking through
bindings), :mod:`~patternkit.dpl.near_miss` explains why a pattern did not match, and
:mod:`~patternkit.dpl.from_tvm` converts ``tvm.relax.dpl`` patterns (``from_dpl``);
:mod:`~patternkit.dpl.context` builds graphs of patterns (several roots) and
:mod:`~patternkit.dpl.graph_matcher` matches them in a block (``match_dfb``).
This layer knows the IR layer only; the rewrite engine is built on it.
"""

from .combinators import PLUMBING_OPS, divide_by_sqrt, products, square, through, up_to_cast
from .context import PatternContext, PatternSeq
from .dominator import AmbiguousDominator
from .from_tvm import DplConverter, FromDplError, from_dpl
from .graph_matcher import match_dfb
from .matcher import Match, find_match, match
from .near_miss import explain
from .opkinds import (
    K_BROADCAST,
    K_COMM_REDUCE,
    K_ELEMWISE,
    K_INJECTIVE,
    K_OPAQUE,
    K_OUT_EWISE_FUSABLE,
    K_TUPLE,
    op_kind,
)
from .pattern import (
    AltPattern,
    AndPattern,
    AttrPattern,
    CallPattern,
    ConstantPattern,
    DataflowVarPattern,
    DataTypePattern,
    DFPattern,
    DominatorPattern,
    ExprPattern,
    ExternFuncPattern,
    GlobalVarPattern,
    IfPattern,
    NotPattern,
    ScalarPattern,
    ShapePattern,
    TagPattern,
    TupleGetItemPattern,
    TuplePattern,
    TypePattern,
    VarPattern,
    WildcardPattern,
    alt,
    as_pattern,
    dominates,
    has_attr,
    has_dtype,
    has_shape,
    has_type,
    is_const,
    is_constant,
    is_dfv,
    is_expr,
    is_extern,
    is_gv,
    is_if,
    is_op,
    is_scalar,
    is_tuple,
    is_tuple_get_item,
    is_var,
    wildcard,
)

__all__ = [
    "DFPattern", "WildcardPattern", "ExprPattern", "ConstantPattern", "ScalarPattern",
    "VarPattern", "DataflowVarPattern", "GlobalVarPattern", "ExternFuncPattern",
    "CallPattern", "TuplePattern", "TupleGetItemPattern", "AltPattern", "AndPattern",
    "NotPattern", "AttrPattern", "TypePattern", "DataTypePattern", "ShapePattern",
    "wildcard", "is_op", "is_constant", "is_const", "is_scalar", "is_var", "is_dfv", "is_gv",
    "is_extern", "is_expr", "is_tuple", "is_tuple_get_item", "has_attr", "has_dtype",
    "has_shape", "has_type", "as_pattern", "from_dpl", "FromDplError", "DplConverter",
    "match", "find_match", "Match", "explain", "through", "up_to_cast", "PLUMBING_OPS",
    # Relay's dominator and If patterns, operator kinds, multi-output pattern graphs
    "DominatorPattern", "IfPattern", "dominates", "is_if", "AmbiguousDominator",
    "K_ELEMWISE", "K_BROADCAST", "K_INJECTIVE", "K_COMM_REDUCE", "K_OUT_EWISE_FUSABLE",
    "K_TUPLE", "K_OPAQUE", "op_kind", "PatternContext", "PatternSeq", "match_dfb",
    "square", "divide_by_sqrt", "products",
    # named alternatives: match.tag(tag) tells which matched
    "alt", "TagPattern",
]
