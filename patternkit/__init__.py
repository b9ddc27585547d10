"""patternkit: Relay-style dataflow-pattern rewriting, partitioning and fusion on TVM Relax.

This module only re-exports the public API.  The package is layered, each layer
importing only the ones below it (a test enforces it):

* :mod:`patternkit.ir`: access to TVM's Relax IR (the only layer touching private TVM API);
* :mod:`patternkit.dpl`: the pattern language and the matcher;
* :mod:`patternkit.engine`: the linear rewrite engine (index, proposals, emission),
  rewrite rules, ``rewrite`` and ``partition``; :mod:`patternkit.fusion`: ``DefuseOps``;
* :mod:`patternkit.verification`: numeric checks on llvm and fuse/defuse round trips;
* :mod:`patternkit.byoc`: pattern tables, composites and external compilers;
  :mod:`patternkit.viz`: the Graphviz visualiser;
* :mod:`patternkit.testing` (test helpers) and :mod:`patternkit.patterns` (the library);
* :mod:`patternkit.app`: the main job, the command line and the built-in models.
"""

from .app.job import JobReport, run, verify
from .byoc import (AnnotateTarget, CompositeLog, GraphSplitError, HostOp, MergeComposite,
                   OffloadReport, PartitionGraph, PatternTable, PatternTableError,
                   composite_counts, composite_functions, external_functions, graph_split,
                   inline_external, merge_composite, offload_report, partition_graph,
                   pattern_table, run_split)
from .dpl import (AltPattern, AttrPattern, CallPattern, ConstantPattern, DataTypePattern,
                  DFPattern, ExprPattern, Match, ShapePattern, TupleGetItemPattern, TuplePattern,
                  TypePattern, VarPattern, WildcardPattern, explain, find_match, has_attr,
                  has_dtype, has_shape, has_type, is_const, is_constant, is_expr, is_op,
                  is_tuple, is_tuple_get_item, is_var, match, wildcard)
from .engine import (CompositeRule, DFPatternCallback, NodeMap, Reject, Rewrite, RewriteLog,
                     RewriteRecord, RewriteRule, Rule, RuleMatch, RuleSet, SkippedMatch,
                     partition, reject, rewrite)
from .errors import (CallbackError, MalformedIRError, PatternError, PatternkitError,
                     RewriteDidNotConverge)
from .fusion import DefuseOps, defuse
from .ir import from_expr, to_expr
from .verification import (Comparison, RoundTripError, RoundTripResult, assert_same_numerics,
                           check_roundtrip, compare)
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
    # rules and rule sets
    "Rule", "RewriteRule", "CompositeRule", "RuleSet", "RuleMatch", "Reject",
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
