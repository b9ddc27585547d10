"""``DFPatternCallback``: Relay's rewrite-rule class, as an adapter onto the rule protocol.

Relay code subclasses ``DFPatternCallback``, sets ``self.pattern``, optionally implements
``check(pre, node_map)`` and implements ``callback(pre, post, node_map)``;
``callback.rewrite(expr)`` applies it.  Those methods keep Relay's meaning, so a callback
is not a :class:`~patternkit.engine.rule.Rule` (whose ``check(match)`` and
``rewrite(match)`` mean something else): :meth:`DFPatternCallback.as_rule` gives the
rule it stands for, a :class:`CallbackRule`, and every entry point that takes rules
(``pk.rewrite``, :class:`~patternkit.engine.ruleset.RuleSet`, tables, verification) makes
that conversion with :func:`~patternkit.engine.rule.as_rule`.

A ``check`` may return a plan instead of ``True``; the callback finds it in
``node_map.plan``.  This module lives above the driver so that ``callback.rewrite(expr)``
can run it, and the rule model never imports the code that runs it.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..dpl.pattern import DFPattern
from ..ir.copying import deepcopy_sharing_tvm_objects
from .driver import rewrite
from .rule import NodeMap, RewriteRule, RoleMatch, RuleMatch
from .tolerance import Tolerance, default_tolerance

__all__ = ["CallbackRule", "DFPatternCallback"]


class DFPatternCallback:
    """A rewrite rule written the Relay way.

    Parameters
    ----------
    require_type : bool
        Accepted for Relay compatibility; Relax expressions always carry their types.
    rewrite_once : bool
        Apply this callback in the first pass only instead of until nothing changes.

    Subclasses set ``self.pattern`` in ``__init__`` and implement :meth:`callback`
    (and :meth:`check` to refuse matches).  A dotted ``name`` class attribute names it in
    logs and errors (default: the class name).  Like a rule, it may give an
    :meth:`example` for ``patternkit verify``.
    """

    __deepcopy__ = deepcopy_sharing_tvm_objects

    #: Roles whose binding may be read outside the match (see ``Rule.escapable_roles``).
    escapable_roles: tuple[str, ...] = ()

    def __init__(self, require_type: bool = False, rewrite_once: bool = False):
        self.pattern: DFPattern | None = None
        self.require_type = require_type
        self.rewrite_once = rewrite_once

    @property
    def name(self) -> str:
        """The rule's dotted name; defaults to the class name."""
        return self.__dict__.get("_name") or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        self.__dict__["_name"] = value

    @property
    def rule_name(self) -> str:
        """:attr:`name`, as rules spell it too."""
        return self.name

    def check(self, pre: Any, node_map: NodeMap) -> Any:
        """``True`` or a plan to accept the match, :func:`patternkit.reject` to refuse it."""
        return True

    def callback(self, pre: Any, post: Any, node_map: NodeMap) -> Any:
        """Return the replacement for ``post``; ``post`` itself (Relay's idiom) or ``None``
        leaves the binding as it is.

        Relay gave ``None`` no meaning (its rewriter put a null node in the graph); here
        it declines the match, as returning ``post`` does, and the decline is recorded as
        a :class:`~patternkit.engine.skip.Skip` of kind ``"declined"`` and
        logged.  A callback that returns ``None`` for every match it is offered most
        likely forgot its ``return``: ``rewrite`` then warns once with
        :class:`~patternkit.errors.RuleDeclinedEveryMatch`, pointing at this method.
        """
        raise NotImplementedError(f"{self.name} must implement callback()")

    def rewrite(self, expr: Any) -> Any:
        """Relay's ``DFPatternCallback.rewrite``: ``patternkit.rewrite(self, expr)``."""
        return rewrite(self, expr)

    def roles(self) -> dict[str, DFPattern]:
        """Named sub-patterns: the pattern attributes, as for a rule."""
        return {name: value for name, value in vars(self).items()
                if isinstance(value, DFPattern) and name != "pattern"}

    def example(self, **knobs: Any) -> Any:
        """A small ``tvm.IRModule`` the callback fires on (``None``: none); see ``Rule.example``."""
        return None

    def example_space(self) -> dict[str, Sequence[Any]] | list[dict[str, Sequence[Any]]]:
        """The knobs of :meth:`example`; see ``Rule.example_space``."""
        return {}

    def tolerance(self, dtype: str | None) -> Tolerance:
        """How far the result may drift from the input on llvm; see ``Rule.tolerance``."""
        return default_tolerance(dtype)

    def as_rule(self) -> CallbackRule:
        """The rule this callback stands for (a new adapter, reading the callback as it is now)."""
        if type(self).check is DFPatternCallback.check:
            return CallbackRule(self)
        return CheckedCallbackRule(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class CallbackRule(RewriteRule):
    """A :class:`DFPatternCallback` on the rule protocol: Relay's methods called the Relay way.

    ``rewrite(match)`` calls ``callback(pre, post, node_map)`` with ``pre`` and ``post``
    the matched root (in Relax a match's inputs are Vars, which already refer to earlier
    rewrites: what Relay's ``post`` gave).  The rule's name, pattern, roles, example and
    tolerance are the callback's.
    """

    def __init__(self, callback: DFPatternCallback):
        super().__init__(rewrite_once=callback.rewrite_once)
        self.callback = callback
        self.pattern = callback.pattern
        self.escapable_roles = callback.escapable_roles

    @property
    def name(self) -> str:
        """The callback's name."""
        return self.callback.name

    @name.setter
    def name(self, value: str) -> None:
        self.callback.name = value

    def roles(self) -> dict[str, DFPattern]:
        """The callback's named roles, so ``match["role"]`` reads the same on both."""
        return self.callback.roles()

    def rewrite(self, match: RoleMatch) -> Any:
        """Relay's ``callback(pre, post, node_map)`` on a single-root match."""
        assert isinstance(match, RuleMatch)
        pre = match.root
        return self.callback.callback(pre, pre, match.node_map)

    def example(self, **knobs: Any) -> Any:
        """The callback's example: the contract tests build from the callback's knobs."""
        return self.callback.example(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]] | list[dict[str, Sequence[Any]]]:
        """The callback's knob space, as ``Rule.example_space`` describes it."""
        return self.callback.example_space()

    def tolerance(self, dtype: str | None) -> Tolerance:
        """The callback's tolerance: the adapter promises what the callback promises."""
        return self.callback.tolerance(dtype)


class CheckedCallbackRule(CallbackRule):
    """A :class:`CallbackRule` whose callback has Relay's ``check(pre, node_map)``."""

    def check(self, match: RoleMatch) -> Any:
        """Relay's ``check(pre, node_map)`` on a single-root match."""
        assert isinstance(match, RuleMatch)
        return self.callback.check(match.root, match.node_map)
