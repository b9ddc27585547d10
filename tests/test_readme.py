"""The README's Python examples run as written, and its set-up commands stay as CI reads them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README has no Python examples"
    namespace: dict = {}
    for block in blocks:  # later blocks build on earlier ones, as a reader would run them
        exec(compile(block, "README.md", "exec"), namespace)
    assert "collapsed" in namespace and "seq" in namespace


def test_readme_opens_with_the_two_setup_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
    commands = [line for line in first_block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].endswith("patternkit run")
    assert "pytest" in commands[1] and "torch==2.13.0" in commands[1]
    assert README.index("```bash") < README.index("patternkit brings")


def test_ci_runs_the_readme_test_command():
    out = subprocess.run(
        ["bash", "-c", "awk '/^```bash/{inblock=1; next} /^```/{if (inblock) exit} "
                       "inblock && !/^#/' README.md | sed -n 2p"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert out.endswith("python -m pytest -q")
    assert "awk" in (ROOT / ".ci" / "run").read_text()
