"""The application: the main job (``patternkit run``), the command line, built-in models."""

from .job import JobReport, run, verify

__all__ = ["JobReport", "run", "verify"]
