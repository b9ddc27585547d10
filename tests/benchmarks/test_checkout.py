"""A benchmark's ``--before`` child imports the older checkout's engine and rule library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import checkout  # noqa: E402

PROBE = ("import sys; sys.path.insert(0, {bench!r}); import checkout; "
         "checkout.import_checkout_library(); import patternkit, patternkit.patterns as p; "
         "print(patternkit.__file__); print(p.__file__)")


def _tree(tmp_path: Path) -> Path:
    """A copy of this checkout's ``patternkit`` and ``patterns`` (as ``git archive`` gives)."""
    code = tmp_path / "old"
    code.mkdir()
    subprocess.run(f"git -C '{ROOT}' archive HEAD patternkit patterns | tar -x -C '{code}'",
                   shell=True, check=True, executable="/bin/bash")
    return code


def test_a_before_child_imports_the_checkouts_engine_and_rule_library(tmp_path):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    code = _tree(tmp_path)
    # run where a benchmark's child runs: not from the repository root, which ``-c`` would
    # put first on the path
    probe = PROBE.format(bench=str(ROOT / "benchmarks"))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env=checkout.child_env(str(code)),
                         cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(code)) and out[1].startswith(str(code / "patterns"))
    here = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, env=checkout.child_env(None), cwd=tmp_path).stdout.split()
    assert not here[0].startswith(str(code)) and not here[1].startswith(str(code))
