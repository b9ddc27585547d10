"""What a verification campaign found, as values: per target counts and the failures.

A campaign (``patternkit verify``, ``patternkit fuzz``) tries many instances against one
or more *targets* (a rule, a pass) and returns a :class:`CampaignReport`: one
:class:`TargetReport` per target (instances tried, how many fired or changed the
module, rejections by reason, the largest numeric error) and every :class:`Failure`,
each with the module that caused it (``.module``, an ``IRModule``, shrunk to a minimal
one where the campaign shrinks) and what went wrong (``.error``).

Reports merge (a campaign split into units, shards or processes adds up to the same
report), and pickle: a failure's modules travel as TVMScript text
(:func:`~patternkit.verification.script.module_text`), since IRModules do not pickle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import tvm

from .script import ScriptError, module_text, parse_module_text

__all__ = ["Failure", "TargetReport", "CampaignReport"]

#: Failures listed in a report's text before the rest are only counted.
SHOWN_FAILURES = 5


@dataclass
class Failure:
    """One instance that went wrong.

    Attributes
    ----------
    target : str
        The rule or pass that was checked.
    kind : str
        ``"mismatch"``, ``"ill-formed"``, ``"build"``, ``"raised"``, ``"timeout"``,
        ``"not-a-module"`` (see :data:`patternkit.verification.differential.FAILURE_KINDS`),
        or for rules ``"no-reason"`` (it did not fire and did not say why) and
        ``"example"`` (the rule's own example could not be built or run).
    error : str
        What went wrong.
    module : tvm.IRModule
        The input that caused it (the minimal one when :attr:`shrunk`).
    knobs : dict or None
        The example's keyword arguments, for a rule's instance.
    result : tvm.IRModule or None
        What the rule or pass made of :attr:`module`, when it returned a module.
    shrunk : bool
        :attr:`module` was shrunk from the first failing instance of its kind.
    occurrences : int
        How many generated instances failed this way (a shrunk failure stands for all
        of its kind).
    """

    target: str
    kind: str
    error: str
    module: Any
    knobs: dict | None = None
    result: Any = None
    shrunk: bool = False
    occurrences: int = 1

    @property
    def script(self) -> str:
        """:attr:`module` as TVMScript ready to paste into a test (constants inline)."""
        return _text(self.module)

    def __str__(self) -> str:
        head = f"{self.target}: {self.kind}: {self.error}"
        if self.occurrences > 1:
            head += f" ({self.occurrences} instances)"
        lines = [head]
        if self.knobs is not None:
            lines.append("  example(" + ", ".join(f"{k}={v!r}" for k, v in self.knobs.items())
                         + ")")
        what = "minimal module" if self.shrunk else "module"
        lines.append(f"  {what}:")
        lines += ["    " + line for line in self.script.splitlines()]
        return "\n".join(lines)

    # IRModules do not pickle in this TVM build: modules travel as their text.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("module", "result"):
            if isinstance(state[name], tvm.IRModule):
                state[name] = ("tvmscript", _text(state[name]))
        return state

    def __setstate__(self, state: dict) -> None:
        for name in ("module", "result"):
            value = state[name]
            if isinstance(value, tuple) and value and value[0] == "tvmscript":
                state[name] = _parse(value[1])
        self.__dict__.update(state)


def _text(mod: Any) -> str:
    if not isinstance(mod, tvm.IRModule):
        return str(mod)
    try:
        return module_text(mod)
    except ScriptError:  # still worth showing, with the constants as metadata
        return mod.script()


def _parse(text: str) -> Any:
    try:
        return parse_module_text(text)
    except Exception:  # text that did not re-parse (see _text) stays text
        return text


@dataclass
class TargetReport:
    """One target's share of a campaign.

    ``fired`` counts the instances a rule fired on (for a pass: the instances it
    changed); ``rejected`` maps each reason a rule gave for not firing to how often it
    gave it; ``max_abs_error`` is the largest difference the numeric checks saw, and
    ``tolerances`` the tolerances they applied (by dtype).
    """

    target: str
    tried: int = 0
    fired: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    max_abs_error: float = 0.0
    tolerances: dict[str, str] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether something was tried and nothing failed."""
        return self.tried > 0 and not self.failures

    def reject(self, reason: str) -> None:
        """Count one instance the target's rule refused, by reason."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def merge(self, other: TargetReport) -> None:
        """Add ``other`` (the same target, another unit of the campaign) to this report.

        Shrunk failures of a kind already shrunk here count as occurrences of it; every
        other failure is kept, in order.
        """
        self.tried += other.tried
        self.fired += other.fired
        for reason, count in other.rejected.items():
            self.rejected[reason] = self.rejected.get(reason, 0) + count
        self.max_abs_error = max(self.max_abs_error, other.max_abs_error)
        self.tolerances.update(other.tolerances)
        shrunk = {f.kind: f for f in self.failures if f.shrunk}
        for failure in other.failures:
            if failure.shrunk and failure.kind in shrunk:
                shrunk[failure.kind].occurrences += failure.occurrences
            else:
                self.failures.append(failure)
                if failure.shrunk:
                    shrunk[failure.kind] = failure
        self.seconds += other.seconds

    def summary(self) -> str:
        """One line: verdict, counts and the largest error seen."""
        verdict = "ok  " if self.ok else "FAIL"
        error = "n/a" if not self.fired else (
            "inf" if math.isinf(self.max_abs_error) else f"{self.max_abs_error:.3g}")
        text = (f"{verdict}  {self.target}: {self.tried} tried, {self.fired} fired, "
                f"{sum(self.rejected.values())} rejected, max abs error {error}")
        if self.tolerances:
            text += " (" + "; ".join(f"{d}: {t}" for d, t in sorted(self.tolerances.items())) + ")"
        if self.failures:
            text += f", {len(self.failures)} failure(s)"
        return text

    def details(self) -> list[str]:
        """The rejections by reason, most frequent first, one line each."""
        return [f"      {count:>4} x {reason}" for reason, count in
                sorted(self.rejected.items(), key=lambda item: (-item[1], item[0]))]


@dataclass
class CampaignReport:
    """A whole campaign: what was asked (:attr:`what`, budget, seed, shard) and what came.

    Attributes
    ----------
    what : str
        ``"verify"`` or ``"fuzz <target>"``.
    targets : list of TargetReport
    budget : int
        Instances per target (``tried`` may be smaller when the space is exhausted).
    seed : int
    shard : tuple of (int, int) or None
        ``(k, n)``: this report covers shard ``k`` of ``n`` (1-based).
    seconds : float
        Wall-clock time.
    """

    what: str
    targets: list[TargetReport] = field(default_factory=list)
    budget: int = 0
    seed: int = 0
    shard: tuple[int, int] | None = None
    seconds: float = 0.0

    @property
    def failures(self) -> list[Failure]:
        """Every target's failures, target by target."""
        return [f for t in self.targets for f in t.failures]

    @property
    def ok(self) -> bool:
        """Whether every target passed (and there was at least one)."""
        return all(t.ok for t in self.targets) and bool(self.targets)

    @property
    def tried(self) -> int:
        """The instances tried over all targets."""
        return sum(t.tried for t in self.targets)

    def __getitem__(self, target: str) -> TargetReport:
        for report in self.targets:
            if report.target == target:
                return report
        raise KeyError(f"no target {target!r} in this report "
                       f"({', '.join(t.target for t in self.targets)})")

    def summary(self) -> str:
        """One line: verdict, what ran, budget, seed, shard and failures."""
        shard = f", shard {self.shard[0]}/{self.shard[1]}" if self.shard else ""
        return (f"{'PASS' if self.ok else 'FAIL'}: {self.what}: {self.tried} instance(s), "
                f"budget {self.budget} per target, seed {self.seed}{shard}, "
                f"{len(self.failures)} failure(s), {self.seconds:.1f} s")

    def __str__(self) -> str:
        lines = []
        for target in self.targets:
            lines.append(target.summary())
            lines += target.details()
        failures = self.failures
        for failure in failures[:SHOWN_FAILURES]:
            lines += ["", str(failure)]
        if len(failures) > SHOWN_FAILURES:
            lines += ["", f"... and {len(failures) - SHOWN_FAILURES} more failure(s)"]
        lines += ["", self.summary()]
        return "\n".join(lines)
