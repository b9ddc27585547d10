"""The job's output folder: every run's files written aside and moved in place at the end.

A run that failed used to leave the previous run's ``report.md`` (often a PASS) in the
folder, next to whatever files it had written before it stopped, and a run that
crashed while writing left an empty report.  The folder must only ever hold what one
run wrote, so :class:`OutputFolder` stages the run's files in a hidden folder inside
the output folder (same file system: every move is a rename) and, at the end:

* on success, removes the files of the previous run (those its ``report.json`` lists)
  that this run did not write, then moves the new files in, the reports last;
* on failure, removes the previous run's files and writes a ``report.md`` and
  ``report.json`` that say the run stopped and why, in one line.  A folder that holds
  no previous run's report is left as it was, and one that did not exist before the
  run is not created by a run that failed.

Only files a run of patternkit wrote are ever removed: the names the previous
``report.json`` lists, plus the two reports; a user's own files in the folder stay.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import first_line

__all__ = ["OutputFolder", "STAGING_PREFIX"]

#: The hidden folder a run stages its files in, inside the output folder.
STAGING_PREFIX = ".patternkit-partial-"
_REPORTS = ("report.json", "report.md")


class OutputFolder:
    """Stage a run's output files and move them into ``out`` when the run ends.

    Use as a context manager around the run; write into :attr:`staging`.  An exception
    leaving the block replaces the previous run's files with a report of the failure,
    then propagates unchanged.

    Parameters
    ----------
    out : Path
        The output folder the user named (created if missing).
    model : str
        How the failure report names the model.
    """

    def __init__(self, out: Path, model: str):
        self.out = out
        self.model = model
        self.existed = out.is_dir()
        out.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 _traceback: TracebackType | None) -> None:
        try:
            if error is None:
                self._move_in()
            else:
                self._record_failure(error)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)

    def _move_in(self) -> None:
        """Replace the previous run's files by the staged ones, the reports last."""
        written = sorted(p.name for p in self.staging.iterdir())
        previous = _previous_outputs(self.out) or []
        for name in _REPORTS:  # from here until the end, no report from either run
            (self.out / name).unlink(missing_ok=True)
        for name in previous:
            if name not in written:
                (self.out / name).unlink(missing_ok=True)
        for name in sorted(written, key=lambda n: n in _REPORTS):
            os.replace(self.staging / name, self.out / name)

    def _record_failure(self, error: BaseException) -> None:
        """Remove the previous run's files; say in their place why this run stopped.

        A folder without a previous run's report is left as it was (a ``report.md`` of
        the user's own is not overwritten), and removed if this run created it.
        """
        previous = _previous_outputs(self.out)
        if previous is None:
            shutil.rmtree(self.staging, ignore_errors=True)
            if not self.existed:
                try:
                    self.out.rmdir()  # only if empty: nothing of the user's is touched
                except OSError:
                    pass
            return
        for name in (*previous, *_REPORTS):
            (self.out / name).unlink(missing_ok=True)
        reason = _one_line(error)
        (self.out / "report.json").write_text(json.dumps(
            {"model": self.model, "ok": False, "error": reason}, indent=2))
        (self.out / "report.md").write_text(
            f"# patternkit run: {self.model}\n\n**ERROR**: the run stopped before it "
            f"finished: {reason}\n\nNothing else was written; run again with `--debug` "
            f"for the traceback.\n")


def _previous_outputs(out: Path) -> list[str] | None:
    """The files the last run wrote into ``out``, as its report lists them; ``None`` when
    ``out`` holds no report of a patternkit run.
    """
    try:
        report: Any = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or "model" not in report or "ok" not in report:
        return None
    listed = report.get("outputs", [])
    if not isinstance(listed, list):
        return []
    return [name for name in listed
            if isinstance(name, str) and name and Path(name).name == name
            and not name.startswith(".")]


def _one_line(error: BaseException) -> str:
    """The error as the command line prints it: its type if it has no text."""
    if not str(error).strip():
        return type(error).__name__
    return f"{type(error).__name__}: {first_line(error)}"
