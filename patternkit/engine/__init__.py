"""The rewrite engine: index a function, propose matches, apply rules, emit the result.

One linear pipeline serves rewriting, partitioning and composites:
:mod:`~patternkit.engine.index` indexes a function's bindings in one walk,
:mod:`~patternkit.engine.proposal` groups the non-overlapping matches of a pattern
(Relay's rules, with a reason for every match it skips), and
:mod:`~patternkit.engine.emit` rebuilds the function with the replacements, dropping
what they left dead.  :mod:`~patternkit.engine.driver` runs rewrite rules to a fixed
point, :mod:`~patternkit.engine.partitioning` wraps matches in functions
(:mod:`~patternkit.engine.outline`).  :mod:`~patternkit.engine.rule` is the rule protocol
(``Rule``: a name, a pattern or a context, ``check(match)``; its two kinds
``RewriteRule`` and ``CompositeRule``; single-root rules rewrite in the driver,
multi-root ones through :mod:`~patternkit.engine.multi`); ``DFPatternCallback`` in
:mod:`~patternkit.engine.callback` is Relay's spelling, an adapter onto it, and
:mod:`~patternkit.engine.ruleset` makes rules values that compose (``RuleSet``);
:mod:`~patternkit.engine.tolerance` says what a rule promises about the numbers, per dtype.
"""

from .callback import CallbackRule, DFPatternCallback
from .driver import Rewrite, RewriteLog, RewriteRecord, SkippedMatch, rewrite
from .module_scope import current_module, module_in_scope
from .multi import BindingsMatch, BindingsRewriteRule, rewrite_bindings
from .near_misses import NearMiss, NearMissDetector, find_near_misses
from .partitioning import partition
from .proposal import match_bindings
from .rule import (
    CompositeRule,
    NodeMap,
    NoSuchExample,
    Reject,
    RewriteRule,
    RoleMatch,
    Rule,
    RuleMatch,
    as_rule,
    reject,
    variant_method,
)
from .ruleset import RuleSet
from .skip import Skip, SkipKind
from .splitting import GraphSplitError, graph_split
from .tolerance import EXACT, Tolerance, default_tolerance
from .wellformed import assert_well_formed

__all__ = [
    "Rule", "RewriteRule", "CompositeRule", "RuleSet", "RuleMatch", "RoleMatch", "Reject",
    "as_rule", "CallbackRule", "Skip", "SkipKind",
    "DFPatternCallback", "NodeMap", "reject", "rewrite", "Rewrite", "RewriteLog",
    "RewriteRecord", "SkippedMatch", "partition", "match_bindings", "assert_well_formed",
    "BindingsRewriteRule", "BindingsMatch", "rewrite_bindings", "variant_method",
    "Tolerance", "EXACT", "default_tolerance", "NoSuchExample",
    "graph_split", "GraphSplitError", "NearMiss", "NearMissDetector", "find_near_misses",
    "current_module", "module_in_scope",
]
