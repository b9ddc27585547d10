"""patternkit: Relay-style dataflow-pattern rewriting, partitioning and fusion on TVM Relax.

This module only re-exports the public API; see the submodules for the code.
"""

from .byoc import (AnnotateTarget, PartitionGraph, external_functions, inline_external,
                   partition_graph)
from .callback import DFPatternCallback, NodeMap
from .composite import (CompositeLog, MergeComposite, PatternTable, PatternTableError,
                        composite_counts, composite_functions, merge_composite, pattern_table)
from .defuse import DefuseOps, defuse
from .errors import (CallbackError, MalformedIRError, PatternError, PatternkitError,
                     RewriteDidNotConverge)
from .explain import explain
from .exprs import from_expr, to_expr
from .graph_split import GraphSplitError, graph_split, run_split
from .grouping import reject
from .job import JobReport, verify
from .job import run as run
from .matcher import Match, find_match, match
from .numeric import Comparison, assert_same_numerics, compare
from .offload import HostOp, OffloadReport, offload_report
from .partition import partition
from .pattern import (AltPattern, AttrPattern, CallPattern, ConstantPattern, DataTypePattern,
                      DFPattern, ExprPattern, ShapePattern, TupleGetItemPattern, TuplePattern,
                      TypePattern, VarPattern, WildcardPattern, has_attr, has_dtype, has_shape,
                      has_type, is_const, is_constant, is_expr, is_op, is_tuple,
                      is_tuple_get_item, is_var, wildcard)
from .rewrite import Rewrite, RewriteLog, RewriteRecord, SkippedMatch, rewrite
from .roundtrip import RoundTripError, RoundTripResult, check_roundtrip
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
    # composites and external compilers
    "MergeComposite", "merge_composite", "PatternTable", "PatternTableError", "pattern_table",
    "CompositeLog", "composite_counts", "composite_functions", "AnnotateTarget",
    "PartitionGraph", "partition_graph", "inline_external", "external_functions",
    "graph_split", "run_split", "GraphSplitError", "offload_report", "OffloadReport", "HostOp",
    # fusion round trips
    "DefuseOps", "defuse", "check_roundtrip", "RoundTripResult", "RoundTripError",
    # the main job
    "run", "verify", "JobReport",
    # expressions and numerics
    "from_expr", "to_expr", "compare", "assert_same_numerics", "Comparison",
    # visualiser
    "viz_expr", "viz_diff", "VizGraph", "VizError", "DotUnavailable",
    # errors
    "PatternkitError", "PatternError", "CallbackError", "RewriteDidNotConverge",
    "MalformedIRError",
]
