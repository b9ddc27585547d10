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
import json
import multiprocessing
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from ..errors import PatternkitError
from ..verification.report import CampaignReport, Failure, TargetReport
from .campaign_checks import FuzzCheck, RoundtripCheck, VerifyCheck
from .campaign_units import FORMAT, Campaign, Unit, shard_of
from .example_db import CounterexampleDB
from .fuzz import DEFAULT_TIMEOUT, Tick

__all__ = ["Unit", "Campaign", "CampaignMismatch", "shard_of", "run_verify_campaign",
           "read_records", "report_of", "merge_folders", "check_library_rules", "HEADER", "FORMAT",
           "UnitCheck", "Executor", "local_executor", "process_executor", "run_campaign",
           "run_with_db", "claim_folder", "run_fuzz_campaign", "run_roundtrip_campaign",
           "read_header"]

#: The file of a record folder that holds the campaign's identity.
HEADER = "campaign.json"

class CampaignMismatch(PatternkitError, ValueError):
    """A record folder holds another campaign (or no campaign) than the one asked for."""


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
    """The campaign's report from its records (each unit once, in campaign order).

    Records of replayed counterexamples (:mod:`patternkit.testing.example_db`) count
    too, before their subject's units.  A shard's report leaves out the subjects whose
    units all fall in other shards.
    """
    by_key: dict[str, dict] = {}
    for record in records:
        by_key.setdefault(_key(record), record)
    targets = []
    with_units = {unit.subject for unit in campaign.units(shard)}
    for subject in campaign.subjects:
        if subject not in with_units:  # all of its units are other shards'
            continue
        merged = TargetReport(subject)
        for replay in by_key.values():  # replayed counterexamples come first
            if replay["subject"] == subject and _replayed(replay):
                merged.merge(_unit_report(replay))
        for index in range(campaign.budget):
            found = by_key.get(f"{subject}#{index}")
            if found is not None:
                merged.merge(_unit_report(found))
        targets.append(merged)
    return CampaignReport(campaign.what, targets, campaign.budget, campaign.seed, shard,
                          sum(t.seconds for t in targets))


# -- executors: where units are checked ----------------------------------------------------
#: Checks one unit and returns its record (a JSON-ready ``dict`` with at least
#: ``subject``, ``instance``, ``seed``, ``outcome`` and ``seconds``).  A check is plain
#: data (names, numbers: a dataclass of :mod:`patternkit.testing.campaign_checks`) that
#: pickles, so it can travel to a worker process or a remote worker; it rebuilds
#: what it needs there (the rule by name, the drawn instances) and caches it per process.
UnitCheck = Callable[[Unit], dict]


class Executor(Protocol):
    """Where a campaign's units are checked: ``executor(units, check)`` yields records.

    The contract every executor keeps (the local one, ``--jobs N``'s processes, a
    cluster's workers):

    * ``check(unit)`` is called once for each unit of ``units``, in this process or
      another (``check`` pickles; a worker may keep state between the units it checks);
    * one record is yielded per unit, as soon as it ends, in any order;
    * the records are ``check``'s return values unchanged: the caller writes each one
      (to the campaign's JSON Lines file) as it arrives, so an executor writes nothing
      itself and a run killed at any moment loses only the units not yet yielded;
    * an exception in ``check`` is a bug of the campaign (a check records a failing unit
      as a record, never raises): the executor lets it propagate.

    Everything that must be refused (bad shard, folder of another campaign, a target a
    worker cannot rebuild) is refused before the executor is called.
    """

    def __call__(self, units: Iterable[Unit], check: UnitCheck) -> Iterator[dict]:
        """The records of ``units``, one per unit, as they end."""
        ...


def local_executor(units: Iterable[Unit], check: UnitCheck) -> Iterator[dict]:
    """Check ``units`` one after the other in this process, in order."""
    for unit in units:
        yield check(unit)


def process_executor(jobs: int) -> Executor:
    """An executor on ``jobs`` spawned worker processes (``--jobs N``).

    ``spawn``, since TVM is not fork-safe; each worker imports TVM once and keeps what the
    check caches (rules, drawn instances) for the units it gets.
    """

    def run(units: Iterable[Unit], check: UnitCheck) -> Iterator[dict]:
        units = list(units)
        if len(units) <= 1:
            yield from local_executor(units, check)
            return
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs,
                                                    mp_context=context) as pool:
            futures = [pool.submit(check, unit) for unit in units]
            for future in concurrent.futures.as_completed(futures):
                yield future.result()

    return run


def run_campaign(campaign: Campaign, check: UnitCheck, folder: str | Path, *,
                 shard: tuple[int, int] | None = None, resume: bool = False,
                 executor: Executor = local_executor, tick: Tick | None = None,
                 first: Sequence[dict] = ()) -> CampaignReport:
    """Check ``campaign``'s units (of ``shard``) with ``executor``, recorded in ``folder``.

    Parameters
    ----------
    campaign : Campaign
        What is checked; its identity goes to ``folder``'s :data:`HEADER`.
    check : callable
        ``check(unit) -> record`` (:data:`UnitCheck`).
    folder : path
        Where the header and the records go (created if missing).
    shard : (k, n), optional
        Check only the units whose stable hash falls in shard ``k`` of ``n``.
    resume : bool
        Go on with the campaign recorded in ``folder``: its recorded units are skipped.
    executor : Executor
        Where the units are checked (default: here, in order).
    tick : callable, optional
        ``tick(done, total, subject)`` after each unit.
    first : sequence of dict
        Records written before any unit (replayed counterexamples).

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
    path = _records_file(folder, shard)
    _claim(folder, campaign, path, resume)
    _mend(path)
    mine = campaign.units(shard)
    done = {_key(r) for r in read_records(folder)}
    todo = [unit for unit in mine if unit.key not in done]
    with path.open("a") as out:
        for record in first:
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()
        for count, record in enumerate(executor(todo, check), 1):
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()  # a SIGKILL after this line loses nothing recorded
            if tick is not None:
                tick(count, len(todo), record["subject"])
    keys = {unit.key for unit in mine}
    records = [r for r in read_records(folder) if _key(r) in keys or _replayed(r)]
    return report_of(campaign, records, shard)


def _key(record: dict) -> str:
    return f"{record['subject']}#{record['instance']}"


def _replayed(record: dict) -> bool:
    """A record of a replayed counterexample (not one of the campaign's units)."""
    return not isinstance(record["instance"], int)


def run_verify_campaign(rules: Sequence[Any], folder: str | Path, *, budget: int,
                        seed: int = 0, shard: tuple[int, int] | None = None,
                        resume: bool = False, jobs: int = 1, timeout: float | None = None,
                        shrink: bool = True, widen: Callable | None = None,
                        tick: Tick | None = None, executor: Executor | None = None,
                        db: str | Path | None = None) -> CampaignReport:
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
    executor : Executor, optional
        Where the units are checked (default: here, or ``jobs`` processes); the rules
        must be the library's for any executor but the local one.
    db : path, optional
        A counterexample database (:mod:`patternkit.testing.example_db`): its
        counterexamples of these rules are replayed first, new ones are kept.

    Returns
    -------
    CampaignReport
        The report of this shard's units: those checked now and those recorded before.

    Raises
    ------
    CampaignMismatch
        ``folder`` holds another campaign, or (``resume``) none; before any unit runs.
    ValueError
        ``jobs > 1`` (or another executor) with a rule that is not the library's; before
        any unit runs.
    """
    remote = jobs > 1 or executor not in (None, local_executor)
    if remote:
        check_library_rules(rules)
    campaign = Campaign("verify", tuple(rule.rule_name for rule in rules), budget, seed)
    check = VerifyCheck(budget, seed, timeout, shrink, widen,
                        rules=None if remote else {rule.rule_name: rule for rule in rules})
    if executor is None:
        executor = process_executor(jobs) if jobs > 1 else local_executor
    return run_with_db(campaign, check, folder, db=db, shard=shard, resume=resume,
                       executor=executor, tick=tick)


def run_fuzz_campaign(target: Any, folder: str | Path, *, budget: int, seed: int = 0,
                      strategy: str = "networks", shard: tuple[int, int] | None = None,
                      resume: bool = False, timeout: float | None = DEFAULT_TIMEOUT,
                      shrink: bool = True, tick: Tick | None = None,
                      executor: Executor = local_executor,
                      db: str | Path | None = None) -> CampaignReport:
    """Differential-test ``target`` program by program, one JSON line per program.

    As :func:`~patternkit.testing.fuzz.fuzz_pass` judges each drawn program, recorded as
    :func:`run_verify_campaign` records (``shard``, ``resume``, ``tick``, ``executor``,
    ``db`` alike).  Each failing program is shrunk on its own, so a unit's record does
    not depend on the units before it.

    Parameters
    ----------
    target : str or transform
        A name (:func:`~patternkit.testing.fuzz.resolve_target`; any executor), or a
        transform object (checked with the local executor only).
    strategy : str
        A name of :data:`~patternkit.testing.fuzz.STRATEGIES`.

    Raises
    ------
    CampaignMismatch
        As for :func:`run_verify_campaign`.
    ValueError
        An unknown target name or strategy, or a target object with another executor;
        before any unit runs.
    """
    from .fuzz import STRATEGIES, resolve_target, transform_name

    if strategy not in STRATEGIES:
        raise ValueError(f"no strategy {strategy!r}: give one of {', '.join(STRATEGIES)}")
    if isinstance(target, str):
        resolve_target(target)  # a bad name is an error now, not in a worker
        check = FuzzCheck(target, budget, seed, strategy, timeout, shrink)
    elif executor is not local_executor:
        raise ValueError(f"{transform_name(target)}: only a target given by name runs "
                         f"in other processes; give its name or use the local executor")
    else:
        check = FuzzCheck(transform_name(target), budget, seed, strategy, timeout, shrink,
                          local=target)
    campaign = Campaign(f"fuzz {check.label}", (check.label,), budget, seed,
                        (("strategy", strategy),))
    return run_with_db(campaign, check, folder, db=db, shard=shard, resume=resume,
                       executor=executor, tick=tick)


def run_roundtrip_campaign(folder: str | Path, *, budget: int, seed: int = 0,
                           max_ops: int = 12, shard: tuple[int, int] | None = None,
                           resume: bool = False, tick: Tick | None = None,
                           executor: Executor = local_executor,
                           db: str | Path | None = None) -> CampaignReport:
    """``DefuseOps(FuseOps(g)) == g`` graph by graph, recorded as :func:`run_fuzz_campaign`."""
    campaign = Campaign("fuzz roundtrip", ("roundtrip",), budget, seed,
                        (("max_ops", max_ops),))
    return run_with_db(campaign, RoundtripCheck(budget, seed, max_ops), folder, db=db,
                       shard=shard, resume=resume, executor=executor, tick=tick)


def run_with_db(campaign: Campaign, check: Any, folder: str | Path, *,
                db: str | Path | None, **options: Any) -> CampaignReport:
    """:func:`run_campaign`, replaying ``db``'s counterexamples first and keeping new ones.

    ``check`` has a ``replay(subject, counterexample) -> record`` method for the replays.
    """
    if db is None:
        return run_campaign(campaign, check, folder, **options)
    store = CounterexampleDB(db)
    claim_folder(Path(folder), campaign, options.get("shard"), options.get("resume", False))
    replayed = store.replay(campaign, check, skip={_key(r) for r in read_records(Path(folder))})
    report = run_campaign(campaign, check, folder, first=replayed, **options)
    store.keep(campaign, read_records(Path(folder)))
    return report


def claim_folder(folder: Path, campaign: Campaign, shard: tuple[int, int] | None,
                 resume: bool) -> None:
    """Refuse ``folder`` (:class:`CampaignMismatch`) unless it may take ``campaign``."""
    _claim(folder, campaign, _records_file(folder, shard), resume)


def check_library_rules(rules: Sequence[Any]) -> None:
    """Refuse (``ValueError``) a rule that worker processes cannot rebuild by name."""
    from patternkit.patterns import LIBRARY

    for rule in rules:
        name = rule.rule_name
        if name not in LIBRARY.names or type(LIBRARY[name]) is not type(rule):
            raise ValueError(f"jobs > 1 checks library rules only (workers rebuild them by "
                             f"name): {name} is not one; use jobs=1")


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
    campaign = Campaign.from_identity(first)
    records = [r for folder in folders for r in read_records(Path(folder))]
    covered = {_key(r) for r in records}
    missing = sum(unit.key not in covered for unit in campaign.units())
    return report_of(campaign, records), missing
