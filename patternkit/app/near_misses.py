"""The job's near misses: the families' skeletons the rewrite left, and why.

``patternkit run`` asks the library's detectors (:mod:`patternkit.patterns.near_misses`),
restricted to the rules the job applied, where a family's shape is still in the rewritten
model, and writes each site with the rule that looked at it and its reason to
``report.md`` ("Near misses") and ``report.json``.  A report that cannot be made says
NOT RUN with the reason; it never fails the job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import tvm

from ..engine.driver import RewriteLog
from ..engine.near_misses import NearMiss, find_near_misses
from ..engine.ruleset import RuleSet
from ..errors import first_line

__all__ = ["NearMissSection", "near_misses_of"]

logger = logging.getLogger(__name__)


@dataclass
class NearMissSection:
    """The report's near misses; ``not_run`` says why there are none to show."""

    misses: list[NearMiss] = field(default_factory=list)
    not_run: str | None = None
    #: The families whose skeletons were looked for.
    families: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """The section as ``report.json`` writes it."""
        if self.not_run is not None:
            return {"not_run": self.not_run}
        return {"families": list(self.families),
                "misses": [miss.to_dict() for miss in self.misses]}


def near_misses_of(log: RewriteLog, rules: RuleSet, rewritten: tvm.IRModule) -> NearMissSection:
    """What the families of ``rules`` left in ``rewritten`` (the module the rewrite logged
    in ``log`` left, or the input where no rewrite rule ran), and why.
    """
    from patternkit.patterns.near_misses import detectors  # the library loads when asked

    try:
        chosen = detectors(rules)
        if not chosen:
            return NearMissSection(not_run="none of the rules applied belongs to a library "
                                           "family with a near-miss detector")
        misses = (log.near_misses(chosen) if log.result is not None
                  else find_near_misses(rewritten, chosen, log.skipped))
    except Exception as err:  # noqa: BLE001 - a report that cannot be made says why
        line = first_line(err) if str(err).strip() else ""
        return NearMissSection(not_run=f"{type(err).__name__}: {line}")
    for miss in misses:
        logger.info("near miss: %s", miss)
    return NearMissSection(misses, families=list(dict.fromkeys(d.family for d in chosen)))
