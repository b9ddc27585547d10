"""Why a match was found and not used: one record (:class:`Skip`) and one enum (:class:`SkipKind`).

Every pass that proposes matches leaves some alone: the grouping of matches
(:func:`~patternkit.engine.proposal.find_groups`) skips overlaps, escaping intermediates
and refusals, the rewrite driver adds the matches a rewrite declined.  They all record
the same thing, so they share one record: which rule, in which function, at which
binding, of what kind, and why (with the check's
:class:`~patternkit.engine.rule.Reject`, whose ``at`` and ``site`` say where).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .rule import Reject

__all__ = ["Skip", "SkipKind"]


class SkipKind(str, enum.Enum):
    """Why a match was found but not used (compares equal to its value, ``"overlap"``...)."""

    #: One of its bindings (its root, or an interior one) was already taken by another
    #: match: an earlier group of the same pattern, or a rule earlier in the round.
    OVERLAP = "overlap"
    #: An interior result is also read outside the match (by live code).
    ESCAPE = "escape"
    #: The rule's (or the table entry's) check refused it.
    CHECK = "check"
    #: The rule's rewrite returned ``None`` (or the root unchanged): binding left as it is.
    DECLINED = "declined"
    #: Fusing the match would make the composite depend on itself (TVM's merge semantics).
    CYCLE = "cycle"


@dataclass(frozen=True)
class Skip:
    """A match a rule found but did not use, and why.

    Attributes
    ----------
    rule : str
        The rule's name (``""`` where the caller matched a bare pattern).
    function : str
        The function the match is in.
    root : str
        The name of the match's root Var.
    reason : str
        One line saying why.
    rejection : Reject or None
        The check's refusal (``None`` for the other kinds); its ``site`` names the guard.
    kind : SkipKind
        Which guard left it.
    position : tuple of (int, int) or None
        The root binding's (block, binding) position in the function index.
    covered : tuple
        The Vars of the bindings the match would have replaced (interior first, root
        last), so reports can say which ops it concerned without matching again.
    """

    rule: str
    function: str
    root: str
    reason: str
    rejection: Reject | None = field(default=None, compare=False, repr=False)
    kind: SkipKind = SkipKind.CHECK
    position: tuple[int, int] | None = field(default=None, compare=False)
    covered: tuple[Any, ...] = field(default=(), compare=False, repr=False)
