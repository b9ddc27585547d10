"""Run Graphviz ``dot`` with a timeout, and build the notebook representations.

The ``dot`` binary is optional: without it (or when layout times out, or the graph is
past the hard size limit) notebooks get a text summary plus the DOT source and a hint.
Display hooks never raise; :func:`run_dot` does, for ``render()``.
"""

from __future__ import annotations

import html
import logging
import shutil
import subprocess

from ..errors import PatternkitError
from .options import VizError

__all__ = ["DotUnavailable", "dot_binary", "fallback_html", "run_dot", "run_layout",
           "svg_for_html"]

logger = logging.getLogger(__name__)

FORMATS = ("svg", "png", "pdf", "dot", "json", "plain")

HINT = (
    "Install Graphviz to see the drawing (Debian/Ubuntu: apt-get install graphviz; "
    "conda: conda install graphviz; macOS: brew install graphviz), or paste the DOT "
    "source below into any Graphviz viewer."
)


class DotUnavailable(PatternkitError, RuntimeError):
    """``dot`` is not installed, failed, or did not finish within the timeout."""


def dot_binary() -> str | None:
    """Path of the Graphviz ``dot`` executable, or None."""
    return shutil.which("dot")


def run_dot(source: str, fmt: str, timeout: float) -> bytes:
    """Lay out ``source`` with ``dot -T<fmt>`` and return the output bytes.

    Raises
    ------
    DotUnavailable
        When ``dot`` is missing, exits with an error, or exceeds ``timeout`` seconds.
    """
    if fmt not in FORMATS:
        raise VizError(f"format={fmt!r} is not supported; expected one of {list(FORMATS)}")
    return run_layout([f"-T{fmt}"], source.encode("utf-8"), timeout)


def run_layout(flags: list[str], data: bytes, timeout: float, cwd: str | None = None) -> bytes:
    """Run ``dot <flags>`` on the DOT bytes ``data`` within ``timeout`` s; its output.

    Raises
    ------
    DotUnavailable
        When ``dot`` is missing, exits with an error, or exceeds ``timeout`` seconds.
    """
    exe = dot_binary()
    if exe is None:
        raise DotUnavailable("the Graphviz 'dot' executable was not found on PATH. " + HINT)
    try:
        proc = subprocess.run(
            [exe, *flags], input=data, capture_output=True, timeout=timeout, check=False,
            cwd=cwd
        )
    except subprocess.TimeoutExpired as e:
        raise DotUnavailable(
            f"Graphviz layout did not finish within {timeout:g} s; collapse clusters "
            "(collapse='all'), focus= on a node, or raise timeout="
        ) from e
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise DotUnavailable(f"dot exited with status {proc.returncode}: {err}")
    return proc.stdout


def svg_for_html(svg: str) -> str:
    """Inline SVG without the XML prologue/doctype (so it embeds in HTML)."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def fallback_html(summary: str, reason: str, source: str) -> str:
    """The text-only notebook view: summary, why there is no drawing, the DOT source."""
    return (
        '<div class="patternkit-viz">'
        f"<pre>{html.escape(summary)}</pre>"
        f"<p><b>No drawing:</b> {html.escape(reason)}</p>"
        f"<details><summary>DOT source ({len(source.splitlines())} lines)</summary>"
        f"<pre>{html.escape(source)}</pre></details></div>"
    )
