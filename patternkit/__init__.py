"""patternkit: Relay-style dataflow-pattern rewriting, partitioning and fusion on TVM Relax.

The top level holds what most users need and nothing else: the pattern language, the rule
model, the passes and the entry points.  Everything else is one attribute away, in the
layer that owns it (``pk.byoc.merge_composite``, ``pk.verification.check_roundtrip``,
``pk.dpl.find_match``).  Names load lazily: ``import patternkit`` (and ``patternkit
--help``) does not import TVM.  The package is layered, each layer importing only the
ones below it (``pyproject.toml`` states the layers; a test enforces them):

* :mod:`patternkit.ir`: access to TVM's Relax IR (the only layer touching private TVM API);
* :mod:`patternkit.dpl`: the pattern language and the matchers (one root or several);
  beside it :mod:`patternkit.models`: built-in models and the zoo of real models;
* :mod:`patternkit.engine`: the rule model and the linear rewrite engine;
  :mod:`patternkit.fusion`: ``DefuseOps``;
* :mod:`patternkit.verification`: numeric checks on llvm, per-site validation, round trips;
* :mod:`patternkit.byoc`: pattern tables, composites and external compilers;
  :mod:`patternkit.viz`: the Graphviz visualiser;
* :mod:`patternkit.patterns` (the rule library) and :mod:`patternkit.testing`;
* :mod:`patternkit.app`: the main job and the command line.

``__init__.pyi`` repeats the public names for type checkers; a test keeps the two equal.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__version__ = "0.1.0"

#: The public names, each written once, by the module that owns them.
PUBLIC: dict[str, tuple[str, ...]] = {
    # the pattern language
    "dpl": ("DFPattern", "wildcard", "is_op", "is_constant", "is_scalar", "is_var", "is_expr",
            "is_tuple", "is_tuple_get_item", "is_if", "dominates", "alt", "PatternContext",
            "match", "explain"),
    # the rule model and rewriting
    "engine": ("Rule", "RewriteRule", "CompositeRule", "DFPatternCallback", "RuleSet",
               "RuleMatch", "Reject", "reject", "rewrite", "Rewrite", "RewriteLog",
               "partition"),
    # rules written as the code they match: TVM's own rewriters, and function pairs
    "engine.from_rewriter": ("from_rewriter",),
    "verification.by_example": ("rule_by_example",),
    # passes for external compilers
    "byoc": ("MergeComposite", "PartitionGraph", "AnnotateTarget", "PatternTable",
             "offload_report"),
    "fusion": ("DefuseOps",),
    # proving a rewrite kept the numbers
    "verification": ("compare", "assert_same_numerics", "check_roundtrip", "validate_sites"),
    "ir": ("from_expr",),
    "viz": ("viz_expr", "viz_diff"),
    "viz.explorer": ("explore",),
    # the main job and the rule library's verification
    "app.job": ("run",),
    "app.verify": ("verify",),
    "app.loading": ("load",),
    "errors": ("PatternkitError", "PatternError", "PatternkitWarning", "RuleDeclinedEveryMatch"),
}

#: Names the top level exported before the façade was curated, with the layer that holds
#: them now.  They keep working for one release, with a ``DeprecationWarning`` naming
#: their home; remove this table in the release after.
MOVED: dict[str, tuple[str, ...]] = {
    "dpl": ("WildcardPattern", "ExprPattern", "ConstantPattern", "ScalarPattern",
            "VarPattern", "DataflowVarPattern", "GlobalVarPattern", "ExternFuncPattern",
            "CallPattern", "TuplePattern", "TupleGetItemPattern", "AltPattern", "AndPattern",
            "NotPattern", "AttrPattern", "TypePattern", "DataTypePattern", "ShapePattern",
            "is_const", "has_attr", "has_dtype", "has_shape", "has_type", "find_match",
            "Match", "through", "up_to_cast", "from_dpl", "FromDplError", "DominatorPattern",
            "IfPattern", "AmbiguousDominator", "K_ELEMWISE", "K_BROADCAST", "K_INJECTIVE",
            "K_COMM_REDUCE", "K_OUT_EWISE_FUSABLE", "K_TUPLE", "K_OPAQUE", "square",
            "divide_by_sqrt"),
    "engine": ("NodeMap", "RewriteRecord", "SkippedMatch", "BindingsRewriteRule",
               "BindingsMatch", "rewrite_bindings"),
    "byoc": ("merge_composite", "PatternTableError", "pattern_table", "CompositeLog",
             "composite_counts", "composite_functions", "partition_graph", "inline_external",
             "external_functions", "OffloadReport", "HostOp",
             "verify_table", "TableVerification", "EntryFailure", "coverage",
             "CoverageReport", "OpRecord"),
    "engine.splitting": ("graph_split", "GraphSplitError"),
    "verification.split_run": ("run_split",),
    "fusion": ("defuse",),
    "verification": ("RoundTripResult", "RoundTripError", "Comparison", "SiteReport"),
    "app.report": ("JobReport",),
    "testing": ("fuzz_pass", "bisect"),
    "ir": ("to_expr",),
    "viz": ("VizGraph", "VizError", "DotUnavailable"),
    "errors": ("CallbackError", "RewriteDidNotConverge", "MalformedIRError",
               "NothingToPartition", "BuildError"),
}

__all__ = [name for names in PUBLIC.values() for name in names]

_HOME = {name: home for home, names in PUBLIC.items() for name in names}
_MOVED_HOME = {name: home for home, names in MOVED.items() for name in names}

#: Subpackages reachable as attributes (``pk.viz``, ``pk.ir``) without importing them first.
_SUBPACKAGES = ("ir", "dpl", "engine", "fusion", "verification", "byoc", "viz", "testing",
                "patterns", "training", "app", "models", "errors")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    home = _HOME.get(name)
    if home is None:
        home = _MOVED_HOME.get(name)
        if home is None:
            raise AttributeError(f"module 'patternkit' has no attribute {name!r}")
        warnings.warn(f"patternkit.{name} moved to patternkit.{home}.{name}; the top-level "
                      "name goes in the next release", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"{__name__}.{home}"), name)
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later look-ups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
