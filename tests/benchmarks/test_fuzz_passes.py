"""benchmarks/fuzz_passes.py: a pass that kills its child costs only its own row, and the
steps of the build draw fewer programs than the passes that rewrite graphs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_passes.py"


@pytest.fixture(scope="module")
def fuzz_passes():
    spec = importlib.util.spec_from_file_location("fuzz_passes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_crashing_pass_is_recorded_and_the_passes_after_it_still_run(fuzz_passes):
    # "NoSuchPass" makes the child exit with a traceback in the middle of its list.
    passes = ["TopologicalSort", "NoSuchPass", "VMShapeLower"]
    results = fuzz_passes.run_campaign(passes, dict.fromkeys(passes, 1), seed=0)
    assert [r["pass"] for r in results] == passes
    assert "crashed" not in results[0] and results[0]["tried"] == 1
    assert "exit status 1" in results[1]["crashed"]
    assert "NoSuchPass" in results[1]["crashed"] or "AttributeError" in results[1]["crashed"]
    assert "crashed" not in results[2] and results[2]["tried"] == 1


def test_steps_of_the_build_get_the_lowering_budget(fuzz_passes):
    assert fuzz_passes.budget_of("VMShapeLower", 60, 3) == 3
    assert fuzz_passes.budget_of("FoldConstant", 60, 3) == 60
    passes, _ = fuzz_passes.candidate_passes()
    assert fuzz_passes.LOWERING_STEPS <= set(passes)  # no stale name
