"""``report.html``: the job's results in one page that opens offline.

``report.md`` is the job's results for a terminal or a code review; ``report.html`` is
the same :class:`~patternkit.app.report.JobReport` for a browser, with what Markdown
cannot hold: the drawings inline (folded until asked for), the ops left on the host in a
table that filters, and the rewrite sites of each rule.  It is built from the report's
fields, as ``report.md`` is (never from the Markdown), and it is one file: the style,
the drawings and the small script are in it, and it fetches nothing.

Sections, each an anchor (``report.html#offload``): ``verdict`` (the verdict and what it
rests on), ``ops``, ``rewrites`` (per rule, with the sites validated), ``near-misses``
(a family's shape left in the rewritten model, and the reason its rule gave), ``offload``
(the composites, and every op call left on the host with the reason), ``numeric``,
``roundtrips``, ``training`` (when the job differentiated the model), ``drawings`` and
``timings``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from .html_page import Html, facts, page, section, table, tag
from .near_misses import NearMissSection
from .report import NOT_RUN_VERDICT, JobReport, NumericResult, SiteValidation
from .svg_inline import SvgError, inline_svg

__all__ = ["SECTIONS", "report_html", "write_report_html"]

#: The sections' anchors, in page order (``training`` only when the job ran it).
SECTIONS = ("verdict", "ops", "rewrites", "near-misses", "offload", "numeric", "roundtrips",
            "training", "drawings", "timings")

#: Drawings larger than this are linked, not inlined: the page must stay quick to open.
MAX_INLINE_SVG = 8 * 2**20


def write_report_html(folder: Path, report: JobReport) -> Path:
    """Write ``folder/report.html`` (the drawings read from ``folder``); its path."""
    path = folder / "report.html"
    path.write_text(report_html(report, folder), encoding="utf-8")
    return path


def report_html(report: JobReport, folder: Path | None = None) -> str:
    """The page for ``report``; the drawings come from ``folder`` (``None``: none inlined)."""
    verdict = report.verdict
    shown = [s for s in SECTIONS if (s != "training" or report.training)
             and (s != "near-misses" or report.near_misses is not None)]
    nav = Html("<nav>" + "".join(tag("a", name, href=f"#{name}") for name in shown)
               + "</nav>")
    parts = [tag("h1", "patternkit run: ", _badge(_verdict_ok(report), verdict), " ",
                 report.model),
             nav, _verdict(report), _ops(report), _rewrites(report)]
    if report.near_misses is not None:
        parts.append(_near_misses(report.near_misses))
    parts += [_offload(report), _numeric(report.numeric), _roundtrips(report)]
    if report.training:
        parts.append(_training(report.training))
    parts += [_drawings(report, folder), _timings(report.seconds)]
    return page(f"patternkit run: {verdict}: {report.model}", *parts)


# -- sections ------------------------------------------------------------------------------------
def _badge(ok: bool | None, text: str) -> Html:
    kind = "muted" if ok is None else "pass" if ok else "fail"
    return tag("span", text, class_="badge " + kind)


def _verdict_ok(report: JobReport) -> bool | None:
    """The verdict as a badge reads it: passed, failed, or ``None`` for NOT RUN."""
    return None if report.verdict == NOT_RUN_VERDICT else report.ok


def _mark(ok: bool | None, text: str | None = None) -> Html:
    if ok is None:
        return tag("span", text or "NOT RUN", class_="muted")
    return tag("span", text or ("ok" if ok else "FAILED"), class_="pass" if ok else "fail")


def _verdict(report: JobReport) -> Html:
    training = report.training
    checks: list[tuple[str, Html]] = [
        ("whole-model comparison", _mark(report.numeric_ok, report.numeric.verdict)),
        ("rewrite sites", _sites_mark(report.sites)),
        ("round trips", _mark(all(r.ok for r in report.roundtrip.values())
                              if report.roundtrip and not any(
                                  r.not_run for r in report.roundtrip.values()) else None)),
    ]
    if training:
        checks.append(("gradients", _mark(training.get("ok") if "reason" not in training
                                          else None)))
    about = [("evidence", report.evidence), ("model", report.model),
             ("entry function", report.func), ("compiler", report.compiler)]
    if report.import_fixups:
        about.append(("rewritten before TVM imported it (docs/tvm-bugs.md)",
                      "; ".join(report.import_fixups)))
    patterns = tag("details", tag("summary", f"{len(report.patterns)} pattern(s)"),
                   tag("p", ", ".join(report.patterns) or "none", class_="mono"))
    return section("verdict", "Verdict", tag("p", _badge(_verdict_ok(report), report.verdict),
                                             " ", report.evidence),
                   table(["check", "result"], checks), facts(about), patterns)


def _sites_mark(sites: SiteValidation) -> Html:
    if sites.not_run:
        return _mark(None, f"NOT RUN: {sites.not_run}")
    if sites.report is None:
        return _mark(None, "no rewrite site")
    rows = sites.by_rule.values()
    total, failed = sum(r["sites"] for r in rows), sum(r["failed"] for r in rows)
    validated = sum(r["validated"] for r in rows)
    return _mark(sites.ok, f"{validated} of {total} validated"
                 + (f", {failed} FAILED" if failed else ""))


def _ops(report: JobReport) -> Html:
    rows = [(row.op, row.count, row.where()) for row in report.ops]
    return section("ops", "Ops", table(["op", "calls", "where they went"], rows)
                   if rows else tag("p", "no op calls"))


def _rewrites(report: JobReport) -> Html:
    if not report.rewrites:
        return section("rewrites", "Rewrites", tag("p", "none"))
    by_rule = report.sites.by_rule
    sites = report.sites.report.sites if report.sites.report is not None else []
    summary = []
    for rule, count in report.rewrites.items():
        row = by_rule.get(rule)
        summary.append((rule, count, "" if row is None else row["validated"],
                        "" if row is None else _mark(row["failed"] == 0, str(row["failed"])),
                        "" if row is None else row["not_run"]))
    parts: list[object] = [table(["rule", "rewrites", "sites validated", "failed", "not run"],
                                 summary)]
    if report.sites.not_run:
        parts.append(tag("p", f"Sites NOT RUN: {report.sites.not_run}", class_="muted"))
    for rule in report.rewrites:
        mine = [s for s in sites if s.rule == rule]
        if not mine:
            continue
        rows = [(f"{s.function}:{s.binding}", _mark(None if s.status == "not_run"
                                                     else s.status == "pass", s.status),
                 _error(s.max_abs_error), s.tolerance, s.reason,
                 ", ".join(s.duplicates)) for s in mine]
        identical = sum(len(s.duplicates) for s in mine)
        parts.append(tag("details", tag("summary", f"{rule}: {len(mine)} site(s)"
                                        + (f" and {identical} identical to one of them"
                                           if identical else "")),
                         table(["site", "verdict", "max abs error", "tolerance", "reason",
                                "identical sites"], rows, filter_label="filter the sites")))
    if report.sites.report is not None:
        parts.append(tag("p", f"{report.sites.report.builds} build(s); identical sites are "
                              f"validated once, on every duplicate's values.", class_="muted"))
    return section("rewrites", "Rewrites, and their sites validated one by one", *parts)


def _near_misses(misses: NearMissSection) -> Html:
    if misses.not_run is not None:
        shown = tag("p", f"NOT RUN: {misses.not_run}", class_="muted")
    elif not misses.misses:
        shown = tag("p", f"none: no skeleton of {', '.join(misses.families)} is left")
    else:
        shown = table(["family", "shape", "site", "rule", "kind", "reason"],
                      [(m.family, m.shape, f"{m.function}:{m.binding}", m.rule or "-", m.kind,
                        m.reason) for m in misses.misses],
                      filter_label="filter the near misses")
    return section("near-misses", "Near misses (a family's shape left in the rewritten "
                                  "model, and why)", shown)


def _error(value: float) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.3g}"


def _host_row(text: str) -> tuple[str, str, str]:
    """``(where, why, reason)`` of a host op as the report holds it
    (``function:var = op: kind [entry]: reason``).
    """
    where, _, rest = text.partition(": ")
    kind, _, reason = rest.partition(": ")
    return where, kind, reason


def _offload(report: JobReport) -> Html:
    offload = report.offload
    parts: list[object] = [tag("p", f"{offload.offloaded_ops} op call(s) in "
                                    f"{sum(offload.composites.values())} composite(s); "
                                    f"{len(offload.host_ops)} left on the host.")]
    if offload.composites:
        parts.append(table(["composite", "count"], sorted(offload.composites.items())))
    if offload.host_ops:
        parts += [tag("h3", "Left on the host, and why"),
                  table(["op call", "why", "reason"],
                        (_host_row(h) for h in offload.host_ops),
                        filter_label="filter the ops left on the host", id="host-ops")]
    return section("offload", f"Offload to {report.compiler}", *parts)


def _numeric(n: NumericResult) -> Html:
    if n.not_built == "before":
        headline = "NOT RUN: the model as imported does not build for llvm"
    elif n.not_built:
        headline = "FAILED TO BUILD: the imported model builds, the rewritten one does not"
    elif n.refused:
        headline = "REFUSED: the inputs would read outside a table"
    else:
        headline = n.verdict.upper() + (f": {n.reason}" if n.reason else "")
    ok = None if n.not_built == "before" else n.ok or n.verdict == "inconclusive"
    rows: list[tuple[str, object]] = [
        (name, _figure_text(value)) for name, value in (
            ("build error", n.build_error), ("max abs error", n.max_abs_error),
            ("max rel error", n.max_rel_error), ("relative error as a whole", n.norm_error),
            ("its bound", n.norm_bound), ("output magnitude", n.magnitude),
            ("rtol", n.rtol), ("atol", n.atol), ("seed", n.seed), ("dtype", n.dtype))
        if value is not None]
    rows += [(f"refused: {i + 1}", reason) for i, reason in enumerate(n.refused or [])]
    if n.sizes:
        roles = n.roles or {}
        rows.append(("symbolic dimensions checked at", " and at ".join(
            ", ".join(f"{roles.get(k, k)} = {v}" for k, v in sizes.items())
            for sizes in n.sizes)))
    if n.float64:
        rows += [(f"float64 arbitration: {key}", _figure_text(value))
                 for key, value in n.float64.items()]
    if n.identical:
        rows.append(("after", "structurally identical to before: built and run once"))
    if n.int_ranges:
        rows.append(("integer inputs drawn in", ", ".join(
            f"{k} [{lo}, {hi})" for k, (lo, hi) in sorted(n.int_ranges.items()))))
    return section("numeric", "Numeric check (llvm VM, seeded random inputs)",
                   tag("p", _mark(ok, headline)), facts(rows))


def _figure_text(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _roundtrips(report: JobReport) -> Html:
    rows = [(name, _mark(None if r.not_run else r.ok), r.not_run or r.difference or "",
             r.fusion_ill_formed or "",
             f"{len(r.dropped_dead)}: {', '.join(r.dropped_dead)}" if r.dropped_dead else "")
            for name, r in report.roundtrip.items()]
    return section("roundtrips", "Round trips", table(
        ["round trip", "result", "difference", "fusion's own output ill formed",
         "dead bindings dropped (not compared)"], rows) if rows else tag("p", "none run"))


def _training(training: Mapping[str, Any]) -> Html:
    return section("training", "Gradient check", facts(_flatten(training)))


def _flatten(values: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, str]]:
    for key, value in values.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}: ")
        else:
            yield f"{prefix}{key}", _figure_text(value)


def _drawings(report: JobReport, folder: Path | None) -> Html:
    if not report.drawings:
        return section("drawings", "Drawings", tag("p", "not drawn (--no-draw)"))
    parts: list[object] = [Html('<p><button type="button" data-drawings="open">open every '
                                'drawing</button> <button type="button" '
                                'data-drawings="close">fold every drawing</button></p>')]
    for name, how in report.drawings.items():
        parts.append(tag("details", tag("summary", f"{name}.svg: {how}"),
                         _drawing(folder, name, how), class_="drawing-box"))
    return section("drawings", "Drawings", *parts)


def _drawing(folder: Path | None, name: str, how: str) -> Html:
    path = folder / f"{name}.svg" if folder is not None else None
    if how.startswith("not drawn") or path is None or not path.is_file():
        return tag("p", "no drawing", class_="muted")
    if path.stat().st_size > MAX_INLINE_SVG:
        return tag("p", f"{path.name} is {path.stat().st_size / 2**20:.0f} MB: open it "
                        f"beside this page", class_="muted")
    try:
        svg = inline_svg(path.read_text(encoding="utf-8"), prefix=f"{name}-")
    except (SvgError, UnicodeDecodeError) as err:
        return tag("p", f"{path.name} cannot be shown: {err}", class_="muted")
    return Html(f'<div class="drawing">{svg}</div>')


def _timings(seconds: Mapping[str, float]) -> Html:
    longest = max(seconds.values(), default=0.0) or 1.0
    rows: list[tuple[str, str, object]] = [
        (step, f"{value:.2f}",
         Html(f'<span class="bar" style="width:{200 * value / longest:.0f}px"></span>'))
        for step, value in seconds.items()]
    rows.append(("total", f"{sum(seconds.values()):.2f}", ""))
    return section("timings", "Time per step (s)", table(["step", "seconds", ""], rows))
