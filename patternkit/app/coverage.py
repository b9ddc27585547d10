"""``patternkit coverage``: how much of each model each of TVM's pattern tables offloads.

For every model and table, :func:`patternkit.coverage` on the model as loaded and after
the library's rewrite rules, written as ``coverage.json``, a Markdown table and one bar
chart per model (an SVG written by hand: no plotting library for five bars).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from ..byoc.reports.table_coverage import coverage
from ..byoc.tables.table import PatternTable
from ..engine.driver import rewrite
from .loading import load_model

__all__ = ["table_coverage", "model_rows", "write_coverage"]


def table_coverage(models: Sequence[str], tables: Sequence[str],
                   out_dir: str | Path | None = None,
                   progress: Callable[[str], None] | None = None,
                   tick: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """How much of each model each of TVM's tables offloads, before and after the rewrites.

    For every model (as :func:`~patternkit.app.loading.load_model` takes it) and table prefix
    (:meth:`patternkit.PatternTable.from_tvm`), :func:`patternkit.coverage` on the model
    as loaded and after the library's rewrite rules (which collapse decomposed ops into
    the fused ops the tables expect).  Writes ``coverage.json`` (every op record) and
    ``coverage.md`` (one row per model and table) and one bar chart per model
    (``coverage_<i>.svg``: a pair of bars per table, as loaded and after the rewrites) to
    ``out_dir`` when given.  ``progress`` is called with a line per step, ``tick`` with
    ``(done, total, model)`` as each model is done (:class:`patternkit.app.progress.Progress`).
    """
    from patternkit.patterns import LIBRARY

    say = progress or (lambda message: None)
    tables_ = {prefix: PatternTable.from_tvm(prefix) for prefix in tables}
    rules = LIBRARY.rewrite_rules()
    rows: list[dict] = []
    for done, spec in enumerate(models, 1):
        description, found = model_rows(spec, tables_, rules, say)
        rows += found
        if tick is not None:
            tick(done, len(models), description)
    if out_dir is not None:
        write_coverage(rows, out_dir)
    return rows


def model_rows(spec: str, tables: dict[str, PatternTable], rules: Any,
               say: Callable[[str], None] = lambda message: None) -> tuple[str, list[dict]]:
    """One model's rows: each table's coverage as loaded and after ``rules``.

    Returns the model's description and its rows (see :func:`table_coverage`).
    """
    say(f"loading {spec} ...")
    mod, description = load_model(spec)
    rewritten = rewrite(rules, mod)
    rows = []
    for prefix, table in tables.items():
        say(f"{description}: {prefix} ...")
        for stage, module in (("as loaded", mod), ("after rewrites", rewritten)):
            report = coverage(module, table)
            rows.append({"model": description, "table": prefix, "stage": stage,
                         "share": report.share, "op_calls": len(report.ops),
                         "regions": report.regions, "largest_region": report.largest_region,
                         "host": report.host_reasons(), "split": report.split,
                         "report": json.loads(report.to_json())})
    return description, rows


def write_coverage(rows: list[dict], out_dir: str | Path) -> None:
    """``coverage.json``, ``coverage.md`` and a bar chart per model in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coverage.json").write_text(json.dumps(rows, indent=1))
    lines = ["# Coverage of TVM's pattern tables", "",
             "| model | table | stage | op calls | offloaded | regions | largest | "
             "left on the host | split off to avoid a cycle |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        host = ", ".join(f"{k} {n}" for k, n in sorted(r["host"].items())) or "none"
        lines.append(f"| {r['model']} | {r['table']} | {r['stage']} | {r['op_calls']} | "
                     f"{r['share']:.0%} | {r['regions']} | {r['largest_region']} | {host} | "
                     f"{r['split']} |")
    models_seen = list(dict.fromkeys(r["model"] for r in rows))
    lines.append("")
    for i, model in enumerate(models_seen):
        (out / f"coverage_{i}.svg").write_text(
            _coverage_chart(model, [r for r in rows if r["model"] == model]))
        lines.append(f"![{model}](coverage_{i}.svg)")
    (out / "coverage.md").write_text("\n".join(lines) + "\n")


def _coverage_chart(model: str, rows: list[dict]) -> str:
    """A horizontal bar per (table, stage): the share of op calls offloaded."""
    from html import escape

    bar, label, width = 18, 190, 300
    height = 40 + bar * len(rows) + 6 * len(rows)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label + width + 60}" '
             f'height="{height}" font-family="sans-serif" font-size="12">',
             f'<text x="4" y="18" font-weight="bold">{escape(model)}: share of op calls '
             f'offloaded</text>']
    for k, r in enumerate(rows):
        y = 32 + k * (bar + 6)
        colour = "#4e79a7" if r["stage"] == "as loaded" else "#f28e2b"
        parts.append(f'<text x="4" y="{y + 13}">{escape(r["table"])} ({escape(r["stage"])})'
                     f'</text>')
        parts.append(f'<rect x="{label}" y="{y}" width="{width * r["share"]:.1f}" '
                     f'height="{bar}" fill="{colour}"/>')
        parts.append(f'<text x="{label + width * r["share"] + 4:.1f}" y="{y + 13}">'
                     f'{r["share"]:.0%}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
