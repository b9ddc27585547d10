"""What the README's first command installs is enough for the commands it documents.

The base install is ``pip install -e .``: the core dependencies of ``pyproject.toml`` and
nothing from an extra.  The test environment has every extra, so a command that imports an
extra's package would pass here and crash for a user.  These tests run the commands in a
subprocess whose imports of extra-only distributions fail, as they would on the base
install.  The blocked set is read from ``pyproject.toml``, so a new extra is covered
without touching this file.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _distribution(requirement: str) -> str:
    """``"onnxscript==0.7.2"`` -> ``"onnxscript"`` (PEP 503-normalised)."""
    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_only_modules() -> set[str]:
    """Top-level modules that only an extra installs (not a core dependency)."""
    core = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = {_distribution(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values()
              for r in reqs}
    blocked_distributions = extras - core
    modules = set()
    for module, distributions in packages_distributions().items():
        names = {_distribution(d) for d in distributions}
        if names and names <= blocked_distributions:
            modules.add(module)
    return modules


BLOCKER = """
import importlib.abc, sys
BLOCKED = set({blocked!r})
class BaseInstall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the base install)",
                                      name=name)
        return None
sys.meta_path.insert(0, BaseInstall())
from patternkit.app.cli import main
sys.exit(main({argv!r}))
"""


def run_on_base_install(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    script = BLOCKER.format(blocked=sorted(extra_only_modules()), argv=argv)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)


def test_the_blocked_set_holds_what_the_extras_add():
    blocked = extra_only_modules()
    assert {"torch", "transformers", "onnx", "pytest", "networkx"} <= blocked
    assert not {"tvm", "numpy", "hypothesis"} & blocked


@pytest.mark.parametrize("argv", [
    ["verify", "--budget", "2", "--quiet", "batchnorm.collapse"],
    ["fuzz", "FoldBatchnormToConv2D", "--budget", "2"],
    ["list"],
], ids=lambda argv: argv[0])
def test_documented_command_runs_on_the_base_install(argv, tmp_path):
    result = run_on_base_install(argv, tmp_path)
    output = result.stdout + result.stderr
    assert "ModuleNotFoundError" not in output and "not in the base install" not in output, output
    assert result.returncode == 0, output


def test_the_package_does_not_import_torchvision():
    """A CUDA torchvision beside the CPU torch does not import: patternkit must not need it."""
    offenders = [str(path.relative_to(ROOT)) for folder in ("patternkit", "patterns")
                 for path in (ROOT / folder).rglob("*.py")
                 if re.search(r"^\s*(import|from)\s+(torchvision|timm)\b",
                              path.read_text(), re.MULTILINE)]
    assert offenders == []
