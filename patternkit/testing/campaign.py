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

import concurrent.futures
import hashlib
import json
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

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
           "read_records", "report_of", "merge_folders", "check_library_rules", "HEADER", "FORMAT"]

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
                        resume: bool = False, jobs: int = 1, timeout: float | None = None,
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
    jobs : int
        Worker processes (``spawn``); the rules must then be the library's (workers
        rebuild them by name) and ``widen`` must pickle.
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
    ValueError
        ``jobs > 1`` with a rule that is not the library's; before any unit runs.
    """
    if jobs > 1:
        check_library_rules(rules)
    folder = Path(folder)
    campaign = Campaign("verify", tuple(rule.rule_name for rule in rules), budget, seed)
    path = _records_file(folder, shard)
    _claim(folder, campaign, path, resume)
    _mend(path)
    mine = campaign.units(shard)
    done = {r["subject"] + "#" + str(r["instance"]) for r in read_records(folder)}
    todo = [unit for unit in mine if unit.key not in done]
    options = dict(budget=budget, seed=seed, timeout=timeout, shrink=shrink, widen=widen)
    if jobs > 1 and len(todo) > 1:
        ended = _in_workers(todo, jobs, options)
    else:
        ended = _here(todo, {rule.rule_name: rule for rule in rules}, options)
    with path.open("a") as out:
        for count, record in enumerate(ended, 1):
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()  # a SIGKILL after this line loses nothing recorded
            if tick is not None:
                tick(count, len(todo), record["subject"])
    keys = {unit.key for unit in mine}
    records = [r for r in read_records(folder) if f"{r['subject']}#{r['instance']}" in keys]
    return report_of(campaign, records, shard)


def _here(units: list[Unit], by_name: dict[str, Any], options: dict) -> Iterator[dict]:
    """The records of ``units``, checked in this process, in order."""
    instances: dict[str, list[dict]] = {}
    for unit in units:
        rule = by_name[unit.subject]
        if unit.subject not in instances:
            instances[unit.subject] = knob_instances(rule, options["budget"], options["seed"])
        yield _checked(rule, instances[unit.subject], unit, options)


def _checked(rule: Any, instances: list[dict], unit: Unit, options: dict) -> dict:
    return run_unit(rule, instances, unit, options["seed"], timeout=options["timeout"],
                    shrink=options["shrink"], widen=options["widen"])


def check_library_rules(rules: Sequence[Any]) -> None:
    """Refuse (``ValueError``) a rule that worker processes cannot rebuild by name."""
    from patternkit.patterns import LIBRARY

    for rule in rules:
        name = rule.rule_name
        if name not in LIBRARY.names or type(LIBRARY[name]) is not type(rule):
            raise ValueError(f"jobs > 1 checks library rules only (workers rebuild them by "
                             f"name): {name} is not one; use jobs=1")


#: A worker's drawn instances, per (rule, budget, seed): drawn once per process.
_DRAWN: dict[tuple, list[dict]] = {}


def _worker_unit(unit: Unit, options: dict) -> dict:
    from patternkit.patterns import LIBRARY

    rule = LIBRARY[unit.subject]
    key = (unit.subject, options["budget"], options["seed"])
    if key not in _DRAWN:
        _DRAWN[key] = knob_instances(rule, options["budget"], options["seed"])
    return _checked(rule, _DRAWN[key], unit, options)


def _in_workers(units: list[Unit], jobs: int, options: dict) -> Iterator[dict]:
    """The records of ``units``, checked in ``jobs`` spawned processes, as they end."""
    context = multiprocessing.get_context("spawn")  # TVM is not fork-safe
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_worker_unit, unit, options) for unit in units]
        for future in concurrent.futures.as_completed(futures):
            yield future.result()


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
