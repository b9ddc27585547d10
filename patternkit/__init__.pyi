"""The public names of :mod:`patternkit`, for type checkers (the module loads them lazily)."""

from __future__ import annotations

from .app.job import run as run
from .app.loading import load as load
from .app.verify import verify as verify
from .byoc import (
    AnnotateTarget as AnnotateTarget,
    MergeComposite as MergeComposite,
    PartitionGraph as PartitionGraph,
    PatternTable as PatternTable,
    offload_report as offload_report,
)
from .dpl import (
    DFPattern as DFPattern,
    PatternContext as PatternContext,
    alt as alt,
    dominates as dominates,
    explain as explain,
    is_constant as is_constant,
    is_expr as is_expr,
    is_if as is_if,
    is_op as is_op,
    is_scalar as is_scalar,
    is_tuple as is_tuple,
    is_tuple_get_item as is_tuple_get_item,
    is_var as is_var,
    match as match,
    wildcard as wildcard,
)
from .engine import (
    CompositeRule as CompositeRule,
    DFPatternCallback as DFPatternCallback,
    Reject as Reject,
    Rewrite as Rewrite,
    RewriteLog as RewriteLog,
    RewriteRule as RewriteRule,
    Rule as Rule,
    RuleMatch as RuleMatch,
    RuleSet as RuleSet,
    partition as partition,
    reject as reject,
    rewrite as rewrite,
)
from .engine.from_rewriter import from_rewriter as from_rewriter
from .errors import (
    PatternError as PatternError,
    PatternkitError as PatternkitError,
    PatternkitWarning as PatternkitWarning,
    RuleDeclinedEveryMatch as RuleDeclinedEveryMatch,
)
from .fusion import DefuseOps as DefuseOps
from .ir import from_expr as from_expr
from .verification import (
    assert_same_numerics as assert_same_numerics,
    check_roundtrip as check_roundtrip,
    compare as compare,
    validate_sites as validate_sites,
)
from .verification.by_example import rule_by_example as rule_by_example
from .viz import viz_diff as viz_diff, viz_expr as viz_expr
from .viz.explorer import explore as explore

__version__: str
__all__: list[str]
PUBLIC: dict[str, tuple[str, ...]]
MOVED: dict[str, tuple[str, ...]]

