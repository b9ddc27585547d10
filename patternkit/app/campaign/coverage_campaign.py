"""``patternkit coverage`` as a recorded campaign: one unit per model.

Why: coverage over a zoo is dozens of models of minutes each; as a campaign
(:mod:`patternkit.testing.campaign`) its models shard over a CI matrix (``--shard``), a
killed run goes on where it stopped (``--resume``), and any executor runs them.  A
unit is ``(model, 0)`` (coverage draws nothing, so one instance per model); its record
holds the model's rows, and the folder's ``coverage.json``/``coverage.md``/charts are
written from the records, so a resumed run's report has every model.  A model that
does not load is a failed unit with its one-line error, not the end of the campaign.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...byoc.tables.table import PatternTable
from ...errors import PatternkitError, first_line
from ...testing.campaign import (
    HEADER,
    Campaign,
    Executor,
    Unit,
    local_executor,
    process_executor,
    read_header,
    read_records,
    run_campaign,
)
from ...testing.campaign_checks import kept_in_process, record_of
from ...verification.report import CampaignReport, Failure, TargetReport
from ..coverage import model_rows, write_coverage

__all__ = ["CoverageCheck", "coverage_recorded"]


@dataclass(frozen=True)
class CoverageCheck:
    """A ``coverage`` unit: one model's coverage by each table, before and after rewrites."""

    tables: tuple[str, ...]

    def __call__(self, unit: Unit) -> dict:
        """Measure ``unit``'s model; its record (its rows in ``rows``)."""
        from patternkit.patterns import LIBRARY

        start = time.perf_counter()
        tables = kept_in_process(("tables", self.tables), lambda: {
            prefix: PatternTable.from_tvm(prefix) for prefix in self.tables})
        rules = kept_in_process(("library rewrite rules",), LIBRARY.rewrite_rules)
        report = TargetReport(unit.subject, tried=1)
        rows: list[dict] = []
        try:
            _, rows = model_rows(unit.subject, tables, rules)
        except Exception as err:  # a model that does not load or convert: its record says
            report.failures.append(Failure(unit.subject, "raised",
                                           f"{type(err).__name__}: {first_line(err)}", None))
        return record_of(unit.subject, unit.instance, 0, report,
                         "failed" if report.failures else "measured", start, rows=rows)


def _start_over(folder: Path) -> None:
    """Drop a previous coverage run's records in ``folder`` (its report is rewritten too)."""
    header = read_header(folder)
    if header is None or header.get("what") != "coverage":
        return  # nothing of ours; another campaign's folder is refused by run_campaign
    (folder / HEADER).unlink()
    for path in folder.glob("records*.jsonl"):
        path.unlink()


def coverage_recorded(models: list[str], tables: list[str], out: str | Path, *,
                      resume: bool = False, shard: tuple[int, int] | None = None,
                      jobs: int = 1, executor: Executor | None = None,
                      tick: Callable[[int, int, str], None] | None = None
                      ) -> tuple[CampaignReport, list[dict]]:
    """Coverage of ``models`` by ``tables``, one recorded unit per model in ``out``.

    Without ``resume`` a previous coverage run's records in ``out`` are replaced (as its
    report files always were); with it, the models recorded there are skipped.
    ``coverage.json``, ``coverage.md`` and the charts are written from the records of
    this shard's models.

    Returns
    -------
    (CampaignReport, list of dict)
        One target per model (failed: it did not load), and the rows of every model.

    Raises
    ------
    PatternkitError
        An unknown table, or ``out`` holding another campaign; before any model loads.
    """
    for prefix in tables:
        try:
            PatternTable.from_tvm(prefix)
        except Exception as err:
            raise PatternkitError(f"--table {prefix}: {first_line(err)}") from None
    folder = Path(out)
    campaign = Campaign("coverage", tuple(models), 1, 0, (("tables", ",".join(tables)),))
    if not resume:
        _start_over(folder)
    if executor is None:
        executor = process_executor(jobs) if jobs > 1 else local_executor
    report = run_campaign(campaign, CoverageCheck(tuple(tables)), folder, shard=shard,
                          resume=resume, executor=executor, tick=tick)
    by_model = {r["subject"]: r for r in read_records(folder)}
    mine = [unit.subject for unit in campaign.units(shard)]
    rows: list[Any] = [row for model in mine for row in by_model.get(model, {}).get("rows", [])]
    write_coverage(rows, folder)
    return report, rows
