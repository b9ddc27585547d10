"""A campaign's units and identity: what is checked, and which shard checks it.

Why: the checks that run a unit, the counterexample database and the recorder all speak
of units and campaigns; kept apart here, none of them imports the others to know what a
unit is (:mod:`patternkit.testing.campaign` puts them together).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Unit", "Campaign", "shard_of", "FORMAT"]

#: The version of the record format; a folder of another version is refused.
FORMAT = 1


@dataclass(frozen=True)
class Unit:
    """One instance of one subject: the smallest piece of a campaign that is recorded."""

    subject: str
    instance: int

    @property
    def key(self) -> str:
        """``subject#instance``: what the shard hash and the records are keyed by."""
        return f"{self.subject}#{self.instance}"


def shard_of(unit: Unit, count: int) -> int:
    """The shard (1-based, of ``count``) ``unit`` belongs to: a stable hash of its key."""
    digest = hashlib.sha256(unit.key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


@dataclass(frozen=True)
class Campaign:
    """What a campaign checks: its identity, recorded in a folder's :data:`HEADER`."""

    what: str
    subjects: tuple[str, ...]
    budget: int
    seed: int
    #: What else decides the units' records (a fuzz campaign's strategy), as sorted pairs.
    options: tuple[tuple[str, Any], ...] = ()

    def identity(self) -> dict:
        """The header's content."""
        identity = {"format": FORMAT, "what": self.what, "subjects": list(self.subjects),
                    "budget": self.budget, "seed": self.seed}
        if self.options:
            identity["options"] = dict(self.options)
        return identity

    @classmethod
    def from_identity(cls, header: dict) -> Campaign:
        """The campaign a folder's header describes."""
        return cls(header["what"], tuple(header["subjects"]), header["budget"],
                   header["seed"], tuple(sorted((header.get("options") or {}).items())))

    def units(self, shard: tuple[int, int] | None = None) -> list[Unit]:
        """The campaign's units in order (of shard ``(k, n)`` only, when given)."""
        every = [Unit(s, i) for s in self.subjects for i in range(self.budget)]
        if shard is None:
            return every
        k, n = shard
        return [unit for unit in every if shard_of(unit, n) == k]
