r"""The rules a job applies: library names, the user's rule objects, or rule files.

``patterns=`` (and ``--patterns``, comma-separated) takes any mix of

* library names (``"batchnorm.collapse"``, ``"byoc.conv2d_add_relu"``), and ``"library"``
  for the whole library: ``--patterns library,rules.py`` applies the user's rules
  together with the library (the library first), where ``--patterns rules.py`` applies
  the user's rules alone;
* rule objects (Python only): anything satisfying the rule protocol
  (:func:`~patternkit.engine.rule.is_rule`: rule instances, ``pk.rule_by_example`` and
  ``pk.from_rewriter`` rules, a ``DFPatternCallback``),
  :class:`~patternkit.engine.ruleset.RuleSet`\ s, and rule classes whose constructor
  needs no argument (built here);
* ``"rules.py:NAME"``: the rule, rule class, rule list or RuleSet called ``NAME`` in that
  file;
* ``"rules.py"``: every rule the file defines at the top level: rule objects, and the
  rule classes defined in the file whose constructor needs no argument and which are not
  instantiated there already.

A rule class whose constructor needs arguments is a mistake worth naming (``Fold``
instead of ``Fold(axis=1)``): it would otherwise surface as ``'type' object is not
iterable``.  Names in the report are the names this accepts, so a report's list can be
passed back as ``--patterns``.
"""

from __future__ import annotations

import inspect
import runpy
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..engine.rule import Rule, as_rule, is_rule
from ..engine.ruleset import RuleSet
from ..errors import PatternError, first_line
from .loading import JobError

#: The name that stands for the whole library among ``patterns``.
LIBRARY_NAME = "library"

#: ``__module__`` of what ``runpy.run_path`` defines: the classes a rule file itself defines.
_RUN_PATH_MODULE = "<run_path>"


def resolve_rules(patterns: Any) -> RuleSet:
    """The rules ``patterns`` names, in the order given; default the whole library.

    A string may hold several comma-separated entries (``"library,rules.py"``).

    Raises
    ------
    JobError
        An unknown library name (with the closest names), a rule class whose constructor
        needs arguments, a file that cannot be run or defines no rules, a ``NAME`` it
        lacks, two rules of one name.
    """
    from patternkit.patterns import LIBRARY

    if patterns is None:
        return LIBRARY
    if is_rule(patterns) or isinstance(patterns, (RuleSet, str, type)):
        patterns = [patterns]
    rules: list[Rule] = []
    for item in patterns:
        if isinstance(item, str) and "," in item:
            for part in (p.strip() for p in item.split(",")):
                if part:
                    rules.extend(_rules_of(part, LIBRARY))
            continue
        rules.extend(_rules_of(item, LIBRARY))
    try:
        return RuleSet(rules)
    except PatternError as err:
        raise JobError(str(err)) from err


def _rules_of(item: Any, library: RuleSet) -> Iterable[Rule]:
    if isinstance(item, type):
        return [_built(item)]
    if is_rule(item):
        try:
            return [as_rule(item, "patterns")]
        except PatternError as err:
            raise JobError(str(err)) from err
    if isinstance(item, RuleSet):
        return list(item)
    if isinstance(item, str):
        return _rules_named(item.strip(), library)
    raise JobError(f"patterns: expected rule names, rules or RuleSets, found a "
                   f"{type(item).__name__}: {item!r:.80}")


def _is_rule_class(cls: type) -> bool:
    return issubclass(cls, Rule) or callable(getattr(cls, "as_rule", None))


def _required_arguments(cls: type) -> list[str]:
    """The constructor's parameters that have no default (``[]``: it builds with none)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _built(cls: type) -> Rule:
    """The rule a rule class builds with no argument; a clear error otherwise."""
    if not _is_rule_class(cls):
        raise JobError(f"patterns: {cls.__name__} is a class, not a rule")
    needed = _required_arguments(cls)
    if needed:
        raise JobError(f"patterns: {cls.__name__} is a rule class whose constructor needs "
                       f"{', '.join(needed)}; pass an instance, {cls.__name__}(...)")
    try:
        rule = as_rule(cls(), "patterns")
    except Exception as err:
        raise JobError(f"patterns: building {cls.__name__}() failed: "
                       f"{type(err).__name__}: {first_line(err)}") from err
    try:
        rule.validate()
    except PatternError as err:
        raise JobError(f"patterns: {cls.__name__}() is no usable rule: {err}") from err
    return rule


def _rules_named(text: str, library: RuleSet) -> Sequence[Rule]:
    if text == LIBRARY_NAME:
        return list(library)
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
        namespace = runpy.run_path(str(path), run_name=_RUN_PATH_MODULE)
    except Exception as err:
        raise JobError(f"{path}: running the rule file failed: "
                       f"{type(err).__name__}: {first_line(err)}") from err
    if name:
        if name not in namespace:
            raise JobError(f"{path} defines no {name!r}")
        value = namespace[name]
        if isinstance(value, (list, tuple)):
            return [r for v in value for r in _rules_of(v, library)]
        return list(_rules_of(value, library))
    return _rules_defined(path, namespace)


def _rules_defined(path: Path, namespace: dict[str, Any]) -> list[Rule]:
    """The file's top-level rules: rule objects, then its own rule classes not
    instantiated in it (in definition order).
    """
    public = {k: v for k, v in namespace.items() if not k.startswith("_")}
    found = [as_rule(v, str(path)) for v in public.values()
             if is_rule(v) and not isinstance(v, type)]
    instantiated = {type(v) for v in public.values() if is_rule(v) and not isinstance(v, type)}
    skipped = []
    for key, value in public.items():
        if not (isinstance(value, type) and _is_rule_class(value)
                and value.__module__ == _RUN_PATH_MODULE and value not in instantiated):
            continue
        needed = _required_arguments(value)
        if needed:
            skipped.append(f"{key} (its constructor needs {', '.join(needed)})")
            continue
        try:
            found.append(_built(value))
        except JobError as err:  # a helper base class of the file's rules, say
            skipped.append(f"{key} ({err})")
    if not found:
        why = f"; skipped: {'; '.join(skipped)}" if skipped else ""
        raise JobError(f"{path} defines no rules (define rule objects or rule classes at "
                       f"the top level, or name one with {path}:NAME){why}")
    return found
