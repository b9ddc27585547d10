"""Rules that silently decline everything: a forgotten ``return`` made visible.

A rewrite returning ``None`` leaves its match as it is, and a check returning ``None``
refuses it; both are logged at INFO, which reads exactly like "the rule did not match".
A rule whose every offered match ended in such a bare ``None`` most likely lost a
``return`` statement, so the driver tallies, per rule and per ``rewrite`` call, what its
check and its rewrite returned, and at the end of the call warns once per such rule
with :class:`~patternkit.errors.RuleDeclinedEveryMatch`, pointing at the rule's method
(so the warning filters by the user's module, and names the line to look at).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import RuleDeclinedEveryMatch


@dataclass
class DeclineTally:
    """What one rule's check and rewrite returned during one ``rewrite`` call."""

    checked: int = 0  # matches its check was called on
    check_none: int = 0  # ...that it answered with a bare None
    offered: int = 0  # matches its rewrite was called on
    rewrite_none: int = 0  # ...that it answered with None
    rewritten: int = 0  # matches it replaced

    def silent_part(self) -> str | None:
        """``"check"`` or ``"rewrite"`` if that part declined every match with a bare
        ``None`` and nothing was rewritten; ``None`` otherwise.
        """
        if self.rewritten:
            return None
        if self.offered and self.rewrite_none == self.offered:
            return "rewrite"
        if self.checked and self.check_none == self.checked:
            return "check"
        return None


def warn_silent_declines(tallies: Iterable[tuple[str, Any, DeclineTally]]) -> None:
    """Warn once for each rule whose check or rewrite declined all it saw with ``None``.

    ``tallies``: (rule name, the rule, its tally) per rule of one ``rewrite`` call.
    """
    for name, rule, tally in tallies:
        part = tally.silent_part()
        if part is None:
            continue
        method, what = _method_of(rule, part)
        if part == "rewrite":
            count = tally.offered
            on_purpose = ("return post" if what == "callback"
                          else "refuse it in the check with reject(reason)")
            advice = (f"its {what} returned None for all {count} match(es) it was offered, "
                      f"so nothing was rewritten: is a `return` missing? (to leave a match "
                      f"on purpose, {on_purpose})")
        else:
            count = tally.checked
            advice = (f"its {what} returned None for all {count} match(es) it was offered, "
                      f"which refuses them with no reason: is a `return True` missing? (a "
                      f"check accepts with True or a plan, refuses with reject(reason))")
        filename, lineno, module = _site(method)
        warnings.warn_explicit(f"rule {name}: {advice}", RuleDeclinedEveryMatch,
                               filename, lineno, module=module)


def _method_of(rule: Any, part: str) -> tuple[Any, str]:
    """The user's function behind ``part`` of ``rule`` and how to name it.

    A :class:`~patternkit.engine.callback.CallbackRule` stands for a Relay callback:
    its rewrite is the callback's ``callback``, its check the callback's ``check``.
    """
    relay: Any = getattr(rule, "callback", None)
    if callable(getattr(relay, "as_rule", None)):  # the adapter of a DFPatternCallback
        if part == "rewrite":
            return relay.callback, "callback"
        return relay.check, "check"
    return getattr(rule, part), part


def _site(method: Any) -> tuple[str, int, str]:
    """``(file, line, module)`` of ``method``'s definition, for the warning to point at."""
    func = inspect.unwrap(getattr(method, "__func__", method))
    code = getattr(func, "__code__", None)
    if code is None:
        return "<rule>", 0, "patternkit.engine.declines"
    return code.co_filename, code.co_firstlineno, getattr(func, "__module__", "") or ""
