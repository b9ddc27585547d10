"""``DFPatternCallback``: Relay's rewrite-rule class, the Relay face of :class:`RewriteRule`.

Relay code subclasses ``DFPatternCallback``, sets ``self.pattern`` and implements
``callback(pre, post, node_map)``; ``rule.rewrite(expr)`` applies it.  The rule model
itself is :class:`~patternkit.engine.rule.RewriteRule`, which the driver works with; this
subclass only adds Relay's ``rewrite`` method, and it lives above the driver so that the
rule model never imports the code that runs it.
"""

from __future__ import annotations

from typing import Any

from .driver import rewrite
from .rule import RewriteRule


class DFPatternCallback(RewriteRule):
    """A rewrite rule written the Relay way; see :class:`~patternkit.engine.rule.RewriteRule`."""

    def rewrite(self, expr: Any) -> Any:
        """Relay's ``DFPatternCallback.rewrite``: ``patternkit.rewrite(self, expr)``."""
        return rewrite(self, expr)
