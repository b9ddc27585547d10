"""``DFPatternCallback``: Relay's rewrite-rule class, the Relay face of :class:`RewriteRule`.

Relay code subclasses ``DFPatternCallback``, sets ``self.pattern``, optionally implements
``check(pre, node_map)`` and implements ``callback(pre, post, node_map)``;
``rule.rewrite(expr)`` applies it.  The rule model itself is
:class:`~patternkit.engine.rule.RewriteRule` (``check(match)`` / ``rewrite(match)``), which
the driver works with; this subclass only translates between the two spellings, and it
lives above the driver so that the rule model never imports the code that runs it.

A ``check`` may return a plan instead of ``True``; the callback finds it in
``node_map.plan``.
"""

from __future__ import annotations

from typing import Any

from .driver import rewrite
from .rule import MatchCheck, NodeMap, RewriteRule, RuleMatch


class DFPatternCallback(RewriteRule):
    """A rewrite rule written the Relay way.

    Parameters
    ----------
    require_type : bool
        Accepted for Relay compatibility; Relax expressions always carry their types.
    rewrite_once : bool
        Apply this callback in the first pass only instead of until nothing changes.

    Subclasses set ``self.pattern`` in ``__init__`` and implement :meth:`callback`.
    """

    def __init__(self, require_type: bool = False, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.require_type = require_type

    def check(self, pre: Any, node_map: NodeMap) -> Any:  # type: ignore[override]
        """``True`` or a plan to accept the match, :func:`patternkit.reject` to refuse it."""
        return True

    def callback(self, pre: Any, post: Any, node_map: NodeMap) -> Any:
        """Return the replacement for ``post``; ``post`` itself (Relay's idiom) or ``None``
        leaves the binding as it is.

        Relay gave ``None`` no meaning (its rewriter put a null node in the graph); here
        it declines the match, as returning ``post`` does, and the decline is recorded as
        a :class:`~patternkit.engine.driver.SkippedMatch` of kind ``"declined"`` and
        logged, so a callback that forgets its ``return`` shows up in the log.
        """
        raise NotImplementedError(f"{self.rule_name} must implement callback()")

    def match_check(self) -> MatchCheck | None:
        """Relay's ``check(pre, node_map)`` as the engines call a check."""
        if type(self).check is DFPatternCallback.check:
            return None
        check = self.check
        return lambda match: check(match.root, match.node_map)

    def rewrite_match(self, match: RuleMatch) -> Any:
        """Relay's ``callback(pre, post, node_map)`` as the driver calls a rewrite."""
        pre = match.root
        return self.callback(pre, pre, match.node_map)

    def rewrite(self, expr: Any) -> Any:  # type: ignore[override]  (Relay's meaning)
        """Relay's ``DFPatternCallback.rewrite``: ``patternkit.rewrite(self, expr)``."""
        return rewrite(self, expr)
