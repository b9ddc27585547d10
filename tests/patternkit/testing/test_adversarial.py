"""Verify and fuzz_pass try adversarial inputs: a rewrite exact on [-1, 1] and wrong
elsewhere is caught, and named."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("hypothesis")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import patternkit as pk  # noqa: E402
from patternkit.patterns import LIBRARY  # noqa: E402
from patternkit.testing.fuzz import fuzz_pass, verify_rules  # noqa: E402
from patternkit.testing.strategies import relax_programs  # noqa: E402
from patternkit.verification.differential import adversarial_inputs, apply_transform, judge_result  # noqa: E402


def _relu_then(after: str | None) -> tvm.IRModule:
    """``relu(x)``, followed by ``sigmoid`` (which saturates above ~17) if asked."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            value = bb.emit(relax.op.nn.relu(x))
            if after == "sigmoid":
                value = bb.emit(relax.op.sigmoid(value))
            out = bb.emit_output(relax.op.multiply(value, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


class ReluAsClip(pk.RewriteRule):
    """``relu(x)`` -> ``clip(x, 0, 100)``: exact on [-1, 1], wrong above 100."""

    name = "user.relu_as_clip"

    def __init__(self):
        super().__init__()
        self.x = pk.wildcard()
        self.pattern = pk.is_op("nn.relu")(self.x)

    def rewrite(self, match):
        return relax.op.clip(match.x, 0, 100)

    @staticmethod
    def example(after="sigmoid"):
        return _relu_then(after)

    @staticmethod
    def example_space():
        return {"after": ("sigmoid", None)}


def test_verify_catches_a_rule_exact_on_small_values_and_names_the_site():
    # sigmoid(relu(x)) and sigmoid(clip(x, 0, 100)) are both 1.0 in float32 wherever the
    # two differ, so the whole module cannot tell them apart on any draw: the site can
    report = verify_rules([ReluAsClip()], budget=1, seed=0)
    assert not report.ok
    [failure] = report.failures
    assert failure.target == "user.relu_as_clip" and failure.kind == "mismatch"
    assert "rewrite site main:" in failure.error and "wide" in failure.error, failure.error
    assert failure.knobs == {"after": "sigmoid", "edge": "none"}
    assert isinstance(failure.module, tvm.IRModule)  # the reproducer


def test_verify_catches_it_on_the_whole_module_where_nothing_saturates():
    rule = ReluAsClip()
    before = _relu_then(None)
    judged = judge_result(before, apply_transform(lambda m: pk.rewrite(rule, m), before),
                          rtol=1e-5, atol=1e-5)
    assert judged.kind == "mismatch" and "on wide [-10000, 10000] inputs" in judged.error
    # ... which the seeded draws alone pass
    quiet = judge_result(before, apply_transform(lambda m: pk.rewrite(rule, m), before),
                         rtol=1e-5, atol=1e-5, adversarial=False)
    assert quiet.ok, quiet.error


def test_fuzz_pass_catches_a_callable_exact_on_small_values():
    rule = ReluAsClip()
    report = fuzz_pass(lambda mod: pk.rewrite(rule, mod),
                       relax_programs(max_ops=3), budget=12, seed=0, shrink=False,
                       name="relu_as_clip")
    assert not report.ok, str(report)
    mismatches = [f for f in report.failures if f.kind == "mismatch"]
    assert mismatches and "wide" in mismatches[0].error, str(report)
    assert mismatches[0].target == "relu_as_clip"


def test_a_library_rule_still_passes_verify_with_its_sites_validated():
    report = verify_rules([LIBRARY["batchnorm.collapse"]], budget=3, seed=0)
    assert report.ok, str(report)


def test_adversarial_draws_are_wide_positive_and_zero_and_keep_positive_inputs_positive():
    var = relax.Var("running_var", relax.TensorType((8,), "float32"))
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, var]):
        bb.emit_func_output(x)
    func = bb.get()["main"]
    draws = dict(adversarial_inputs(func, dtype="float32", input_options={"positive": ("var",)}))
    assert set(draws) == {"wide [-10000, 10000]", "positive [0.5, 1.5]", "zeros"}
    assert np.abs(draws["wide [-10000, 10000]"][0]).max() > 1000
    assert not draws["zeros"][0].any()
    assert all(0.5 <= d[1].min() for d in draws.values())
    # float16 squares +-1e2 past its range in the reference itself: no wide draw
    assert set(dict(adversarial_inputs(func, dtype="float16"))) == {"positive [0.5, 1.5]",
                                                                     "zeros"}


def test_a_draw_whose_reference_is_not_finite_is_no_evidence_not_a_failure():
    # exp(x) overflows on the wide draw in float32; a result equal to it where it is
    # finite is right, whatever it gives where the reference is infinite
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))

    def module(clip: bool) -> tvm.IRModule:
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                value = relax.op.exp(x)
                if clip:
                    value = relax.op.minimum(value, relax.const(3.0e38, "float32"))
                out = bb.emit_output(value)
            bb.emit_func_output(out)
        return bb.get()

    before, after = module(False), module(True)
    judged = judge_result(before, apply_transform(lambda m: after, before),
                          rtol=1e-5, atol=1e-5)
    assert judged.ok, judged.error



def test_float16_sites_are_validated_when_verify_can_widen_them_to_float64():
    # layernorm's float16 region overflows on its own wide draw (16 squares of ~1e4 pass
    # 65504); against the region in float64 the fused op is the closer of the two
    from patternkit.training.precision import as_float64

    rule = LIBRARY["layernorm.collapse"]
    report = verify_rules([rule], budget=4, seed=0,
                          widen=functools.partial(as_float64, name="site"))
    assert report.ok, str(report)
    assert "float16" in report["layernorm.collapse"].tolerances


def test_check_rule_catches_a_rule_exact_on_small_values_at_its_site():
    from patternkit.testing import EXACT, Negative, RuleCase, check_rule
    from patternkit.verification.numeric import assert_same_numerics


    rule = ReluAsClip()
    before = _relu_then("sigmoid")
    after = pk.rewrite(rule, before)
    doubled = _relu_then(None)
    case = RuleCase(rule, before, after,
                    [Negative("no_relu", pk.rewrite(rule, doubled), "nn.relu")], EXACT)
    with pytest.raises(AssertionError, match="user.relu_as_clip: a rewrite site.*main:.*wide"):
        check_rule(case)
    # the whole module agrees on its seeded draws: only the site tells
    assert_same_numerics(before, after, rtol=0.0, atol=0.0)
