"""--quiet prints errors only: TVM's C++ log (written to file descriptor 2 below Python),
TVM's and torch's Python loggers are held back, and --debug shows them."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from patternkit.app.console import Console
from patternkit.errors import RuleDeclinedEveryMatch

POW_MODEL = """\
from tvm import relax
from patternkit.ir import from_expr

x = relax.Var("x", relax.TensorType((2, 3), "float32"))
mod = from_expr(relax.op.power(x, relax.const(3.0, "float32")))
"""
NATIVE_WARNING = "Detected pow(x, y) where y >= 3"


def patternkit(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "patternkit.app.cli", *argv]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture
def pow_model(tmp_path) -> Path:
    (tmp_path / "model.py").write_text(POW_MODEL)
    return tmp_path


def test_quiet_run_prints_nothing_of_tvms_native_log_and_debug_shows_it(pow_model):
    quiet = patternkit("run", "model.py", "--out", "out", "--no-draw", "--quiet", cwd=pow_model)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "" and quiet.stderr == ""
    debug = patternkit("--debug", "run", "model.py", "--out", "out", "--no-draw", "--quiet",
                       cwd=pow_model)
    assert debug.returncode == 0 and NATIVE_WARNING in debug.stderr


def test_an_ordinary_run_says_in_one_line_what_it_held_back(pow_model):
    done = patternkit("run", "model.py", "--out", "out", "--no-draw", cwd=pow_model)
    assert done.returncode == 0 and "PASS" in done.stdout
    assert NATIVE_WARNING not in done.stderr
    assert "line(s) of TVM/torch log held back (patternkit --debug shows them)" in done.stderr
    assert "building before and after for llvm" in done.stderr  # its own progress stays


def test_quiet_verify_prints_its_results_and_no_native_warning(tmp_path):
    done = patternkit("verify", "gelu_tanh.collapse", "--budget", "1", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok    gelu_tanh.collapse") and done.stderr == ""


def test_a_broken_pt2_file_is_one_line_without_torchs_traceback(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "model.pt2").write_bytes(b"not a zip archive")
    done = patternkit("run", "model.pt2", "--out", "out", "--quiet", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("patternkit: error: model.pt2: not a program saved by "
                                  "torch.export.save")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_console_holds_back_other_libraries_log_and_keeps_patternkits(capsys):
    logging.getLogger("patternkit.test").setLevel(logging.NOTSET)
    for quiet in (False, True):
        with Console(quiet=quiet) as console, warnings.catch_warnings():
            warnings.simplefilter("always")
            logging.getLogger("topi").warning("tensor_a has different data type")
            logging.getLogger("patternkit.test").warning("a patternkit warning")
            logging.getLogger("patternkit.test").error("a patternkit error")
            warnings.warn("a rule said nothing", RuleDeclinedEveryMatch)
            warnings.warn("a library's own warning", UserWarning)
        shown = capsys.readouterr().err
        assert "tensor_a has different data type" in console.held_back
        assert "a library's own warning" in console.held_back
        for text in ("tensor_a", "a library's own warning"):
            assert text not in shown
        assert "ERROR patternkit.test: a patternkit error" in shown
        assert "RuleDeclinedEveryMatch: a rule said nothing" in shown
        assert ("WARNING patternkit.test: a patternkit warning" in shown) is not quiet
        assert ("line(s) of TVM/torch log held back" in shown) is not quiet


def test_a_crash_inside_a_command_still_shows_where_it_happened(tmp_path):
    (tmp_path / "crash.py").write_text("import ctypes\nctypes.string_at(0)\n")
    done = patternkit("run", "crash.py", "--out", "out", "--quiet", cwd=tmp_path)
    assert done.returncode != 0
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert 'File "crash.py", line 2' in done.stderr
