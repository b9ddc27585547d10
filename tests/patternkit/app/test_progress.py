"""Progress: live on a terminal (a pseudo-terminal here), nothing extra anywhere else,
nothing at all with --quiet.
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time

from patternkit.app.progress import Progress

ESCAPE = "\x1b["


def test_off_a_terminal_the_lines_print_as_they_are_and_the_bar_prints_nothing():
    stream = io.StringIO()
    with Progress(stream) as progress:
        assert not progress.live
        progress("loading the model ...")
        progress.tick(1, 3, "softmax.collapse")
        progress("building [before] ...")
    assert stream.getvalue() == "loading the model ...\nbuilding [before] ...\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_prints_nothing_even_on_a_terminal():
    stream = _Terminal()
    assert Progress(stream).live
    with Progress(stream, quiet=True) as progress:
        assert not progress.live
        progress("loading the model ...")
        progress.tick(1, 3, "softmax.collapse")
    assert stream.getvalue() == ""


def _on_a_terminal(argv: list[str], timeout: float = 300) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; (exit status, output)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    child = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if not ready:
            if child.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return child.wait(timeout=30), out.decode(errors="replace")


DEMO = """
import time
from patternkit.app.progress import Progress
with Progress() as progress:
    progress("loading the model ...")
    time.sleep(0.3)
    for done in range(1, 4):
        progress.tick(done, 3, f"rule.{done}")
        time.sleep(0.25)
"""


def test_on_a_terminal_the_step_shows_live_and_stays_with_its_duration():
    status, out = _on_a_terminal([sys.executable, "-c", DEMO])
    assert status == 0, out
    assert ESCAPE in out  # drawn live
    assert re.search(r"loading the model \.\.\. \d+\.\d s", out), out
    assert "rule.1" in out and "1/3" in out and "2/3" in out


POW_MODEL = """\
from tvm import relax
from patternkit.ir import from_expr

x = relax.Var("x", relax.TensorType((2, 3), "float32"))
mod = from_expr(relax.op.power(x, relax.const(3.0, "float32")))
"""


def _run_command(folder) -> list[str]:
    (folder / "model.py").write_text(POW_MODEL)
    return [sys.executable, "-m", "patternkit.app.cli", "run", str(folder / "model.py"),
            "--out", str(folder / "out"), "--no-draw"]


def test_a_run_on_a_terminal_shows_each_step_live_with_its_duration(tmp_path):
    status, out = _on_a_terminal(_run_command(tmp_path))
    assert status == 0, out
    assert ESCAPE in out
    for step in ("loading the model", "building before and after for llvm",
                 "checking the fuse/defuse round trips"):
        assert re.search(re.escape(step) + r".* \.\.\. \d+\.\d s", out), out
    assert "PASS: " in out


def test_a_run_into_a_pipe_prints_its_lines_and_nothing_live(tmp_path):
    done = subprocess.run(_run_command(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert ESCAPE not in done.stderr and ESCAPE not in done.stdout
    assert "loading the model ...\n" in done.stderr
    assert re.search(r"\.\.\. \d+\.\d s", done.stderr) is None  # no durations either


def test_campaigns_tick_per_rule_and_for_one_target_per_instance():
    from patternkit.patterns import LIBRARY
    from patternkit.testing.fuzz import fuzz_roundtrip, verify_rules

    ticks: list[tuple] = []
    fuzz_roundtrip(budget=3, tick=lambda *tick: ticks.append(tick))
    assert ticks == [(1, 3, "roundtrip"), (2, 3, "roundtrip"), (3, 3, "roundtrip")]
    ticks.clear()
    rules = [LIBRARY["relu6.collapse"], LIBRARY["softmax.collapse"]]
    verify_rules(rules, budget=1, tick=lambda *tick: ticks.append(tick))
    assert ticks == [(1, 2, "relu6.collapse"), (2, 2, "softmax.collapse")]


def test_coverage_ticks_per_model(tmp_path):
    from patternkit.app.coverage import table_coverage

    ticks: list[tuple] = []
    lines: list[str] = []
    table_coverage(["seed-batchnorm"], ["cutlass"], progress=lines.append,
                   tick=lambda *tick: ticks.append(tick))
    assert lines[0] == "loading seed-batchnorm ..."
    assert ticks == [(1, 1, "builtin:seed-batchnorm")]
