"""patternkit: Relay-style dataflow-pattern rewriting, partitioning and fusion on TVM Relax.

This module only re-exports the public API, and loads each layer when one of its names
is first used: ``import patternkit`` (and ``patternkit --help``) does not import TVM.
The package is layered, each layer importing only the ones below it (a test enforces it):

* :mod:`patternkit.ir`: access to TVM's Relax IR (the only layer touching private TVM API);
* :mod:`patternkit.dpl`: the pattern language and the matcher; beside it
  :mod:`patternkit.models`: built-in models and the zoo of real models (imports only ``ir``);
* :mod:`patternkit.engine`: the linear rewrite engine (index, proposals, emission),
  rewrite rules, ``rewrite`` and ``partition``; :mod:`patternkit.fusion`: ``DefuseOps``;
* :mod:`patternkit.verification`: numeric checks on llvm and fuse/defuse round trips;
* :mod:`patternkit.byoc`: pattern tables, composites and external compilers;
  :mod:`patternkit.viz`: the Graphviz visualiser;
* :mod:`patternkit.testing` (test helpers) and :mod:`patternkit.patterns` (the library);
* :mod:`patternkit.app`: the main job and the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    # pattern language
    "DFPattern", "WildcardPattern", "ExprPattern", "ConstantPattern", "ScalarPattern",
    "VarPattern", "DataflowVarPattern", "GlobalVarPattern", "ExternFuncPattern",
    "CallPattern", "TuplePattern", "TupleGetItemPattern", "AltPattern", "AndPattern",
    "NotPattern", "AttrPattern", "TypePattern", "DataTypePattern", "ShapePattern",
    "wildcard", "is_op", "is_constant", "is_const", "is_scalar", "is_var", "is_expr", "is_tuple",
    "is_tuple_get_item", "has_attr", "has_dtype", "has_shape", "has_type", "alt",
    "match", "find_match", "Match", "explain", "through", "up_to_cast", "from_dpl",
    "FromDplError",
    "DominatorPattern", "IfPattern", "dominates", "is_if", "AmbiguousDominator",
    "K_ELEMWISE", "K_BROADCAST", "K_INJECTIVE", "K_COMM_REDUCE", "K_OUT_EWISE_FUSABLE",
    "K_TUPLE", "K_OPAQUE", "PatternContext",
    "square", "divide_by_sqrt",
    # rules and rule sets
    "Rule", "RewriteRule", "CompositeRule", "RuleSet", "RuleMatch", "Reject",
    # rewriting and partitioning
    "DFPatternCallback", "NodeMap", "reject", "rewrite", "Rewrite", "RewriteLog",
    "RewriteRecord", "SkippedMatch", "partition",
    "BindingsRewriteRule", "BindingsMatch", "rewrite_bindings",
    # composites and external compilers
    "MergeComposite", "merge_composite", "PatternTable", "PatternTableError", "pattern_table",
    "CompositeLog", "composite_counts", "composite_functions", "AnnotateTarget",
    "PartitionGraph", "partition_graph", "inline_external", "external_functions",
    "graph_split", "run_split", "GraphSplitError", "offload_report", "OffloadReport", "HostOp",
    "verify_table", "TableVerification", "EntryFailure", "coverage", "CoverageReport",
    "OpRecord",
    # fusion round trips
    "DefuseOps", "defuse", "check_roundtrip", "RoundTripResult", "RoundTripError",
    # the main job
    "run", "verify", "JobReport",
    # verification campaigns
    "fuzz_pass", "bisect",
    # expressions and numerics
    "from_expr", "to_expr", "compare", "assert_same_numerics", "Comparison",
    "validate_sites", "SiteReport",
    # visualiser
    "viz_expr", "viz_diff", "VizGraph", "VizError", "DotUnavailable",
    # errors
    "PatternkitError", "PatternError", "CallbackError", "RewriteDidNotConverge",
    "MalformedIRError", "NothingToPartition", "BuildError",
]

#: The layer (subpackage) each public name lives in.
_HOME = {
    # dpl
    "DFPattern": "dpl", "WildcardPattern": "dpl", "ExprPattern": "dpl",
    "ConstantPattern": "dpl", "ScalarPattern": "dpl", "VarPattern": "dpl", "CallPattern": "dpl",
    "TuplePattern": "dpl", "TupleGetItemPattern": "dpl", "AltPattern": "dpl",
    "DataflowVarPattern": "dpl", "GlobalVarPattern": "dpl", "ExternFuncPattern": "dpl",
    "AndPattern": "dpl", "NotPattern": "dpl", "from_dpl": "dpl", "FromDplError": "dpl",
    "AttrPattern": "dpl", "TypePattern": "dpl", "DataTypePattern": "dpl", "ShapePattern": "dpl",
    "wildcard": "dpl", "is_op": "dpl", "is_constant": "dpl", "is_const": "dpl", "alt": "dpl",
    "is_scalar": "dpl", "is_var": "dpl", "is_expr": "dpl", "is_tuple": "dpl",
    "is_tuple_get_item": "dpl", "has_attr": "dpl", "has_dtype": "dpl", "has_shape": "dpl",
    "has_type": "dpl", "match": "dpl", "find_match": "dpl", "Match": "dpl", "explain": "dpl",
    "through": "dpl", "up_to_cast": "dpl",
    "DominatorPattern": "dpl", "IfPattern": "dpl", "dominates": "dpl", "is_if": "dpl",
    "AmbiguousDominator": "dpl", "K_ELEMWISE": "dpl", "K_BROADCAST": "dpl",
    "K_INJECTIVE": "dpl", "K_COMM_REDUCE": "dpl", "K_OUT_EWISE_FUSABLE": "dpl",
    "K_TUPLE": "dpl", "K_OPAQUE": "dpl", "PatternContext": "dpl",
    "square": "dpl", "divide_by_sqrt": "dpl",
    # engine
    "Rule": "engine", "RewriteRule": "engine", "CompositeRule": "engine", "RuleSet": "engine",
    "RuleMatch": "engine", "Reject": "engine", "DFPatternCallback": "engine",
    "NodeMap": "engine", "reject": "engine", "rewrite": "engine", "Rewrite": "engine",
    "RewriteLog": "engine", "RewriteRecord": "engine", "SkippedMatch": "engine",
    "partition": "engine", "BindingsRewriteRule": "engine", "BindingsMatch": "engine",
    "rewrite_bindings": "engine",
    # byoc
    "MergeComposite": "byoc", "merge_composite": "byoc", "PatternTable": "byoc",
    "PatternTableError": "byoc", "pattern_table": "byoc", "CompositeLog": "byoc",
    "composite_counts": "byoc", "composite_functions": "byoc", "AnnotateTarget": "byoc",
    "PartitionGraph": "byoc", "partition_graph": "byoc", "inline_external": "byoc",
    "external_functions": "byoc", "graph_split": "byoc", "run_split": "byoc",
    "GraphSplitError": "byoc", "offload_report": "byoc", "OffloadReport": "byoc",
    "verify_table": "byoc", "TableVerification": "byoc", "EntryFailure": "byoc",
    "coverage": "byoc", "CoverageReport": "byoc", "OpRecord": "byoc",
    "HostOp": "byoc",
    # fusion
    "DefuseOps": "fusion", "defuse": "fusion",
    # verification
    "check_roundtrip": "verification", "RoundTripResult": "verification",
    "RoundTripError": "verification", "compare": "verification",
    "assert_same_numerics": "verification", "Comparison": "verification",
    "validate_sites": "verification", "SiteReport": "verification",
    # app.job
    "run": "app.job", "verify": "app.verify", "JobReport": "app.report",
    # testing
    "fuzz_pass": "testing", "bisect": "testing",
    # ir
    "from_expr": "ir", "to_expr": "ir",
    # viz
    "viz_expr": "viz", "viz_diff": "viz", "VizGraph": "viz", "VizError": "viz",
    "DotUnavailable": "viz",
    # errors
    "PatternkitError": "errors", "PatternError": "errors", "CallbackError": "errors",
    "RewriteDidNotConverge": "errors", "MalformedIRError": "errors",
    "NothingToPartition": "errors", "BuildError": "errors",
}


#: Subpackages reachable as attributes (``pk.viz``, ``pk.ir``) without importing them first.
_SUBPACKAGES = ("ir", "dpl", "engine", "fusion", "verification", "byoc", "viz", "testing",
                "patterns", "training", "app", "errors")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'patternkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later look-ups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what the names are, for type checkers and IDEs
    from .app.job import run
    from .app.report import JobReport
    from .app.verify import verify
    from .testing import bisect, fuzz_pass
    from .byoc import (AnnotateTarget, CompositeLog, GraphSplitError, HostOp, MergeComposite,
                       OffloadReport, PartitionGraph, PatternTable, PatternTableError,
                       composite_counts, composite_functions, external_functions, graph_split,
                       inline_external, merge_composite, offload_report, partition_graph,
                       pattern_table, run_split)
    from .byoc.reports.table_coverage import CoverageReport, OpRecord, coverage
    from .byoc.reports.table_verification import EntryFailure, TableVerification, verify_table
    from .dpl import (K_BROADCAST, K_COMM_REDUCE, K_ELEMWISE, K_INJECTIVE, K_OPAQUE,
                      K_OUT_EWISE_FUSABLE, K_TUPLE, AmbiguousDominator, DominatorPattern,
                      IfPattern, PatternContext, dominates, is_if)
    from .dpl import (AltPattern, AndPattern, AttrPattern, CallPattern, ConstantPattern,
                      DataflowVarPattern, DataTypePattern, DFPattern, ExprPattern,
                      ExternFuncPattern, FromDplError, GlobalVarPattern, Match, NotPattern,
                      ScalarPattern, ShapePattern, TupleGetItemPattern, TuplePattern,
                      TypePattern, VarPattern, WildcardPattern, explain, find_match, from_dpl,
                      has_attr, has_dtype, has_shape, has_type, is_const, is_constant, is_expr,
                      is_op, is_scalar, is_tuple, is_tuple_get_item, is_var, match, through,
                      up_to_cast, wildcard)
    from .engine import BindingsMatch, BindingsRewriteRule, rewrite_bindings
    from .dpl import alt, divide_by_sqrt, square
    from .engine import (CompositeRule, DFPatternCallback, NodeMap, Reject, Rewrite, RewriteLog,
                         RewriteRecord, RewriteRule, Rule, RuleMatch, RuleSet, SkippedMatch,
                         partition, reject, rewrite)
    from .errors import (BuildError, CallbackError, MalformedIRError, NothingToPartition,
                         PatternError, PatternkitError, RewriteDidNotConverge)
    from .verification import SiteReport, validate_sites
    from .fusion import DefuseOps, defuse
    from .ir import from_expr, to_expr
    from .verification import (Comparison, RoundTripError, RoundTripResult,
                               assert_same_numerics, check_roundtrip, compare)
    from .viz import DotUnavailable, VizError, VizGraph, viz_diff, viz_expr
