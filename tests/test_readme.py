"""The README's Python examples run as written, and its set-up commands stay as CI reads them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _setup_commands(readme: str) -> list[str]:
    """The command lines (not comments) of the README's first ``bash`` block."""
    first_block = re.search(r"```bash\n(.*?)```", readme, flags=re.S).group(1)
    return [line for line in first_block.splitlines() if line and not line.startswith("#")]


def _run_ci(root: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """Run ``root/.ci/run`` with the ``bash`` it calls replaced by a recorder.

    Returns the finished process and the arguments the script passed to ``bash`` (``None``
    if it never called it), so the test sees what CI would run without running it.
    """
    real_bash = shutil.which("bash")
    stubs, record = tmp_path / "stubs", tmp_path / "bash-args"
    stubs.mkdir()
    stub = stubs / "bash"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([real_bash, str(root / ".ci" / "run")], env=env, capture_output=True,
                          text=True, timeout=60)
    args = record.read_text().splitlines() if record.exists() else None
    return proc, args


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README has no Python examples"
    namespace: dict = {}
    for block in blocks:  # later blocks build on earlier ones, as a reader would run them
        exec(compile(block, "README.md", "exec"), namespace)
    assert "collapsed" in namespace and "seq" in namespace


def test_readme_opens_with_the_two_setup_commands():
    commands = _setup_commands(README)
    assert len(commands) == 2
    assert commands[0].endswith("patternkit run")
    assert "pytest" in commands[1] and "torch==2.13.0" in commands[1]
    assert README.index("```bash") < README.index("patternkit brings")


def test_ci_runs_the_readme_test_command(tmp_path):
    proc, args = _run_ci(ROOT, tmp_path)
    assert proc.returncode == 0, proc.stderr
    test_command = _setup_commands(README)[1]
    assert args == ["-euo", "pipefail", "-c", test_command]
    # the whole suite, split over the machine's cores by pytest-xdist (CI has 30 minutes)
    assert test_command.endswith("python -m pytest -q -n auto")
    assert f"+ {test_command}" in proc.stdout


def test_ci_lints_and_type_checks_before_the_tests():
    test_command = _setup_commands(README)[1]
    steps = [step.strip() for step in test_command.split("&&")]
    assert steps.index("ruff check .") < steps.index("mypy") < steps.index(
        "python -m pytest -q -n auto")
    # the tools come from the venv the command creates, at the versions the config is for
    pyproject = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*?)\]", pyproject, flags=re.S | re.M).group(1)
    assert re.search(r'"ruff==[\d.]+"', test_extra) and re.search(r'"mypy==[\d.]+"', test_extra)
    assert "'.[test," in test_command


def _checkout_with_setup(tmp_path: Path, second_command: str) -> Path:
    """A copy of ``.ci/run`` beside a README whose second set-up command is given."""
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", checkout / ".ci" / "run")
    (checkout / "README.md").write_text(
        f"# demo\n\n```bash\n# 1. install\npip install -e .\n# 2. test\n{second_command}\n```\n")
    return checkout


def test_ci_refuses_a_readme_whose_tests_run_without_lint_and_types(tmp_path):
    checkout = _checkout_with_setup(tmp_path, "pip install -e . && python -m pytest -q")
    proc, args = _run_ci(checkout, tmp_path)
    assert proc.returncode == 1
    assert "should run ruff check and mypy before pytest" in proc.stderr
    assert args is None


def test_ci_refuses_a_readme_whose_second_command_does_not_run_pytest(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", checkout / ".ci" / "run")
    # only the first bash block counts, so the pytest command of the second is ignored
    (checkout / "README.md").write_text(
        "# demo\n\n```bash\n# 1. install\npip install -e .\n# 2. test\necho no tests\n```\n\n"
        "```bash\npip install -e . && python -m pytest -q\n```\n")
    proc, args = _run_ci(checkout, tmp_path)
    assert proc.returncode == 1
    assert "second set-up command should install and run pytest; found: echo no tests" \
        in proc.stderr
    assert args is None


def test_readme_links_every_notebook_and_how_to_run_them():
    notebooks = sorted(path.name for path in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks
    assert [name for name in notebooks if f"(notebooks/{name})" not in README] == []
    # the headless command's tool is in the extra the README names for it
    assert "jupyter nbconvert --to notebook --execute" in README
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^notebooks = \[(.*?)\]", pyproject, flags=re.S | re.M).group(1)
    assert '"nbconvert"' in extra and '"nbclient"' in extra


def test_the_onnx_extra_carries_the_dynamo_exporter_translator():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^onnx = \[(.*?)\]", pyproject, flags=re.S | re.M).group(1)
    assert '"onnx"' in extra and re.search(r'"onnxscript(==[\d.]+)?"', extra)
