"""What one unit of a recorded campaign checks: ``verify``, ``fuzz`` and ``fuzz roundtrip``.

Why: an executor (:data:`~patternkit.testing.campaign.Executor`) sends a unit and a check
to wherever the unit runs -- this process, a spawned worker, a cluster's worker -- so a
check is plain data that pickles (names, numbers, a picklable ``widen``), rebuilds its
subject by name where it runs and keeps it, and the instances it draws, for the next
unit it checks in that process.  Each check turns one unit into one JSON-ready record of
the same shape (:func:`record_of`), so ``merge`` and ``resume`` treat every campaign
alike, and each can :meth:`replay` a kept counterexample (a module) first
(:mod:`patternkit.testing.example_db`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import tvm

from ..verification.report import Failure, TargetReport
from .campaign_units import Unit
from .fuzz import (
    DEFAULT_TIMEOUT,
    SHRUNK_KINDS,
    SITE_INSTANCES,
    draw_instances,
    fuzz_instance,
    knob_instances,
    named_strategy,
    resolve_target,
    roundtrip_instance,
    shrink_knobs,
    transform_name,
    verify_instance,
)

__all__ = ["VerifyCheck", "FuzzCheck", "RoundtripCheck", "record_of", "failure_record",
           "kept_in_process"]

#: What a process has rebuilt or drawn, by (kind, name, budget, seed, ...): once per process.
_KEPT: dict[tuple, Any] = {}


def kept_in_process(key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``, made once per process for ``key`` (a check's rules, drawn instances)."""
    if key not in _KEPT:
        _KEPT[key] = make()
    return _KEPT[key]


def plain(knobs: dict) -> dict:
    """Knobs as JSON values (their ``repr`` when they are not numbers or strings)."""
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
            for k, v in knobs.items()}


def failure_record(failure: Failure) -> dict:
    """A failure as JSON: kind, error, the reproducer as TVMScript, shrunk, knobs."""
    return {"kind": failure.kind, "error": failure.error, "reproducer": failure.script
            if failure.module is not None else None, "shrunk": failure.shrunk,
            "knobs": plain(failure.knobs or {})}


def record_of(subject: str, instance: int | str, seed: int, report: TargetReport,
              outcome: str, start: float, **extra: Any) -> dict:
    """One unit's record (``seconds`` is the only field that varies from run to run).

    Parameters
    ----------
    subject, instance, seed :
        The unit, and the campaign's seed.
    report : TargetReport
        What checking the unit found (at most one failure).
    outcome : str
        ``"failed"``, or what happened otherwise (``"fired"``, ``"changed"``, ...).
    start : float
        ``time.perf_counter()`` when the unit began.
    extra :
        More fields (a verify unit's ``knobs``).
    """
    failure = report.failures[0] if report.failures else None
    return {"subject": subject, "seed": seed, "instance": instance, **extra,
            "outcome": outcome, "tried": report.tried, "fired": report.fired,
            "rejected": next(iter(report.rejected), None),
            "max_abs_error": report.max_abs_error, "tolerances": report.tolerances,
            "failure": None if failure is None else failure_record(failure),
            "seconds": time.perf_counter() - start}


def _fuzz_outcome(report: TargetReport) -> str:
    if report.failures:
        return "failed"
    if not report.tried:
        return "skipped" if report.rejected else "no-instance"
    return "changed" if report.fired else "unchanged"


def _replay_record(subject: str, key: str, seed: int, report: TargetReport,
                   start: float) -> dict:
    return record_of(subject, key, seed, report, _fuzz_outcome(report), start, replay=True)


@dataclass(frozen=True)
class VerifyCheck:
    """A ``verify`` unit: instance ``i`` of a rule's knob instances (its defaults first).

    ``rules`` (name -> rule) checks rules of the caller's in this process; without it
    the rule is the library's, rebuilt by name (what a worker does).
    """

    budget: int
    seed: int
    timeout: float | None = DEFAULT_TIMEOUT
    shrink: bool = True
    widen: Callable | None = None
    rules: dict | None = field(default=None, compare=False)

    def rule(self, name: str) -> Any:
        """The rule named ``name``: the caller's, or the library's."""
        if self.rules is not None:
            return self.rules[name]
        from patternkit.patterns import LIBRARY
        return LIBRARY[name]

    def __call__(self, unit: Unit) -> dict:
        """Check ``unit``; its record."""
        start = time.perf_counter()
        rule = self.rule(unit.subject)
        instances = kept_in_process(("verify", unit.subject, id(rule), self.budget, self.seed),
                          lambda: knob_instances(rule, self.budget, self.seed))
        report = TargetReport(unit.subject)
        extra: dict[str, Any] = {}
        if unit.instance < len(instances):
            knobs = instances[unit.instance]
            extra["knobs"] = plain(knobs)
            failure = verify_instance(rule, knobs, report, self.timeout, self.seed,
                                      sites=unit.instance < SITE_INSTANCES, widen=self.widen)
            if failure is not None and self.shrink and failure.kind in SHRUNK_KINDS:
                failure = shrink_knobs(rule, knobs, failure, self.timeout, self.seed,
                                       self.widen)
            if failure is not None:
                report.failures.append(failure)
        if report.failures:
            outcome = "failed"
        elif report.fired:
            outcome = "fired"
        elif report.rejected:
            outcome = "rejected"
        else:  # fewer distinct instances than the budget, or knobs that describe no module
            outcome = "no-instance"
        return record_of(unit.subject, unit.instance, self.seed, report, outcome, start,
                         **extra)

    def replay(self, subject: str, key: str, module: tvm.IRModule) -> dict:
        """A kept counterexample of rule ``subject``: the rule on ``module``, judged."""
        start = time.perf_counter()
        report = fuzz_instance(self.rule(subject), module, label=subject, seed=self.seed,
                               timeout=self.timeout, shrink=False)
        return _replay_record(subject, key, self.seed, report, start)


@dataclass(frozen=True)
class FuzzCheck:
    """A ``fuzz`` unit: drawn program ``i`` of ``strategy`` through the target.

    ``target`` is a name (:func:`~patternkit.testing.fuzz.resolve_target`), rebuilt where
    the unit runs; ``local`` an object of the caller's, checked in this process only.
    """

    target: str
    budget: int
    seed: int
    strategy: str = "networks"
    timeout: float | None = DEFAULT_TIMEOUT
    shrink: bool = True
    local: Any = field(default=None, compare=False)

    def transform(self) -> Any:
        """The target: the caller's object, or rebuilt from its name (once per process)."""
        if self.local is not None:
            return self.local
        return kept_in_process(("target", self.target), lambda: resolve_target(self.target))

    @property
    def label(self) -> str:
        """The target's name in records and reports."""
        return self.target if self.local is None else transform_name(self.local)

    def __call__(self, unit: Unit) -> dict:
        """Check ``unit``; its record."""
        start = time.perf_counter()
        instances = kept_in_process(("fuzz", self.strategy, self.budget, self.seed),
                          lambda: draw_instances(named_strategy(self.strategy), self.budget,
                                                 self.seed))
        if unit.instance >= len(instances):
            report = TargetReport(unit.subject)
        else:
            report = fuzz_instance(self.transform(), instances[unit.instance],
                                   label=unit.subject, seed=self.seed, timeout=self.timeout,
                                   shrink=self.shrink)
        return record_of(unit.subject, unit.instance, self.seed, report,
                         _fuzz_outcome(report), start)

    def replay(self, subject: str, key: str, module: tvm.IRModule) -> dict:
        """A kept counterexample: the target on ``module``, judged (not shrunk again)."""
        start = time.perf_counter()
        report = fuzz_instance(self.transform(), module, label=subject, seed=self.seed,
                               timeout=self.timeout, shrink=False)
        return _replay_record(subject, key, self.seed, report, start)


@dataclass(frozen=True)
class RoundtripCheck:
    """A ``fuzz roundtrip`` unit: ``DefuseOps(FuseOps(g)) == g`` on drawn graph ``i``."""

    budget: int
    seed: int
    max_ops: int = 12

    def __call__(self, unit: Unit) -> dict:
        """Check ``unit``; its record."""
        from .graphs import relax_graphs

        start = time.perf_counter()
        instances = kept_in_process(("roundtrip", self.max_ops, self.budget, self.seed),
                          lambda: draw_instances(relax_graphs(max_ops=self.max_ops),
                                                 self.budget, self.seed))
        report = (roundtrip_instance(instances[unit.instance])
                  if unit.instance < len(instances) else TargetReport(unit.subject))
        return record_of(unit.subject, unit.instance, self.seed, report,
                         _fuzz_outcome(report), start)

    def replay(self, subject: str, key: str, module: tvm.IRModule) -> dict:
        """A kept counterexample: the round trip of ``module``."""
        start = time.perf_counter()
        return _replay_record(subject, key, self.seed, roundtrip_instance(module), start)
