"""What reaches the terminal: the command's own lines, not its libraries' chatter.

TVM's C++ logging (``Detected pow(x, y) where y >= 3``, ``BlockBuilder destroyed with
remaining blocks!``) writes straight to the process's file descriptor 2, below Python;
TVM's and torch's Python loggers (``topi: tensor_a has different data type``,
``torch.export.load``'s deserialisation tracebacks) write to stderr too.  They made up
half of what ``patternkit verify --quiet`` printed, and a quiet command prints errors
only.  So, unless ``--debug`` is given, a command runs inside a :class:`Console`:

* file descriptor 2 is redirected to a temporary file for the whole command: every
  build and import, and the worker processes, which inherit it;
* the command's own lines go to the real stderr: its progress, its one-line error,
  the records of patternkit's loggers (from ``WARNING``; only errors with ``--quiet``)
  and :class:`~patternkit.errors.PatternkitWarning` warnings, which are about the
  user's own rules and so shown even with ``--quiet``;
* other libraries' log records and warnings are held back with the native log;
* at the end, without ``--quiet``, one line says how many lines were held back;
* a crash (a segmentation fault inside TVM) still prints Python's traceback
  (:mod:`faulthandler`) on the real stderr.

With ``--debug`` nothing is redirected: everything is shown as it comes.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import tempfile
import warnings
from types import TracebackType
from typing import IO, Any, TextIO

from ..errors import PatternkitWarning

__all__ = ["Console", "LOG_FORMAT"]

#: How the command line prints log records.
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
_STDERR_FD = 2


class Console:
    """Hold back the native and third-party log of a command; see the module docstring.

    Parameters
    ----------
    quiet : bool
        Errors only: patternkit's log records below ``ERROR`` are held back too, and
        nothing is said about what was held back.
    debug : bool
        Hold nothing back.

    Attributes
    ----------
    stream : text stream
        Where the command writes its own lines (the real stderr).
    held_back : str
        What was held back, once the block has ended.
    """

    def __init__(self, quiet: bool = False, debug: bool = False):
        self.quiet = quiet
        self.debug = debug
        self.stream: TextIO = sys.stderr
        self.held_back = ""
        self._saved_fd: int | None = None
        self._capture: IO[bytes] | None = None
        self._held: TextIO = sys.stderr  # the capture, as a text stream
        self._own_stream = False
        self._faulthandler_was_on = False
        self._handlers: list[logging.Handler] = []
        self._showwarning: Any = None
        self._root_level = logging.getLogger().level

    def __enter__(self) -> Console:
        if self.debug:
            self._add_handler(logging.StreamHandler(self.stream), logging.WARNING)
            return self
        self._redirect_native_stderr()
        ours = self._add_handler(logging.StreamHandler(self.stream),
                                 logging.ERROR if self.quiet else logging.WARNING)
        ours.addFilter(_from_patternkit)
        theirs = self._add_handler(logging.StreamHandler(self._held), logging.WARNING)
        theirs.addFilter(lambda record: not _from_patternkit(record))
        self._showwarning = warnings.showwarning
        warnings.showwarning = self._show_warning
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 _traceback: TracebackType | None) -> None:
        root = logging.getLogger()
        for handler in self._handlers:
            root.removeHandler(handler)
        root.setLevel(self._root_level)
        if self.debug:
            return
        warnings.showwarning = self._showwarning
        self._restore_native_stderr()
        lines = len(self.held_back.splitlines())
        if lines and not self.quiet:
            self.stream.write(f"patternkit: {lines} line(s) of TVM/torch log held back "
                              f"(patternkit --debug shows them)\n")
        self.stream.flush()
        if self._own_stream:
            faulthandler.disable()
            if self._faulthandler_was_on:
                faulthandler.enable()
            self.stream.close()

    # -- file descriptor 2 ------------------------------------------------------------------
    def _redirect_native_stderr(self) -> None:
        sys.stderr.flush()
        self._saved_fd = os.dup(_STDERR_FD)
        self._capture = tempfile.TemporaryFile()
        os.dup2(self._capture.fileno(), _STDERR_FD)
        self._held = os.fdopen(os.dup(self._capture.fileno()), "w", buffering=1)
        if _writes_to_fd2(sys.stderr):
            # Python's stderr now lands in the capture too: our lines need the real one
            self.stream = os.fdopen(os.dup(self._saved_fd), "w", buffering=1)
            self._own_stream = True
            # a crash inside TVM ends the process with its log held back: the Python
            # traceback at least reaches the terminal.  TVM installs its own crash handler
            # (writing to descriptor 2) when it loads, so it loads first.
            import tvm  # noqa: F401

            self._faulthandler_was_on = faulthandler.is_enabled()
            faulthandler.enable(file=self.stream)

    def _restore_native_stderr(self) -> None:
        assert self._saved_fd is not None and self._capture is not None
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        self._held.close()
        os.dup2(self._saved_fd, _STDERR_FD)
        os.close(self._saved_fd)
        self._capture.seek(0)
        self.held_back = self._capture.read().decode(errors="replace")
        self._capture.close()

    # -- Python's log and warnings ----------------------------------------------------------
    def _add_handler(self, handler: logging.Handler, level: int) -> logging.Handler:
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root = logging.getLogger()
        if root.level == logging.NOTSET or root.level > logging.WARNING:
            root.setLevel(logging.WARNING)
        root.addHandler(handler)
        self._handlers.append(handler)
        return handler

    def _show_warning(self, message: Any, category: type[Warning], filename: str,
                      lineno: int, file: Any = None, line: str | None = None) -> None:
        if issubclass(category, PatternkitWarning):
            self.stream.write(warnings.formatwarning(message, category, filename, lineno,
                                                     line))
        else:
            self._held.write(warnings.formatwarning(message, category, filename, lineno, line))


def _from_patternkit(record: logging.LogRecord) -> bool:
    return record.name == "patternkit" or record.name.startswith("patternkit.")


def _writes_to_fd2(stream: Any) -> bool:
    """``stream`` is a file on descriptor 2 (not a test harness's or a notebook's)."""
    try:
        return bool(stream.fileno() == _STDERR_FD)
    except (AttributeError, OSError, ValueError):
        return False
