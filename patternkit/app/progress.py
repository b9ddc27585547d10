"""What a long command shows while it works: on a terminal, live; anywhere else, nothing new.

``patternkit verify`` ran for two minutes in silence, and a 12-layer model's build,
numeric check and site validation look the same as a hang.  Every command reports
through one :class:`Progress`:

* ``progress(message)``: the command's own lines (``building before and after for llvm
  ...``), as before.  On a terminal the current line carries a spinner and the time it
  has taken, and once the next step starts it stays with its duration
  (``loading the model ... 41.2 s``), so a slow zoo build or validation shows which step
  it is and that it is alive;
* ``progress.tick(done, total, what)``: counted work (the rules of ``verify``, the
  instances of ``fuzz``, the models of ``coverage``) as a bar, on a terminal only.

When the stream is not a terminal (a pipe, a CI log, a test), the lines are printed as
they always were and nothing else: no bar, no escape codes.  ``quiet=True``
(``--quiet``) prints nothing at all.  The live display is drawn with ``rich``, imported
only when there is a terminal to draw on.  Use it as a context manager: leaving the
block ends the live display.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    """A command's progress; see the module docstring.

    Parameters
    ----------
    stream : text stream, optional
        Where the lines go (default ``sys.stderr``).
    quiet : bool
        Print nothing.
    live : bool, optional
        Draw the live display; default: when ``stream`` is a terminal and not ``quiet``.
    """

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False,
                 live: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.live = (not quiet and _is_terminal(self.stream)) if live is None else live
        self._display: Any = None  # the rich display, once something is shown
        self._status: Any = None  # its task for the current line
        self._bar: Any = None  # its task for counted work
        self._line: tuple[str, float] | None = None  # the current line and when it began

    # -- lines --------------------------------------------------------------------------------
    def __call__(self, message: str) -> None:
        """Say what the command does now (a line; on a terminal, a live one)."""
        if self.quiet:
            return
        if not self.live:
            print(message, file=self.stream, flush=True)
            return
        display = self._started()
        self._end_line()
        self._line = (message, time.perf_counter())
        display.reset(self._status, description=message, total=None, visible=True)

    def _end_line(self) -> None:
        """Leave the current line on the terminal, with how long its step took."""
        if self._line is not None:
            message, start = self._line
            self._display.console.print(f"{message} {time.perf_counter() - start:.1f} s",
                                        markup=False, highlight=False)
            self._line = None

    # -- counted work -------------------------------------------------------------------------
    def tick(self, done: int, total: int, what: str = "") -> None:
        """``done`` of ``total`` pieces of work finished, the last one ``what``."""
        if not self.live:
            return
        display = self._started()
        if self._bar is None:
            self._bar = display.add_task(what, total=total, count="")
        display.update(self._bar, completed=done, total=total, description=what,
                       count=f"{done}/{total}", visible=done < total)

    # -- the live display ---------------------------------------------------------------------
    def _started(self) -> Any:
        if self._display is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress as Display,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._display = Display(
                SpinnerColumn(), TextColumn("{task.description}", markup=False),
                BarColumn(), TextColumn("{task.fields[count]}", markup=False),
                TimeElapsedColumn(),
                console=Console(file=self.stream, highlight=False), transient=True,
                redirect_stdout=False, redirect_stderr=False)
            self._status = self._display.add_task("", total=None, visible=False, count="")
            self._display.start()
        return self._display

    def close(self) -> None:
        """End the live display; the current line stays, with its duration."""
        if self._display is not None:
            self._end_line()
            self._display.stop()
            self._display = self._status = self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 _traceback: TracebackType | None) -> None:
        self.close()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False
