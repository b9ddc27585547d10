"""What the main job found, as typed sections, and the same told in Markdown.

:func:`patternkit.app.job.run` fills a :class:`JobReport`: one dataclass per section
(:class:`OffloadSection`, :class:`NumericResult`, :class:`SiteValidation`,
:class:`RoundTripEntry`), so the verdict, the command line's summary and ``report.md``
read fields, not string keys.  :meth:`JobReport.to_dict` is ``report.json``: each section
writes the keys it always wrote, in the same order, and leaves out what did not happen
(a model that did not build has no error figures), so the files users read keep their
content.

The sections also answer ``section["key"]`` and ``section.get("key")`` as the
dictionaries they replace did, with a :class:`DeprecationWarning`, for one release.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from ..verification import numeric
from ..verification.sites import SiteReport
from .near_misses import NearMissSection
from .summary import OpSummary, markdown_table

__all__ = ["JobReport", "NearMissSection", "NumericResult", "OffloadSection", "RoundTripEntry",
           "SiteValidation", "report_markdown"]

_NAN = float("nan")


class _ReadsLikeTheOldDict:
    """``section["key"]``, ``section.get("key")`` and ``"key" in section`` read
    :meth:`to_dict`, as the ``dict`` the section replaces did; deprecated.
    """

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def _old_dict(self) -> dict[str, Any]:
        warnings.warn(f"JobReport sections are dataclasses now: read "
                      f"{type(self).__name__}'s attributes instead of its keys (keys are "
                      f"what report.json holds: to_dict())", DeprecationWarning, stacklevel=3)
        return self.to_dict()

    def __getitem__(self, key: str) -> Any:
        return self._old_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._old_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._old_dict()



#: The job's verdicts (:attr:`JobReport.verdict`).
PASS_VERDICT, FAIL_VERDICT, NOT_RUN_VERDICT = "PASS", "FAIL", "NOT RUN"
#: ``patternkit run``'s exit code per verdict (2 is bad input: argparse's, and ours).
EXIT_CODES = {PASS_VERDICT: 0, FAIL_VERDICT: 1, NOT_RUN_VERDICT: 3}

@dataclass
class OffloadSection:
    """What the external compiler got: composites per entry, op calls offloaded, and each
    op call left on the host with the reason (:class:`patternkit.byoc.HostOp`, as text).
    """

    composites: dict[str, int] = field(default_factory=dict)
    offloaded_ops: int = 0
    host_ops: list[str] = field(default_factory=list)


@dataclass
class NumericResult(_ReadsLikeTheOldDict):
    """The whole-model comparison of the entry function, before against after.

    ``status`` is ``"pass"``, ``"fail"``, ``"inconclusive"`` or ``"refused"``, the
    float64 arbitration's where it ran.  A model that did not build has ``not_built``
    (``"before"``: the model as imported; ``"after"``: the rewritten one) and
    ``build_error`` and no figures.  Fields left ``None`` did not happen and are not
    written to ``report.json``.
    """

    ok: bool = False
    not_built: str | None = None
    build_error: str | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    rtol: float | None = None
    atol: float | None = None
    seed: int | None = None
    #: Integer input -> ``[low, high)`` the inputs were drawn in.
    int_ranges: dict[str, list[int]] | None = None
    #: Why the inputs were not compared (they would read outside a table).
    refused: list[str] | None = None
    #: ``after`` is structurally identical to ``before``: built and run once.
    identical: bool | None = None
    status: str | None = None
    reason: str | None = None
    magnitude: float | None = None
    norm_error: float | None = None
    norm_bound: float | None = None
    #: The symbolic sizes checked (the example's, then the smallest), when checked twice.
    sizes: list[dict[str, int]] | None = None
    #: Symbolic variable -> the dimension it stands for (``s43`` -> ``batch``).
    roles: dict[str, str] | None = None
    #: The model's float dtype, when it was judged against float64.
    dtype: str | None = None
    #: :func:`patternkit.app.precision.float64_check`'s result.
    float64: dict[str, Any] | None = None
    #: The float64 check ran because a float32 comparison missed its tolerance.
    float64_after_miss: bool | None = None

    @classmethod
    def not_built_by(cls, side: str, error: str, seed: int) -> NumericResult:
        """Nothing compared: ``side`` (``"before"`` or ``"after"``) does not build."""
        return cls(ok=False, not_built=side, build_error=error, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        """The section as ``report.json`` writes it: the fields that are set."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    @property
    def verdict(self) -> str:
        """``status``, or ``"pass"``/``"fail"`` from ``ok`` where nothing set one."""
        return self.status or ("pass" if self.ok else "fail")


@dataclass
class SiteValidation(_ReadsLikeTheOldDict):
    """Every rewrite site validated on its own (:func:`patternkit.validate_sites`).

    ``report`` is what validation found; ``not_run`` says why it could not run; neither
    when nothing was rewritten.
    """

    report: SiteReport | None = None
    not_run: str | None = None

    @property
    def ok(self) -> bool:
        """No site failed (a validation that did not run is NOT RUN, not a failure)."""
        return self.report is None or self.report.ok

    @property
    def by_rule(self) -> dict[str, dict[str, int]]:
        """Rule -> ``{"sites", "validated", "failed", "not_run"}``; empty when none ran."""
        return self.report.by_rule() if self.report is not None else {}

    def __bool__(self) -> bool:
        return self.report is not None or self.not_run is not None

    def to_dict(self) -> dict[str, Any]:
        """The section as ``report.json`` writes it (empty when no site was validated)."""
        if self.not_run is not None:
            return {"ok": True, "not_run": self.not_run}
        return self.report.to_dict() if self.report is not None else {}


@dataclass
class RoundTripEntry(_ReadsLikeTheOldDict):
    """A fuse/defuse round trip: the verdict, the difference, and the dead bindings the
    fusion dropped (not compared: nothing reads them), so that nothing is hidden.
    """

    ok: bool
    difference: str | None = None
    #: Why the fusion's own output is not well formed, when it is not.
    fusion_ill_formed: str | None = None
    dropped_dead: list[str] = field(default_factory=list)
    #: Why the round trip could not run (TVM could not legalise or fuse the model): NOT
    #: RUN, neither a pass nor a failure.
    not_run: str | None = None

    @classmethod
    def of(cls, result: Any) -> RoundTripEntry:
        """From a :class:`patternkit.RoundTripResult`."""
        return cls(result.ok, result.difference, result.fusion_ill_formed,
                   [str(d) for d in result.dropped_dead])

    @classmethod
    def could_not_run(cls, reason: str) -> RoundTripEntry:
        """A round trip TVM could not run (``ok``: a check that did not run failed
        nothing).
        """
        return cls(True, not_run=reason)

    def to_dict(self) -> dict[str, Any]:
        """The entry as ``report.json`` writes it."""
        return asdict(self)


@dataclass
class JobReport:
    """What :func:`patternkit.app.job.run` did; also written as ``report.json`` and
    ``report.md``.
    """

    model: str
    compiler: str
    func: str = "main"
    import_fixups: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    rewrites: dict[str, int] = field(default_factory=dict)
    #: The families' skeletons the rewrite left, and why (``None``: not looked for).
    near_misses: NearMissSection | None = None
    offload: OffloadSection = field(default_factory=OffloadSection)
    ops: list[OpSummary] = field(default_factory=list)
    numeric: NumericResult = field(default_factory=NumericResult)
    sites: SiteValidation = field(default_factory=SiteValidation)
    roundtrip: dict[str, RoundTripEntry] = field(default_factory=dict)
    #: :func:`patternkit.app.training.train_check`'s section (empty without ``train``).
    training: dict[str, Any] = field(default_factory=dict)
    drawings: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The job's verdict: numerics, every rewrite site, round trips and training."""
        return (self.numeric_ok and self.sites.ok
                and all(r.ok for r in self.roundtrip.values())
                and self.training.get("ok", True))

    @property
    def verdict(self) -> str:
        """``PASS``, ``FAIL`` or ``NOT RUN``.

        ``NOT RUN`` when nothing failed but nothing could be judged either: the model as
        imported does not build for llvm (no output was compared: a TVM importer bug is
        no rewrite's fault, and sites validated on adversarial draws alone are no
        evidence for the model's own values), or its outputs are no evidence (all zero,
        constant or tiny) and not every rewrite site could be validated in their place.
        Anything that failed still makes it ``FAIL``.
        """
        if self.ok:
            return PASS_VERDICT
        failed_elsewhere = not (self.sites.ok and all(r.ok for r in self.roundtrip.values())
                                and self.training.get("ok", True))
        no_evidence = (self.numeric.not_built == "before"
                       or self.numeric.status == numeric.INCONCLUSIVE)
        if no_evidence and not failed_elsewhere:
            return NOT_RUN_VERDICT
        return FAIL_VERDICT

    @property
    def numeric_ok(self) -> bool:
        """The whole-model comparison passed, or it was no evidence (outputs all zero,
        constant or tiny) and every rewrite site was validated instead.
        """
        if self.numeric.ok:
            return True
        if self.numeric.status != numeric.INCONCLUSIVE:
            return False
        rows = self.sites.by_rule.values()
        return bool(rows) and all(r["not_run"] == 0 and r["failed"] == 0 for r in rows)

    @property
    def evidence(self) -> str:
        """What the verdict rests on, in one line."""
        rows = list(self.sites.by_rule.values())
        total = sum(r["sites"] for r in rows)
        validated = sum(r["validated"] for r in rows)
        failed = sum(r["failed"] for r in rows)
        sites = (f"{validated} of {total} rewrite site(s) validated"
                 + (f", {failed} FAILED" if failed else "") if total else
                 "no rewrite site to validate")
        if self.sites.not_run:
            sites = f"rewrite sites NOT RUN ({self.sites.not_run})"
        n = self.numeric
        if n.not_built == "before":
            whole = "whole-model comparison NOT RUN (the imported model does not build)"
        elif n.verdict == numeric.INCONCLUSIVE:
            whole = ("whole-model comparison INCONCLUSIVE (no evidence: the verdict rests on "
                     "the sites)")
        elif n.float64:
            whole = f"whole-model comparison against float64 ({n.verdict})"
        else:
            whole = f"whole-model comparison ({n.verdict})"
        return f"{whole}; {sites}"

    # the offload section under the names JobReport had before it was a section
    @property
    def composites(self) -> dict[str, int]:
        """Composites formed, per pattern table entry (``offload.composites``)."""
        return self.offload.composites

    @property
    def offloaded_ops(self) -> int:
        """Op calls the external compiler got (``offload.offloaded_ops``)."""
        return self.offload.offloaded_ops

    @property
    def host_ops(self) -> list[str]:
        """Op calls left on the host, with the reason (``offload.host_ops``)."""
        return self.offload.host_ops

    def to_dict(self) -> dict[str, Any]:
        """``report.json``: the sections flattened as the report has always written them."""
        return {"model": self.model, "compiler": self.compiler, "func": self.func,
                "import_fixups": list(self.import_fixups), "patterns": list(self.patterns),
                "rewrites": dict(self.rewrites),
                "composites": dict(self.offload.composites),
                "offloaded_ops": self.offload.offloaded_ops,
                "host_ops": list(self.offload.host_ops),
                "ops": [asdict(row) for row in self.ops],
                "numeric": self.numeric.to_dict(), "sites": self.sites.to_dict(),
                "roundtrip": {name: r.to_dict() for name, r in self.roundtrip.items()},
                "training": self.training, "drawings": dict(self.drawings),
                "seconds": dict(self.seconds), "outputs": list(self.outputs),
                # after the keys report.json has always written, in their order
                **({"near_misses": self.near_misses.to_dict()}
                   if self.near_misses is not None else {}),
                "ok": self.ok, "verdict": self.verdict}


# -- report.md -----------------------------------------------------------------------------------
def _figure(value: float | None) -> float:
    return _NAN if value is None else value


def _dimension_label(var: str, roles: Mapping[str, str]) -> str:
    """``batch``, or ``batch (`s43`)`` where torch named the variable for it."""
    role = roles.get(var)
    return f"`{var}`" if role in (None, var) else f"{role} (`{var}`)"


#: Sites listed one by one in report.md beyond the failures (report.json has them all).
_LISTED_SITES = 12


def _sites_markdown(sites: SiteValidation) -> list[str]:
    """The report's per-site section: a line per rule, then every failure (rule,
    function, binding, error) and the sites that could not run, with the reason.
    """
    if not sites:
        return []
    lines = ["", "## Rewrite sites (each rewrite run on its own: the model's values and "
                 "adversarial draws)", ""]
    if sites.not_run:
        return lines + [f"NOT RUN: {sites.not_run}"]
    assert sites.report is not None
    for rule, row in sites.by_rule.items():
        lines.append(f"* `{rule}`: {row['sites']} site(s), {row['validated']} validated, "
                     f"{row['failed']} failed"
                     + (f", {row['not_run']} not run" if row["not_run"] else ""))
    failed = [s for s in sites.report.sites if s.status == "fail"]
    if failed:
        lines += ["", "Failed:", ""]
        lines += [f"* FAIL `{s.rule}` in `{s.function}` at `{s.binding}`: "
                  f"{s.reason} (tolerance {s.tolerance})" for s in failed]
    skipped = [s for s in sites.report.sites if s.status == "not_run"]
    if skipped:
        lines += ["", "Not run:", ""]
        lines += [f"* `{s.rule}` in `{s.function}` at `{s.binding}`: {s.reason}"
                  for s in skipped[:_LISTED_SITES]]
        if len(skipped) > _LISTED_SITES:
            lines.append(f"* ... and {len(skipped) - _LISTED_SITES} more (report.json)")
    lines += ["", f"({sites.report.builds} build(s); identical sites are validated "
                  f"once, on every duplicate's values)"]
    return lines


#: Near misses listed in report.md (report.json has them all).
_LISTED_NEAR_MISSES = 40


def _cell(text: str) -> str:
    """``text`` inside a Markdown table cell: pipes escaped, one line."""
    return " ".join(text.split()).replace("|", "\\|")


#: How many op calls of one group of host ops ``report.md`` names before "and N more".
HOST_CALLS_NAMED = 3


def _host_markdown(host_ops: list[str]) -> list[str]:
    """One line per operator and reason left on the host, its calls counted, the most
    frequent first: a model's 200 reshapes left for one reason are one line, not 200
    (``report.json`` and ``report.html`` keep every call).  Each text is
    ``function:var = op: kind [entry]: reason``.
    """
    groups: dict[str, list[str]] = {}
    for text in host_ops:
        where, _, rest = text.partition(" = ")
        groups.setdefault(rest, []).append(where)
    lines = []
    for rest, calls in sorted(groups.items(), key=lambda item: -len(item[1])):
        op, _, why = rest.partition(": ")
        named = ", ".join(f"`{c}`" for c in calls[:HOST_CALLS_NAMED])
        more = f" and {len(calls) - HOST_CALLS_NAMED} more" if len(calls) > HOST_CALLS_NAMED else ""
        count = f" x{len(calls)}" if len(calls) > 1 else ""
        lines.append(f"* `{op}`{count} ({named}{more}): {why}")
    return lines


def _near_misses_markdown(section: NearMissSection | None) -> list[str]:
    """The families' skeletons left in the rewritten model: family, function, binding,
    the rule that looked at it and why it declined; or that there were none.
    """
    if section is None:
        return []
    lines = ["", "## Near misses (a family's shape left in the rewritten model, and why)", ""]
    if section.not_run is not None:
        return lines + [f"NOT RUN: {section.not_run}"]
    if not section.misses:
        return lines + [f"none: no skeleton of {', '.join(section.families)} is left"]
    lines += ["| family | function | binding | rule | reason |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {m.family} (`{_cell(m.shape)}`) | `{m.function}` | `{m.binding}` | "
              f"`{m.rule or '-'}` | {_cell(m.reason)} |"
              for m in section.misses[:_LISTED_NEAR_MISSES]]
    if len(section.misses) > _LISTED_NEAR_MISSES:
        lines += ["", f"... and {len(section.misses) - _LISTED_NEAR_MISSES} more (report.json)"]
    return lines


def _numeric_markdown(n: NumericResult) -> list[str]:
    """The numeric check: NOT RUN, FAILED TO BUILD, REFUSED, INCONCLUSIVE or the
    figures, then how the dimensions, the float64 arbitration and the inputs were set.
    """
    lines = ["", "## Numeric check (llvm VM, seeded random inputs)", ""]
    if n.not_built == "before":
        lines += ["NOT RUN: the model as imported does not build for llvm, so nothing could "
                  "be compared (no rewrite is involved; docs/tvm-bugs.md lists importer bugs "
                  "that do this):", "", f"* {n.build_error}"]
    elif n.not_built:
        lines += ["FAILED TO BUILD: the imported model builds, the rewritten one does not "
                  "(a bug in a rewrite or in a TVM pass; `patternkit bisect` finds the "
                  "rewrite):", "", f"* {n.build_error}"]
    elif n.refused:
        lines += ["REFUSED: the inputs would read outside a table, so nothing was compared:", ""]
        lines += [f"* {reason}" for reason in n.refused]
    elif n.status == numeric.INCONCLUSIVE:
        lines += [f"INCONCLUSIVE: {n.reason or ''}: the outputs cannot tell a right "
                  f"rewrite from a wrong one, so the verdict rests on the rewrite sites "
                  f"(below) (max abs error {_figure(n.max_abs_error):.3g}, rtol "
                  f"{n.rtol}, atol {n.atol}, seed {n.seed})"]
    else:
        lines.append(f"{'match' if n.ok else 'MISMATCH'}: max abs error "
                     f"{_figure(n.max_abs_error):.3g}, max rel error "
                     f"{_figure(n.max_rel_error):.3g}, relative error as a whole "
                     f"{_figure(n.norm_error):.3g} (bound "
                     f"{_figure(n.norm_bound):.3g}; rtol {n.rtol}, "
                     f"atol {n.atol}, seed {n.seed})"
                     + (f": {n.reason}" if n.reason and not n.ok else ""))
        if n.sizes:
            roles = n.roles or {}
            lines += ["", "Symbolic dimensions checked at " + " and at ".join(
                ", ".join(f"{_dimension_label(k, roles)} = {v}" for k, v in sizes.items())
                for sizes in n.sizes)
                + " (the errors above are the larger of the two)."]
        wide = n.float64
        if wide and wide.get("status") == "not_run":
            lines += ["", f"Float64 arbitration NOT RUN: {wide.get('reason', '')} "
                          f"(the verdict is the {n.dtype or 'float32'} comparison's)."]
        elif wide:
            why = (f"The {n.dtype} comparison missed its tolerance, which rounding at other "
                   f"points can do on a deep model (a batch norm folded into a conv), so the "
                   f"verdict compares both"
                   if n.float64_after_miss else
                   f"A {n.dtype} model rounds differently after any rewrite, so the "
                   f"verdict compares both")
            lines += ["", f"{why} with the imported model recomputed in "
                          f"float64: the imported model is {wide['imported']:.3g} from it "
                          f"({wide.get('imported_rel', _NAN):.3g} as a whole), the "
                          f"rewritten one {wide['rewritten']:.3g} "
                          f"({wide.get('rewritten_rel', _NAN):.3g}): "
                          f"{str(wide.get('status', 'pass')).upper()}"
                          + (f" ({wide['reason']})" if wide.get("reason") else
                             f" (within {wide['slack']:g}x + atol)") + "."]
    if n.identical:
        lines += ["", "(after is structurally identical to before: built and run once)"]
    if n.int_ranges:
        lines += ["", "Integer inputs drawn in: " + ", ".join(
            f"`{k}` [{lo}, {hi})" for k, (lo, hi) in sorted(n.int_ranges.items()))]
    return lines


def report_markdown(report: JobReport) -> str:
    """``report.md``: the verdict and what it rests on, the per-op table, then each
    section.
    """
    lines = [f"# patternkit run: {report.verdict}", "",
             f"* evidence: {report.evidence}",
             f"* model: `{report.model}` (entry function `{report.func}`)",
             *([f"* rewritten before TVM imported it (TVM importer bugs, docs/tvm-bugs.md): "
                f"{'; '.join(report.import_fixups)}"] if report.import_fixups else []),
             f"* compiler: `{report.compiler}`",
             f"* patterns: {', '.join(f'`{p}`' for p in report.patterns) or 'none'}", "",
             "## Ops", ""]
    lines += markdown_table(report.ops)
    lines += ["", "## Rewrites", ""]
    lines += [f"* `{k}`: {v}" for k, v in report.rewrites.items()] or ["* none"]
    lines += _near_misses_markdown(report.near_misses)
    offload = report.offload
    lines += ["", "## Offload", "",
              f"{offload.offloaded_ops} op call(s) in {sum(offload.composites.values())} "
              f"composite(s); {len(offload.host_ops)} left on the host.", ""]
    lines += [f"* `{k}`: {v}" for k, v in sorted(offload.composites.items())]
    if offload.host_ops:
        lines += ["", "Left on the host, and why:", ""]
        lines += _host_markdown(offload.host_ops)
    lines += _numeric_markdown(report.numeric)
    lines += _sites_markdown(report.sites)
    lines += ["", "## Round trips", ""]
    for name, r in report.roundtrip.items():
        if r.not_run is not None:
            lines.append(f"* {name}: NOT RUN: {r.not_run}")
            continue
        lines.append(f"* {name}: {'ok' if r.ok else 'FAILED: ' + str(r.difference)}")
        if r.dropped_dead:
            lines.append(f"  (not compared: {len(r.dropped_dead)} dead binding(s) the "
                         f"fusion dropped: {', '.join(r.dropped_dead[:5])}"
                         f"{', ...' if len(r.dropped_dead) > 5 else ''})")
    if report.training:
        from .training import training_markdown

        lines += [""] + training_markdown(report.training)
    if report.drawings:
        lines += ["", "## Drawings", ""]
        lines += [f"* `{name}.svg`: {how}" for name, how in report.drawings.items()]
    lines += ["", "## Time per step (s)", ""]
    lines += [f"* {k}: {v:.2f}" for k, v in report.seconds.items()]
    return "\n".join(lines) + "\n"
