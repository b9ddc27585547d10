"""Counterexamples that persist: ``--db DIR`` replays last run's failures first.

Why: a failure a long campaign found is worth more than any new instance, and a shrunk
reproducer thrown away with the run's folder must be found again from scratch.  Here
every failing unit's shrunk reproducer (TVMScript) is kept in Hypothesis's directory
example database (:class:`hypothesis.database.DirectoryBasedExampleDatabase`: a folder of
files, safe for several shards writing at once, one key per campaign kind and subject),
and the next campaign with the same ``db`` replays them before any unit of its own: a
replay that fails again is recorded (instance ``replay:<hash>``) and fails the run; one
that passes is dropped from the database (the bug is fixed).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Iterable

from ..errors import PatternkitError
from ..verification.script import parse_module_text
from .campaign_units import Campaign

__all__ = ["CounterexampleDB", "BadDatabase"]

log = logging.getLogger(__name__)


class BadDatabase(PatternkitError, ValueError):
    """The ``--db`` folder cannot be used (its parent is missing, or it is a file)."""


class CounterexampleDB:
    """The shrunk reproducers of failing units, by campaign kind and subject.

    Parameters
    ----------
    folder : path
        The database's folder; created if missing, but its parent must exist (a typo
        in a path is refused, not taken as a new database).

    Raises
    ------
    BadDatabase
        ``folder``'s parent does not exist, or ``folder`` is a file.
    """

    def __init__(self, folder: str | Path) -> None:
        from hypothesis.database import DirectoryBasedExampleDatabase

        self.folder = Path(folder)
        parent = self.folder.resolve().parent
        if not parent.is_dir():
            raise BadDatabase(f"--db {folder}: no folder {parent} to hold it")
        if self.folder.exists() and not self.folder.is_dir():
            raise BadDatabase(f"--db {folder}: a file, not a folder")
        self.database = DirectoryBasedExampleDatabase(str(self.folder))

    @staticmethod
    def key(campaign: Campaign, subject: str) -> bytes:
        """The database key of ``subject``'s counterexamples (any budget, seed, shard)."""
        return f"patternkit {campaign.what.split()[0]} {subject}".encode()

    def counterexamples(self, campaign: Campaign, subject: str) -> list[dict]:
        """The kept counterexamples of ``subject``, in a stable order."""
        found = []
        for value in sorted(self.database.fetch(self.key(campaign, subject))):
            try:
                found.append({**json.loads(value), "value": value})
            except ValueError:
                self.database.delete(self.key(campaign, subject), value)
        return found

    def replay(self, campaign: Campaign, check: Any, skip: Iterable[str] = ()) -> list[dict]:
        """Records of every kept counterexample of ``campaign``'s subjects, checked now.

        ``check.replay(subject, key, module)`` checks one; ``skip`` holds the keys
        (``subject#replay:<hash>``) already recorded (a resumed run).  One that passes
        now is dropped from the database.
        """
        skip = set(skip)
        records = []
        for subject in campaign.subjects:
            for kept in self.counterexamples(campaign, subject):
                instance = "replay:" + hashlib.sha256(kept["value"]).hexdigest()[:12]
                if f"{subject}#{instance}" in skip:
                    continue
                try:
                    module = parse_module_text(kept["reproducer"])
                except Exception as err:  # a reproducer this TVM cannot parse any more
                    log.warning("dropped a kept counterexample of %s that does not parse: "
                                "%s", subject, err)
                    self.database.delete(self.key(campaign, subject), kept["value"])
                    continue
                record = check.replay(subject, instance, module)
                records.append(record)
                if record["outcome"] != "failed":
                    self.database.delete(self.key(campaign, subject), kept["value"])
        return records

    def keep(self, campaign: Campaign, records: Iterable[dict]) -> int:
        """Keep the reproducer of every failing unit of ``records``; how many are new."""
        added = 0
        for record in records:
            failure = record.get("failure")
            if record.get("replay") or not failure or not failure.get("reproducer"):
                continue
            # the error's text varies with the seed: one entry per module and kind
            value = json.dumps({"kind": failure["kind"], "reproducer": failure["reproducer"]},
                               sort_keys=True).encode()
            key = self.key(campaign, record["subject"])
            if value not in set(self.database.fetch(key)):
                self.database.save(key, value)
                added += 1
        return added
