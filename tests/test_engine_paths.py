"""The engine's other ways of reading a function pass the engine's whole test suite.

The suite runs on the default path (the index read field by field).  The snapshot index
(``PATTERNKIT_SNAPSHOT_INDEX=1``) reads a function in one native call, or with the
pure-Python reader where no compiler is at hand (``PATTERNKIT_NATIVE=0``); both must give
the same tables, matches, rewrites and logs.  The parity tests compare the paths on zoo
models and random programs; this runs every engine and matcher test again on each path,
in a child pytest (the switches are read once per process), so a behaviour no parity test
covers still cannot differ unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["tests/patternkit/engine", "tests/patternkit/dpl"]


@pytest.mark.slow
@pytest.mark.parametrize("switches", [
    pytest.param({"PATTERNKIT_SNAPSHOT_INDEX": "1"}, id="snapshot-native"),
    pytest.param({"PATTERNKIT_SNAPSHOT_INDEX": "1", "PATTERNKIT_NATIVE": "0"},
                 id="snapshot-python"),
])
def test_the_engine_suite_passes_on_each_snapshot_path(switches):
    env = {**os.environ, **switches}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
         *SUITES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
    assert proc.returncode == 0, f"{switches}:\n{tail}"
    assert " passed" in tail and "failed" not in tail
