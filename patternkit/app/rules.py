r"""The rules a job applies: library names, the user's rule objects, or rule files.

``patterns=`` (and ``--patterns``) takes any mix of

* library names (``"batchnorm.collapse"``, ``"byoc.conv2d_add_relu"``);
* rule instances and :class:`~patternkit.engine.ruleset.RuleSet`\ s (Python only);
* ``"rules.py:NAME"``: the rule, rule list or RuleSet called ``NAME`` in that file;
* ``"rules.py"``: every rule instance defined at the top level of that file.

A rule *class* is a mistake worth naming (``GeluTanh`` instead of ``GeluTanh()``): it
would otherwise surface as ``'type' object is not iterable``.  Names in the report are
the names this accepts, so a report's list can be passed back as ``--patterns``.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..engine.rule import Rule, is_rule
from ..engine.ruleset import RuleSet
from ..errors import PatternError
from .loading import JobError


def resolve_rules(patterns: Any) -> RuleSet:
    """The rules ``patterns`` names, in the order given; default the whole library.

    Raises
    ------
    JobError
        An unknown library name (with the closest names), a rule class instead of an
        instance, a file that cannot be run or defines no rules, a ``NAME`` it lacks.
    """
    from patternkit.patterns import LIBRARY

    if patterns is None:
        return LIBRARY
    if is_rule(patterns) or isinstance(patterns, (RuleSet, str, type)):
        patterns = [patterns]
    rules: list[Rule] = []
    for item in patterns:
        rules.extend(_rules_of(item, LIBRARY))
    try:
        return RuleSet(rules)
    except PatternError as err:
        raise JobError(str(err)) from err


def _rules_of(item: Any, library: RuleSet) -> Iterable[Rule]:
    if is_rule(item):
        return [item]
    if isinstance(item, RuleSet):
        return list(item)
    if isinstance(item, type):
        if issubclass(item, Rule):
            raise JobError(f"patterns: {item.__name__} is a rule class; pass an instance, "
                           f"{item.__name__}()")
        raise JobError(f"patterns: {item.__name__} is a class, not a rule")
    if isinstance(item, str):
        return _rules_named(item.strip(), library)
    raise JobError(f"patterns: expected rule names, rules or RuleSets, found a "
                   f"{type(item).__name__}: {item!r:.80}")


def _rules_named(text: str, library: RuleSet) -> Sequence[Rule]:
    path_text, _, name = text.partition(":")
    if not path_text.endswith(".py"):
        try:
            return [library.find(text)]
        except KeyError as err:
            raise JobError(err.args[0]) from None
    path = Path(path_text)
    if not path.is_file():
        raise JobError(f"patterns: rule file not found: {path}")
    try:
        namespace = runpy.run_path(str(path))
    except Exception as err:
        raise JobError(f"{path}: running the rule file failed: "
                       f"{type(err).__name__}: {err}") from err
    if name:
        if name not in namespace:
            raise JobError(f"{path} defines no {name!r}")
        value = namespace[name]
        if isinstance(value, (list, tuple)):
            return [r for v in value for r in _rules_of(v, library)]
        return list(_rules_of(value, library))
    found = [v for k, v in namespace.items() if is_rule(v) and not k.startswith("_")]
    if not found:
        raise JobError(f"{path} defines no rule instances (define them at the top level, "
                       f"or name one with {path}:NAME)")
    return found
