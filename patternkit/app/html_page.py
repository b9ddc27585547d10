"""The pieces of a self-contained HTML page: escaping, tables, sections, the page itself.

``report.html`` is read offline, often from an archive of CI artefacts, so the page
fetches nothing: its style and its one small script are inline, and it shows everything
without the script (the script only filters long tables and opens or folds every
drawing at once).  Text from the model (binding names, reasons, a model file's name) goes
into the page as text: every value is escaped unless it is an :class:`Html` fragment
built here, so a name like ``<script>`` shows as written.
"""

from __future__ import annotations

import html
from typing import Iterable, Sequence

__all__ = ["Html", "escape", "facts", "page", "section", "table", "tag"]


class Html(str):
    """A fragment of HTML made by this module's builders: written into the page as is."""


def escape(value: object) -> Html:
    """``value`` as text in the page: ``Html`` fragments as they are, anything else escaped."""
    if isinstance(value, Html):
        return value
    return Html(html.escape(str(value), quote=True))


def tag(name: str, *content: object, **attributes: object) -> Html:
    """``<name attributes>content</name>``; ``class_`` stands for ``class``."""
    attrs = "".join(f' {key.rstrip("_").replace("_", "-")}="{escape(value)}"'
                    for key, value in attributes.items() if value is not None)
    return Html(f"<{name}{attrs}>{''.join(escape(c) for c in content)}</{name}>")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *,
          filter_label: str | None = None, id: str | None = None) -> Html:
    """A table; with ``filter_label``, a box above it that keeps the rows holding its text."""
    head = tag("tr", *(tag("th", h) for h in headers))
    body = "".join(tag("tr", *(tag("td", cell) for cell in row)) for row in rows)
    anchor = f' id="{escape(id)}"' if id else ""
    grid = Html(f"<table{anchor}><thead>{head}</thead><tbody>{body}</tbody></table>")
    if filter_label is None:
        return grid
    box = Html(f'<input type="search" class="filter" placeholder="{escape(filter_label)}" '
               f'aria-label="{escape(filter_label)}">')
    return Html(f'<div class="filtered">{box}{grid}</div>')


def facts(rows: Iterable[tuple[str, object]]) -> Html:
    """A two-column table of named values, the names as row headings."""
    body = "".join(tag("tr", tag("th", name, scope="row"), tag("td", value))
                   for name, value in rows)
    return Html(f'<table class="facts"><tbody>{body}</tbody></table>')


def section(id: str, title: str, *content: object) -> Html:
    """A ``<section>`` with its heading; ``id`` is the section's anchor."""
    return Html(f'<section id="{escape(id)}"><h2>{escape(title)}</h2>'
                + "".join(escape(c) for c in content) + "</section>")


def page(title: str, *content: object) -> str:
    """The whole page: ``content`` inside ``<main>``, with the inline style and script."""
    body = "".join(escape(c) for c in content)
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            # nothing is fetched: no default-src, and only this page's own script and style
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body><main>{body}</main><script>{_SCRIPT}</script></body></html>\n")


_STYLE = """
:root { color-scheme: light; --pass: #1a7f37; --fail: #c62828; --muted: #57606a; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1f2328; background: #fff; }
main { max-width: 1200px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px;
  border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
code, td, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace;
  font-size: 12.5px; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left;
  vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 12px; color: #fff;
  font-weight: 700; }
.pass { color: var(--pass); } .fail { color: var(--fail); } .muted { color: var(--muted); }
.badge.pass { background: var(--pass); color: #fff; }
.badge.fail { background: var(--fail); color: #fff; }
.badge.muted { background: #888; color: #fff; }
.bar { display: inline-block; height: 10px; background: #4e79a7; vertical-align: middle; }
details { margin: 6px 0; border: 1px solid #d0d7de; border-radius: 6px; padding: 4px 10px; }
summary { cursor: pointer; font-weight: 600; }
.drawing { overflow: auto; max-height: 80vh; }
.drawing svg { max-width: none; height: auto; }
input.filter { margin: 4px 0; padding: 3px 6px; width: 320px; }
nav a { margin-right: 12px; }
"""

# filters the rows of a table below a search box; opens or folds every drawing
_SCRIPT = """
(function () {
  document.querySelectorAll("div.filtered").forEach(function (box) {
    var input = box.querySelector("input.filter");
    var rows = box.querySelectorAll("tbody tr");
    input.addEventListener("input", function () {
      var wanted = input.value.toLowerCase();
      rows.forEach(function (row) {
        row.hidden = wanted !== "" && row.textContent.toLowerCase().indexOf(wanted) < 0;
      });
    });
  });
  document.querySelectorAll("button[data-drawings]").forEach(function (button) {
    button.addEventListener("click", function () {
      var open = button.getAttribute("data-drawings") === "open";
      document.querySelectorAll("details.drawing-box").forEach(function (d) {
        d.open = open;
      });
    });
  });
})();
"""
