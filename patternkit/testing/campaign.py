"""Campaigns as data: example-level units, stable shards, JSON Lines records, merge, resume.

Why: split by rule, one slow rule sets a campaign's wall time, a killed campaign starts
over and shards cannot be folded into one report.  Here a ``verify`` campaign is a list of
:class:`Unit` -- (rule, instance) pairs: each rule's budget split into its instances --
each assigned to a shard by a stable hash of its key (:func:`shard_of`, SHA-256, the same
in every process and on every machine), so ``N`` shards balance and their union is the
unsharded campaign, unit for unit.  Every unit that ends is one JSON line in the output
folder, flushed at once (:func:`run_verify_campaign`), so a run killed at any moment
loses at most the unit it was checking; ``resume`` skips the units already recorded.
The folder's ``campaign.json`` holds the campaign's identity (what, subjects, budget,
seed): a folder of another campaign is refused before any work.  :func:`merge_folders`
folds shard folders into the report an unsharded run gives.

Each unit is checked on its own (:func:`~patternkit.testing.fuzz.verify_instance`), so a
unit's record does not depend on which units ran before it: the rewrite sites of the
first :data:`~patternkit.testing.fuzz.SITE_INSTANCES` instances (by index) are validated
one by one, and each failing unit is shrunk on its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..errors import PatternkitError
from ..verification.report import CampaignReport, Failure, TargetReport
from .fuzz import (
    SHRUNK_KINDS,
    SITE_INSTANCES,
    Tick,
    knob_instances,
    shrink_knobs,
    verify_instance,
)

__all__ = ["Unit", "Campaign", "CampaignMismatch", "shard_of", "run_verify_campaign",
           "read_records", "report_of", "merge_folders", "HEADER", "FORMAT"]

#: The file of a record folder that holds the campaign's identity.
HEADER = "campaign.json"

#: The version of the record format; a folder of another version is refused.
FORMAT = 1


class CampaignMismatch(PatternkitError, ValueError):
    """A record folder holds another campaign (or no campaign) than the one asked for."""


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

    def identity(self) -> dict:
        """The header's content."""
        return {"format": FORMAT, "what": self.what, "subjects": list(self.subjects),
                "budget": self.budget, "seed": self.seed}

    def units(self, shard: tuple[int, int] | None = None) -> list[Unit]:
        """The campaign's units in order (of shard ``(k, n)`` only, when given)."""
        every = [Unit(s, i) for s in self.subjects for i in range(self.budget)]
        if shard is None:
            return every
        k, n = shard
        return [unit for unit in every if shard_of(unit, n) == k]


def _differences(found: dict, wanted: dict) -> str:
    keys = [key for key in wanted if found.get(key) != wanted[key]]
    parts = []
    for key in keys:
        if key == "subjects":
            parts.append(f"{len(found.get(key) or [])} subject(s) "
                         f"{'other than' if found.get(key) else 'not'} the "
                         f"{len(wanted[key])} asked for")
        else:
            parts.append(f"{key} {found.get(key)!r}, not {wanted[key]!r}")
    return "; ".join(parts)


def read_header(folder: Path) -> dict | None:
    """The identity recorded in ``folder`` (``None``: none is)."""
    path = Path(folder) / HEADER
    if not path.exists():
        return None
    try:
        header = json.loads(path.read_text())
    except ValueError:
        raise CampaignMismatch(f"{path} is not a campaign header (not JSON)") from None
    if not isinstance(header, dict):
        raise CampaignMismatch(f"{path} is not a campaign header")
    return header


def _claim(folder: Path, campaign: Campaign, records: Path, resume: bool) -> None:
    """Check that ``folder`` may take ``campaign``'s records; write its header."""
    header = read_header(folder)
    flag = "--resume" if resume else "--out"
    if header is not None and header != campaign.identity():
        raise CampaignMismatch(f"{flag} {folder}: it holds another campaign "
                               f"({_differences(header, campaign.identity())})")
    if header is None and resume:
        raise CampaignMismatch(f"--resume {folder}: no campaign recorded there "
                               f"(no {HEADER}); start one with --out")
    if not resume and records.exists() and records.stat().st_size:
        raise CampaignMismatch(f"--out {folder}: {records.name} already holds records; "
                               f"--resume {folder} to go on, or choose another folder")
    folder.mkdir(parents=True, exist_ok=True)
    if header is None:
        (folder / HEADER).write_text(json.dumps(campaign.identity(), indent=1) + "\n")


def _records_file(folder: Path, shard: tuple[int, int] | None) -> Path:
    name = "records.jsonl" if shard is None else f"records-{shard[0]}-of-{shard[1]}.jsonl"
    return folder / name


def _mend(path: Path) -> None:
    """Cut a line a killed run left half written, so the next record starts a line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def read_records(folder: Path) -> list[dict]:
    """Every complete record in ``folder``'s ``*.jsonl`` files.

    A half-written last line, left by a killed run, is not one.
    """
    records = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and {"subject", "instance"} <= record.keys():
                records.append(record)
    return records


def _failure_record(failure: Failure) -> dict:
    return {"kind": failure.kind, "error": failure.error, "reproducer": failure.script
            if failure.module is not None else None, "shrunk": failure.shrunk,
            "knobs": _plain(failure.knobs or {})}


def _plain(knobs: dict) -> dict:
    """Knobs as JSON values (their ``repr`` when they are not numbers or strings)."""
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
            for k, v in knobs.items()}


def run_unit(rule: Any, instances: list[dict], unit: Unit, seed: int, *,
             timeout: float | None, shrink: bool, widen: Callable | None) -> dict:
    """Check one unit; its record (``seconds`` is the only field that varies by run)."""
    start = time.perf_counter()
    record: dict[str, Any] = {"subject": unit.subject, "seed": seed,
                              "instance": unit.instance}
    report = TargetReport(unit.subject)
    failure = None
    if unit.instance < len(instances):
        knobs = instances[unit.instance]
        record["knobs"] = _plain(knobs)
        failure = verify_instance(rule, knobs, report, timeout, seed,
                                  sites=unit.instance < SITE_INSTANCES, widen=widen)
        if failure is not None and shrink and failure.kind in SHRUNK_KINDS:
            failure = shrink_knobs(rule, knobs, failure, timeout, seed, widen)
    if failure is not None:
        outcome = "failed"
    elif report.fired:
        outcome = "fired"
    elif report.rejected:
        outcome = "rejected"
    else:  # fewer distinct instances than the budget, or knobs that describe no module
        outcome = "no-instance"
    record.update(outcome=outcome, tried=report.tried, fired=report.fired,
                  rejected=next(iter(report.rejected), None),
                  max_abs_error=report.max_abs_error, tolerances=report.tolerances,
                  failure=None if failure is None else _failure_record(failure),
                  seconds=time.perf_counter() - start)
    return record


def _unit_report(record: dict) -> TargetReport:
    report = TargetReport(record["subject"], tried=record["tried"], fired=record["fired"],
                          max_abs_error=record["max_abs_error"],
                          tolerances=dict(record["tolerances"]),
                          seconds=record.get("seconds", 0.0))
    if record["rejected"] is not None:
        report.reject(record["rejected"])
    failure = record["failure"]
    if failure is not None:
        report.failures.append(Failure(record["subject"], failure["kind"], failure["error"],
                                       failure["reproducer"], failure["knobs"] or None,
                                       shrunk=failure["shrunk"]))
    return report


def report_of(campaign: Campaign, records: Iterable[dict],
              shard: tuple[int, int] | None = None) -> CampaignReport:
    """The campaign's report from its records (each unit once, in campaign order)."""
    by_key: dict[str, dict] = {}
    for record in records:
        by_key.setdefault(f"{record['subject']}#{record['instance']}", record)
    targets = []
    for subject in campaign.subjects:
        merged = TargetReport(subject)
        for index in range(campaign.budget):
            found = by_key.get(f"{subject}#{index}")
            if found is not None:
                merged.merge(_unit_report(found))
        targets.append(merged)
    return CampaignReport(campaign.what, targets, campaign.budget, campaign.seed, shard,
                          sum(t.seconds for t in targets))


def run_verify_campaign(rules: Sequence[Any], folder: str | Path, *, budget: int,
                        seed: int = 0, shard: tuple[int, int] | None = None,
                        resume: bool = False, timeout: float | None = None,
                        shrink: bool = True, widen: Callable | None = None,
                        tick: Tick | None = None) -> CampaignReport:
    """Verify ``rules`` unit by unit, one JSON line per unit in ``folder``.

    Parameters
    ----------
    rules : sequence of Rule
        The subjects.
    folder : path
        Where the header and the records go (created if missing).
    budget, seed : int
        Instances per rule, and their seed.
    shard : (k, n), optional
        Check only the units whose stable hash falls in shard ``k`` of ``n``.
    resume : bool
        Go on with the campaign recorded in ``folder``: its recorded units are skipped.
    timeout, shrink, widen :
        As for :func:`~patternkit.testing.fuzz.verify_rules`.
    tick : callable, optional
        ``tick(done, total, subject)`` after each unit.

    Returns
    -------
    CampaignReport
        The report of this shard's units: those checked now and those recorded before.

    Raises
    ------
    CampaignMismatch
        ``folder`` holds another campaign, or (``resume``) none; before any unit runs.
    """
    folder = Path(folder)
    campaign = Campaign("verify", tuple(rule.rule_name for rule in rules), budget, seed)
    path = _records_file(folder, shard)
    _claim(folder, campaign, path, resume)
    _mend(path)
    mine = campaign.units(shard)
    done = {r["subject"] + "#" + str(r["instance"]) for r in read_records(folder)}
    todo = [unit for unit in mine if unit.key not in done]
    by_name = {rule.rule_name: rule for rule in rules}
    instances: dict[str, list[dict]] = {}
    with path.open("a") as out:
        for count, unit in enumerate(todo, 1):
            rule = by_name[unit.subject]
            if unit.subject not in instances:
                instances[unit.subject] = knob_instances(rule, budget, seed)
            record = run_unit(rule, instances[unit.subject], unit, seed, timeout=timeout,
                              shrink=shrink, widen=widen)
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()  # a SIGKILL after this line loses nothing recorded
            if tick is not None:
                tick(count, len(todo), unit.subject)
    keys = {unit.key for unit in mine}
    records = [r for r in read_records(folder) if f"{r['subject']}#{r['instance']}" in keys]
    return report_of(campaign, records, shard)


def merge_folders(folders: Sequence[str | Path]) -> tuple[CampaignReport, int]:
    """Fold the record folders of one campaign's shards into its report.

    Returns
    -------
    (CampaignReport, int)
        The report an unsharded run gives, and how many of the campaign's units no
        folder recorded (0 when the shards cover it).

    Raises
    ------
    CampaignMismatch
        A folder holds no campaign, or another campaign than the first folder.
    """
    if not folders:
        raise CampaignMismatch("merge: no record folder given")
    identities: list[dict] = []
    for folder in folders:
        header = read_header(Path(folder))
        if header is None:
            raise CampaignMismatch(f"merge: {folder} holds no campaign (no {HEADER})")
        if identities and header != identities[0]:
            raise CampaignMismatch(f"merge: {folder} holds another campaign than "
                                   f"{folders[0]} ({_differences(header, identities[0])})")
        identities.append(header)
    first = identities[0]
    if first.get("format") != FORMAT:
        raise CampaignMismatch(f"merge: {folders[0]} has record format "
                               f"{first.get('format')!r}, not {FORMAT}")
    campaign = Campaign(first["what"], tuple(first["subjects"]), first["budget"],
                        first["seed"])
    records = [r for folder in folders for r in read_records(Path(folder))]
    covered = {f"{r['subject']}#{r['instance']}" for r in records}
    missing = sum(unit.key not in covered for unit in campaign.units())
    return report_of(campaign, records), missing
