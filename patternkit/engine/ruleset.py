"""Rule sets: an ordered, immutable collection of rules that composes like a value.

``RuleSet`` is what onnxscript's ``RewriteRuleSet`` and egglog's rulesets are: a value
you build once, combine with ``|`` and filter by name prefix, then hand to any pass that
takes rules.  Rewrite passes (:func:`patternkit.rewrite`, :func:`patternkit.Rewrite`) apply
its :class:`~patternkit.engine.rule.RewriteRule` members, external-compiler passes
(:class:`patternkit.PatternTable`, ``MergeComposite``, ``offload_report``) its
:class:`~patternkit.engine.rule.CompositeRule` members, each in the set's order (the
order is the priority).  Nothing is registered anywhere: a set is only what it holds.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Iterator, cast

from ..errors import PatternError
from .rule import CompositeRule, Rule, is_rule, require_instance


class RuleSet:
    """An ordered set of rules with unique dotted names.

    Parameters
    ----------
    rules : iterable of Rule
        In priority order.  The same rule object twice is kept once; two different rules
        with one name are an error (names are how logs, reports and ``--patterns`` refer
        to rules).  A ``DFPatternCallback`` is kept as it was given (``find`` returns it);
        the passes that apply it make it a rule (:func:`~patternkit.engine.rule.as_rule`).

    Examples
    --------
    >>> from patternkit.patterns import LIBRARY                        # doctest: +SKIP
    >>> pk.rewrite(LIBRARY.by_prefix("batchnorm."), mod)               # doctest: +SKIP
    >>> pk.MergeComposite(LIBRARY.for_compiler("ccompiler"))           # doctest: +SKIP
    """

    __slots__ = ("_rules",)

    def __init__(self, rules: Iterable[Rule] | Rule = ()):
        require_instance(rules, "RuleSet")
        # Rules, and adapters onto one (a DFPatternCallback), as given.
        items: Iterable[Any] = (rules,) if is_rule(rules) else cast("Iterable[Rule]", rules)
        kept: list[Rule] = []
        by_name: dict[str, Rule] = {}
        for i, rule in enumerate(items):
            require_instance(rule, f"RuleSet item {i}")
            if not is_rule(rule):
                raise PatternError(f"a RuleSet holds rules (RewriteRule, DFPatternCallback, "
                                   f"CompositeRule); item {i} is a {type(rule).__name__}: "
                                   f"{rule!r:.80}")
            other = by_name.get(rule.name)
            if other is rule:
                continue
            if other is not None:
                what = (f"two instances of {type(rule).__name__}; give each its own `name`"
                        if type(other) is type(rule) else f"{other!r} and {rule!r}")
                raise PatternError(f"two different rules are named '{rule.name}' ({what}); "
                                   f"rule names must be unique in a RuleSet")
            by_name[rule.name] = rule
            kept.append(rule)
        self._rules: tuple[Rule, ...] = tuple(kept)

    # -- a sequence of rules -----------------------------------------------------------------
    def __iter__(self) -> Iterator[Rule]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __getitem__(self, key: int | str) -> Rule:
        """The rule at a position, or the rule called ``key``."""
        if isinstance(key, str):
            return self.find(key)
        return self._rules[key]

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self.names
        return any(rule is item for rule in self._rules)

    def __or__(self, other: Any) -> RuleSet:
        """The rules of both, this set's first (``a | b`` gives ``a`` priority)."""
        require_instance(other, "RuleSet | ...")
        if is_rule(other):
            other = (other,)
        if not isinstance(other, (RuleSet, list, tuple)):
            return NotImplemented
        return RuleSet((*self._rules, *other))

    def __ror__(self, other: Any) -> RuleSet:
        require_instance(other, "... | RuleSet")
        if is_rule(other):
            other = (other,)
        if not isinstance(other, (list, tuple)):
            return NotImplemented
        return RuleSet((*other, *self._rules))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RuleSet):
            return NotImplemented
        return len(self._rules) == len(other._rules) and all(
            a is b for a, b in zip(self._rules, other._rules))

    def __hash__(self) -> int:
        return hash(tuple(id(rule) for rule in self._rules))

    def __repr__(self) -> str:
        return f"RuleSet({list(self.names)!r})"

    # -- queries -------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """The rules' dotted names, in application order."""
        return tuple(rule.name for rule in self._rules)

    def by_prefix(self, prefix: str) -> RuleSet:
        """The rules whose names start with ``prefix`` (``"batchnorm."``), as TVM's registry."""
        return RuleSet(rule for rule in self._rules if rule.name.startswith(prefix))

    def find(self, name: str) -> Rule:
        """The rule called ``name``; the ``KeyError`` suggests the closest names."""
        for rule in self._rules:
            if rule.name == name:
                return rule
        close = difflib.get_close_matches(name, list(self.names), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown pattern {name!r}{hint} (patternkit list shows them all)")

    def select(self, names: Iterable[str]) -> RuleSet:
        """The rules called ``names``, in that order (``KeyError`` for an unknown name)."""
        return RuleSet(self.find(name) for name in names)

    def rewrite_rules(self) -> RuleSet:
        """The rewrite rules (what :func:`patternkit.rewrite` applies): every member that is
        not a :class:`CompositeRule` (a ``DFPatternCallback`` is one, as it was given).
        """
        return RuleSet(rule for rule in self._rules if not isinstance(rule, CompositeRule))

    def composites(self) -> RuleSet:
        """The :class:`CompositeRule` members (what ``MergeComposite`` forms)."""
        return RuleSet(rule for rule in self._rules if isinstance(rule, CompositeRule))

    def for_compiler(self, compiler: str) -> RuleSet:
        """The same set with every composite named ``"<compiler>.<pattern_name>"``."""
        return RuleSet(rule.for_compiler(compiler) if isinstance(rule, CompositeRule) else rule
                       for rule in self._rules)
