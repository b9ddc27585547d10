"""The rule contract fails on each broken proof, and says which one."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.testing import EXACT, Negative, RuleCase, Tolerance, assert_reparses, check_rule


@I.ir_module
class DoubleRelu:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.nn.relu(a)
            R.output(b)
        return b


@I.ir_module
class SingleRelu:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            b = R.nn.relu(x)
            R.output(b)
        return b


@I.ir_module
class Float16DoubleRelu:
    @R.function
    def main(x: R.Tensor((2, 3), "float16")) -> R.Tensor((2, 3), "float16"):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.nn.relu(a)
            R.output(b)
        return b


class CollapseDoubleRelu(pk.RewriteRule):
    """``relu(relu(x))`` is ``relu(x)``, for float32 only."""

    name = "test.collapse_double_relu"

    def __init__(self, replacement=None):
        super().__init__()
        self.replacement_op = replacement
        self.x = pk.wildcard()
        self.inner = pk.is_op("nn.relu")(self.x)
        self.pattern = pk.is_op("nn.relu")(self.inner)

    def check(self, match):
        if str(match.x.ty.dtype) != "float32":
            return pk.reject("only float32")
        return True

    def rewrite(self, match):
        return match.inner if self.replacement_op is None else self.replacement_op(match.x)


def case(rule=None, expected=SingleRelu, negatives=None, tolerance=EXACT):
    negatives = [Negative("float16", Float16DoubleRelu, "only float32")] \
        if negatives is None else negatives
    return RuleCase(rule or CollapseDoubleRelu(), DoubleRelu, expected, negatives, tolerance)


def test_a_correct_case_passes_and_reports_the_reject_site():
    proof = check_rule(case())
    tvm.ir.assert_structural_equal(proof.after, SingleRelu)
    (negative,) = proof.negatives
    assert negative.reasons == ("only float32",) and negative.site[0] == __file__


def test_a_wrong_expected_module_fails_the_structure_proof():
    with pytest.raises(AssertionError, match="the result differs from Expected"):
        check_rule(case(expected=Float16DoubleRelu))


def test_a_positive_case_that_changes_nothing_is_refused():
    with pytest.raises(AssertionError, match="Expected equals Before"):
        check_rule(case(expected=DoubleRelu))


def test_a_negative_the_rule_fires_on_fails_the_reasons_proof():
    with pytest.raises(AssertionError, match="changed the module it must leave alone"):
        check_rule(case(negatives=[Negative("fires", DoubleRelu, "only float32")]))


def test_a_wrong_reason_fails_and_shows_the_reason_given():
    with pytest.raises(AssertionError, match=r"expected a reason containing 'float64'.*"
                                             r"\['only float32'\]"):
        check_rule(case(negatives=[Negative("float16", Float16DoubleRelu, "float64")]))


def test_a_case_without_negatives_fails():
    with pytest.raises(AssertionError, match="needs at least one negative"):
        check_rule(case(negatives=[]))


def test_a_non_match_is_explained():
    proof = check_rule(case(negatives=[Negative("single", SingleRelu, "no match: nn.relu(*)")]))
    assert proof.negatives[0].reasons[0].startswith("no match: nn.relu(*) (depth 2) vs x")


def test_numbers_that_change_fail_the_numeric_proof():
    exp_rule = CollapseDoubleRelu(replacement=relax.op.exp)

    @I.ir_module
    class Exp:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                b = R.exp(x)
                R.output(b)
            return b

    with pytest.raises(AssertionError, match="numeric check failed: MISMATCH"):
        check_rule(case(rule=exp_rule, expected=Exp))


def test_a_tolerance_says_why_and_composites_are_exact():
    with pytest.raises(ValueError, match="say why"):
        Tolerance(1e-5, 1e-5, " ")
    from patternkit.patterns.conv import ConvAddReluComposite

    loose = RuleCase(ConvAddReluComposite(), DoubleRelu, SingleRelu, [],
                     Tolerance(1e-4, 1e-4, "a guess"))
    from patternkit.testing.contract import prove_numerics

    with pytest.raises(AssertionError, match="its numeric proof is EXACT"):
        prove_numerics(loose, SingleRelu)


def test_modules_with_tensor_constants_reparse_with_the_constants_lifted():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    mod = pk.from_expr(relax.op.add(x, relax.const(np.ones((2, 3), "float32"))))
    assert 'metadata["ir.GenericConst"][0]' in mod.script()  # which TVMScript cannot parse
    with pytest.raises(tvm.error.DiagnosticError):
        tvm.script.from_source(mod.script())
    assert_reparses(mod)


@I.ir_module
class OneProjection:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"),
             w: R.Tensor((8, 4), "float32")) -> R.Tensor((2, 4), "float32"):
        with R.dataflow():
            a = R.matmul(x, w)
            out = R.exp(a)
            R.output(out)
        return out


def test_a_multi_root_rule_that_matches_nothing_is_explained_at_its_ends():
    from patternkit.patterns.matmul import CombineParallelMatmul
    from patternkit.testing.contract import prove_reasons

    rule = CombineParallelMatmul()
    assert rule.pattern is None and rule.root_patterns()  # no single pattern to explain
    case = RuleCase(rule, OneProjection, OneProjection, tolerance=EXACT,
                    negatives=[Negative("one_projection", OneProjection, "no match: matmul")])
    (result,) = prove_reasons(case)
    assert "vs R.exp(a)" in result.reasons[0]
