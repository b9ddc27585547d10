"""Rewrite rules: a pattern, an optional check and a callback, and what they receive.

A rule is a class with a ``pattern`` and a ``callback(pre, post, node_map)`` returning the
replacement expression, exactly as in Relay.  patternkit adds two things:

* ``name``: a dotted rule name (``"batchnorm.collapse"``) used in errors, logs and reports;
* ``check(pre, node_map)``: an optional veto that returns ``True`` or
  :func:`patternkit.reject` with a reason, so that a rule that does not fire can say why.

What the callback receives (Relax is in A-normal form, Relay was not):

* ``pre`` and ``post`` are the root binding's value, a ``relax.Call`` (or Tuple /
  TupleGetItem) whose arguments are Vars.  They are the same object: a match's inputs are
  Vars, and a Var already refers to any rewrite made earlier in the pass, which is what
  Relay's ``post`` gave.
* ``node_map[p]`` is a one-element list, as in Relay.  Wildcard, variable and constant
  patterns map to the argument as written (a Var or a constant); call, tuple and
  tuple-get-item patterns map to the matched *value* (e.g. the ``relax.Call``, so that
  ``node_map[conv][0].attrs`` works).  ``node_map.var(p)`` gives the Var that value is
  bound to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from ..dpl.matcher import Match
from ..dpl.pattern import DFPattern, pattern_to_text


class NodeMap(Mapping):
    """Pattern -> ``[matched expression]``, Relay's ``node_map``."""

    def __init__(self, match: Match):
        self._match = match

    def __getitem__(self, pattern: DFPattern) -> list:
        try:
            return [self._match.captures[pattern]]
        except KeyError:
            raise KeyError(f"pattern {pattern_to_text(pattern)} is not part of this match "
                           f"(an unmatched alternative, or a pattern from another rule)") from None

    def __iter__(self) -> Iterator[DFPattern]:
        return iter(self._match.captures)

    def __len__(self) -> int:
        return len(self._match.captures)

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._match.captures

    def var(self, pattern: DFPattern) -> Any:
        """The Var bound to the value ``pattern`` matched (the expression itself for leaves)."""
        return self._match.bound_vars.get(pattern, self[pattern][0])

    @property
    def match(self) -> Match:
        return self._match


class RewriteRule:
    """Base class of a rewrite rule (:class:`patternkit.DFPatternCallback` is its Relay face).

    Parameters
    ----------
    require_type : bool
        Accepted for Relay compatibility; Relax expressions always carry their types.
    rewrite_once : bool
        Apply this callback in the first pass only instead of until nothing changes.

    Subclasses set ``self.pattern`` in ``__init__`` and implement :meth:`callback`.
    """

    #: Dotted rule name; defaults to the class name.
    name: str = ""

    def __init__(self, require_type: bool = False, rewrite_once: bool = False):
        self.require_type = require_type
        self.rewrite_once = rewrite_once
        self.pattern: DFPattern | None = None

    @property
    def rule_name(self) -> str:
        return self.name or type(self).__name__

    def check(self, pre: Any, node_map: NodeMap) -> Any:
        """Return ``True`` to accept the match, or :func:`patternkit.reject` with a reason."""
        return True

    def callback(self, pre: Any, post: Any, node_map: NodeMap) -> Any:
        """Return the replacement for ``post`` (return ``post`` itself to leave it)."""
        raise NotImplementedError(f"{self.rule_name} must implement callback()")

    def roles(self) -> dict[str, DFPattern]:
        """Named sub-patterns (``x``, ``gamma``...): by default the pattern attributes."""
        return {name: value for name, value in vars(self).items()
                if isinstance(value, DFPattern) and name != "pattern"}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.rule_name}>"
