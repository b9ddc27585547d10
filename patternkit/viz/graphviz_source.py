"""A drawing as a ``graphviz.Source``, with ``dot`` run under the drawing's timeout.

Users of Python Graphviz tools expect a ``graphviz`` object: ``.source``, ``.pipe(...)``,
``.render(...)``, inline display in Jupyter.  The visualiser writes its DOT text itself
(quoting through ``graphviz.Digraph`` is several times slower on large graphs, and its
``node()``/``edge()`` have no clusters-of-clusters or legend of their own), so the text is
wrapped as a :class:`graphviz.Source`.  The package runs ``dot`` with no time limit,
though, and ``dot`` on a large graph can run for minutes; :class:`TimedSource` keeps all
of the package's arguments and checks and replaces only the step that runs the command,
through the hooks the package provides for it (``_pipe_lines``, ``_pipe_lines_string``,
``_render``), by one that stops after ``timeout`` seconds.  Its Jupyter display never
raises: without a layout it shows the summary and the DOT text, as :class:`VizGraph` does.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import graphviz  # type: ignore[import-untyped]
from graphviz.backend import dot_command, rendering  # type: ignore[import-untyped]

from .display import fallback_html, run_layout, svg_for_html

__all__ = ["TimedSource"]

logger = logging.getLogger(__name__)


def _flags(engine: str, format: str, renderer: str | None, formatter: str | None,
           neato_no_op: bool | int | None) -> list[str]:
    """The ``dot`` arguments graphviz would pass (it checks engine and formats)."""
    cmd = dot_command.command(engine, format, renderer=renderer, formatter=formatter,
                              neato_no_op=neato_no_op)
    return [os.fspath(part) for part in cmd[1:]]


class TimedSource(graphviz.Source):
    """``graphviz.Source`` whose layouts stop after ``timeout`` seconds.

    Parameters
    ----------
    source : str
        The DOT text.
    timeout : float
        Seconds ``dot`` may run per ``pipe``, ``render`` or display.
    summary : str
        What the notebook shows beside the DOT text when there is no layout.
    **kwargs
        ``graphviz.Source``'s own (``filename``, ``directory``, ``format``, ``engine``...).

    Notes
    -----
    ``pipe`` and ``render`` raise :class:`patternkit.viz.DotUnavailable` when ``dot`` is
    missing, fails or times out; the Jupyter display falls back to text instead.
    """

    def __init__(self, source: str, *, timeout: float = 20.0, summary: str = "",
                 **kwargs: Any):
        super().__init__(source, **kwargs)
        self.timeout = timeout
        self.summary = summary

    # ------------------------------------------------------ graphviz's command hooks
    @property
    def _pipe_lines(self):
        def pipe_lines(engine: str, format: str, input_lines: Iterator[str], *,
                       input_encoding: str, renderer: str | None = None,
                       formatter: str | None = None, neato_no_op: bool | int | None = None,
                       quiet: bool = False) -> bytes:
            data = "".join(input_lines).encode(input_encoding)
            return run_layout(_flags(engine, format, renderer, formatter, neato_no_op), data,
                              self.timeout)
        return pipe_lines

    @property
    def _pipe_lines_string(self):
        def pipe_lines_string(engine: str, format: str, input_lines: Iterator[str], *,
                              encoding: str, renderer: str | None = None,
                              formatter: str | None = None,
                              neato_no_op: bool | int | None = None,
                              quiet: bool = False) -> str:
            data = "".join(input_lines).encode(encoding)
            out = run_layout(_flags(engine, format, renderer, formatter, neato_no_op), data,
                             self.timeout)
            return out.decode(encoding)
        return pipe_lines_string

    @property
    def _render(self):
        def render(engine: str, format: str | None = None,
                   filepath: os.PathLike | str | None = None, renderer: str | None = None,
                   formatter: str | None = None, neato_no_op: bool | int | None = None,
                   quiet: bool = False, *, outfile: os.PathLike | str | None = None,
                   raise_if_result_exists: bool = False,
                   overwrite_filepath: bool = False) -> str:
            if filepath is None:  # Source.render always saves the source first
                raise graphviz.RequiredArgumentError("filepath: the saved DOT file")
            source_path = Path(filepath)
            if outfile is not None:
                target = Path(outfile)
                format = rendering.get_format(target, format=format)
                if (not overwrite_filepath and target.resolve() == source_path.resolve()):
                    raise ValueError(f"outfile {target.name!r} must be different from "
                                     f"input file {source_path.name!r}")
            else:
                if format is None:
                    raise graphviz.RequiredArgumentError("format: required without outfile")
                target = rendering.get_outfile(source_path, format=format, renderer=renderer,
                                               formatter=formatter)
            if raise_if_result_exists and target.exists():
                raise graphviz.FileExistsError(f"output file exists: {os.fspath(target)!r}")
            out = run_layout(_flags(engine, format, renderer, formatter, neato_no_op),
                             source_path.read_bytes(), self.timeout,
                             cwd=os.fspath(source_path.parent) if source_path.parent.parts
                             else None)
            target.write_bytes(out)
            return os.fspath(target)
        return render

    # ------------------------------------------------------------------- Jupyter
    def _repr_mimebundle_(self, include: Iterable[str] | None = None,
                          exclude: Iterable[str] | None = None, **kwargs: Any) -> dict:
        """The SVG (or the requested image types); the summary and DOT if ``dot`` cannot."""
        try:
            return super()._repr_mimebundle_(include, exclude, **kwargs)
        except Exception as e:  # display must never raise; say why there is no drawing
            logger.info("viz: no layout: %s", e)
            return {"text/plain": self.summary or self.source,
                    "text/html": fallback_html(self.summary, str(e), self.source)}

    def _repr_svg_(self) -> str | None:
        """The SVG for front ends that ask for it alone (``None`` without a layout)."""
        try:
            return svg_for_html(self.pipe(format="svg", encoding="utf-8"))
        except Exception as e:  # display must never raise
            logger.info("viz: no layout: %s", e)
            return None
