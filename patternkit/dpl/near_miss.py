"""Why did a pattern not match?  The deepest point where matching failed.

When a rule does not fire, the question is which part of the pattern disagreed with the
graph.  :func:`explain` re-runs the matcher while recording, for every pattern node that
failed, how deep in the pattern it was; the deepest failure is the best near-miss: the
matcher got that far before the graph and the pattern parted ways.
"""

from __future__ import annotations

from typing import Any, cast

import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.rebuild import constant_text, expr_text
from .matcher import Lookup, Matcher, function_lookup
from .pattern import DFPattern, TagPattern, as_pattern, pattern_to_text

#: Levels of the failed sub-pattern a near miss shows: enough to recognise it, while a
#: large pattern (``attention.collapse``'s, with its ``through`` alternatives) would
#: otherwise print to megabytes.
NEAR_MISS_DEPTH = 3


class _TracingMatcher(Matcher):
    def __init__(self, lookup: Lookup | None = None):
        super().__init__(lookup)
        self.depth = 0
        self.deepest: tuple[int, DFPattern, Any] | None = None
        #: The tagged alternatives (``alt``) being tried, outermost first.
        self.tags: list[TagPattern] = []
        self.deepest_tags: tuple[TagPattern, ...] = ()

    def visit(self, pattern: DFPattern, expr: Any) -> bool:
        before, before_tags = self.deepest, self.deepest_tags
        # A tag names an alternative; it is no level of the pattern, so the depth a near
        # miss reports is the same with or without tags.
        tagged = type(pattern) is TagPattern
        if tagged:
            self.tags.append(cast(TagPattern, pattern))
        else:
            self.depth += 1
        try:
            ok = super().visit(pattern, expr)
        finally:
            if tagged:
                self.tags.pop()
            else:
                self.depth -= 1
        if ok:  # failures beneath a match (an alternative's other branch) are no near miss
            self.deepest, self.deepest_tags = before, before_tags
        # An operator mismatch is reported at its call, which shows the arguments too.
        # A failed tag is reported at the alternative it wraps.
        if tagged or isinstance(expr, tvm.ir.Op):
            return ok
        if not ok and (self.deepest is None or self.depth + 1 > self.deepest[0]):
            self.deepest = (self.depth + 1, pattern, expr)
            self.deepest_tags = tuple(self.tags)
        return ok


#: How many of the alternatives being tried an explanation names, innermost first.
TAGS_SHOWN = 4


def _describe(expr: Any, lookup: Lookup | None) -> str:
    value = lookup(expr) if isinstance(expr, relax.Var) and lookup else None
    if value is not None:
        return f"'{C.var_name(expr)}' = {_text(value)}"
    return _text(expr)


def _text(expr: Any) -> str:
    """One line of ``expr``; a constant shows its dtype and values, not a metadata index."""
    constant = constant_text(expr)
    return f"const {constant}" if constant is not None else expr_text(expr, 100)


def explain(pattern: DFPattern, expr: Any, func: relax.Function | None = None) -> str:
    """``"matched"``, or a one-line account of the deepest mismatch.

    >>> explain(wildcard() + wildcard(), relax.op.subtract(x, y))   # doctest: +SKIP
    'no match: add(*, *) (depth 1) vs R.subtract(x, y)'
    """
    found = deepest_miss(pattern, expr, function_lookup(func) if func is not None else None)
    return "matched" if found is None else found[1]


def deepest_miss(pattern: DFPattern, expr: Any, lookup: Lookup | None = None
                 ) -> tuple[int, str] | None:
    """``None`` if ``pattern`` matches ``expr``, else ``(depth, account)``: how deep in the
    pattern the deepest mismatch is, and :func:`explain`'s line for it.

    The depth lets a caller weigh several patterns at one place and show the closest;
    ``lookup`` (:func:`~patternkit.dpl.matcher.function_lookup`) is built once for many calls.
    """
    matcher = _TracingMatcher(lookup)
    if matcher.match(as_pattern(pattern), expr) is not None:
        return None
    assert matcher.deepest is not None  # a failed match failed somewhere
    depth, failed, where = matcher.deepest
    # the alternatives of alt(...) it was trying, by name (``key_form=transposed``): the
    # innermost few, which are where it failed (a large pattern nests a dozen)
    trail = [f" in {t.tag}={t.name}" for t in matcher.deepest_tags if t is not failed]
    if len(trail) > TAGS_SHOWN:
        trail = [" in ...", *trail[-TAGS_SHOWN:]]
    tags = "".join(trail)
    return depth, (f"no match: {pattern_to_text(failed, NEAR_MISS_DEPTH)} (depth {depth}{tags}) "
                   f"vs {_describe(where, lookup)}")
