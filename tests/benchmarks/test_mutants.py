"""benchmarks/mutants.py: a wrong rewrite is caught by the job, the right one passes.

The script's table is only worth something if its verdicts are: the control (the library
rule itself, wrapped as a mutant) must pass, a mutant that scales the result by 1.5 must
fail the run with a site that names the rule, and that must hold when the model's output
is all zero after the rewritten region (the whole-model comparison is then no evidence).
``batchnorm.collapse`` on its own hand-built example keeps each run about a second.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mutants.py"
RULE = "batchnorm.collapse"


@pytest.fixture(scope="module")
def mutants():
    """The script imported as a module (its ``main`` does not run).

    Registered in ``sys.modules`` while it executes: its dataclasses look their module up
    there.
    """
    spec = importlib.util.spec_from_file_location("benchmark_mutants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


@pytest.fixture(scope="module")
def rule():
    from patternkit.patterns import LIBRARY

    return LIBRARY.find(RULE)


@pytest.fixture(scope="module", params=[1.0, 0.0], ids=["example", "example_x0"])
def model(request, mutants, rule):
    example = rule.example()
    return example if request.param == 1.0 else mutants.attenuated(example, 0.0)


def test_the_unmutated_rule_passes(mutants, rule, model):
    row = mutants.run_one(rule, mutants.UNMUTATED, "example", model)
    assert row["verdict"] == "pass", row


def test_a_result_scaled_by_one_and_a_half_is_caught_at_a_site_naming_the_rule(
        mutants, rule, model):
    row = mutants.run_one(rule, "scale_1.5", "example", model)
    assert row["verdict"] == "caught", row
    assert row["sites"] >= 1 and row["evidence"].startswith("site "), row


def test_a_zero_output_model_leaves_the_whole_model_comparison_inconclusive(mutants, rule):
    from patternkit.app import job

    weak = mutants.attenuated(rule.example(), 0.0)
    report = job.run(weak, patterns=[rule], out_dir=None, draw=False)
    assert report.numeric.status == "inconclusive"
    assert report.ok, report.evidence


def test_a_mutation_with_no_candidate_is_not_applicable(mutants):
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    assert mutants.mutate(relax.op.nn.gelu(x), "epsilon_x100") is None
    assert mutants.mutate(relax.op.nn.gelu(x), "transpose_added") is None


def test_an_operand_swap_of_a_commutative_op_is_equivalent_with_the_reason(mutants):
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    y = relax.Var("y", relax.TensorType((2, 3), "float32"))
    mutation = mutants.mutate(relax.op.add(x, y), "operands_swapped")
    assert mutation is not None and mutation.equivalent == "relax.add is commutative"
