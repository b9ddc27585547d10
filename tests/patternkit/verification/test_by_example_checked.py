"""rule_by_example checks ``written == fused`` on llvm before it hands the rule back."""

from __future__ import annotations

import time

import pytest
from tvm import relax

import patternkit as pk
from patternkit.errors import PatternError
from patternkit.ir import from_expr
from patternkit.testing.fuzz import verify_rules
from patternkit.verification import rule_by_example
from patternkit.verification.by_example import BUILDS, find_counterexample


def _fast_gelu(x):
    return x * relax.op.sigmoid(x * relax.const(1.702, x.ty.dtype))


def _gelu(x):
    return relax.op.nn.gelu(x)


def test_an_equal_pair_is_accepted_and_rewrites():
    rule = rule_by_example("silu.collapse", lambda x: x * relax.op.sigmoid(x),
                           lambda x: relax.op.nn.silu(x))
    x = relax.Var("x", relax.TensorType((2, 5), "float32"))
    assert "R.nn.silu" in pk.rewrite(rule, from_expr(x * relax.op.sigmoid(x))).script()


def test_an_unequal_pair_is_refused_with_a_shrunk_counterexample_as_tvmscript():
    with pytest.raises(PatternError) as err:
        rule_by_example("gelu.fast", _fast_gelu, _gelu)
    text = str(err.value)
    first, _, script = text.partition("\n")
    assert first.startswith("gelu.fast: written and fused differ in float32 at m=1, n=1")
    assert "shrunk" in first and "state a tolerance=" in first
    assert "def written_0(x: R.Tensor((1, 1)" in script and "R.nn.gelu(x)" in script


def test_a_stated_tolerance_that_covers_the_difference_is_accepted():
    rule = rule_by_example("gelu.fast", _fast_gelu, _gelu, tolerance=0.03,
                           dtypes=("float32",))
    assert rule.name == "gelu.fast"
    with pytest.raises(PatternError, match="tolerance rtol=0.001"):
        rule_by_example("gelu.fast", _fast_gelu, _gelu, tolerance=1e-3, dtypes=("float32",))


def test_a_difference_only_larger_sizes_show_is_found_and_not_shrunk_away():
    # sum and max of one element agree: only n > 1 tells them apart.
    def written(x):
        return relax.op.sum(x, axis=[1], keepdims=True)

    def fused(x):
        return relax.op.max(x, axis=[1], keepdims=True)

    with pytest.raises(PatternError) as err:
        rule_by_example("sum.as_max", written, fused, dtypes=("float32",))
    first = str(err.value).splitlines()[0]
    assert first.startswith("sum.as_max: written and fused differ in float32 at m=4, n=4")
    assert "shrunk" not in first


def test_a_pair_whose_written_side_is_constant_cannot_be_judged():
    with pytest.raises(PatternError, match="constant output on every draw"):
        rule_by_example("zero.collapse", lambda x: x - x, lambda x: relax.op.zeros_like(x))


def test_a_second_construction_builds_nothing():
    def build():
        return rule_by_example("silu.collapse", lambda x: x * relax.op.sigmoid(x),
                               lambda x: relax.op.nn.silu(x), dtypes=("float32",))

    build()
    cached = len(BUILDS.entries)
    start = time.perf_counter()
    build()
    assert len(BUILDS.entries) == cached
    assert time.perf_counter() - start < 0.5


def test_verify_false_defers_the_check_and_pk_verify_finds_the_counterexample():
    rule = rule_by_example("gelu.fast", _fast_gelu, _gelu, dtypes=("float32",),
                           verify=False)
    assert find_counterexample(type(rule).spec) is not None
    report = verify_rules([rule], budget=4, seed=0)
    assert not report.ok


def test_pk_verify_passes_an_equal_pair():
    rule = rule_by_example("silu.collapse", lambda x: x * relax.op.sigmoid(x),
                           lambda x: relax.op.nn.silu(x), dtypes=("float32", "float16"))
    report = verify_rules([rule], budget=6, seed=0)
    assert report.ok, report


def test_a_dtype_tvm_cannot_build_is_reported_not_run_and_the_others_are_checked(caplog):
    def written(x):
        return x * relax.op.power(x, relax.const(2.0, x.ty.dtype))

    def fused(x):
        return x * x * x

    with caplog.at_level("WARNING"):
        rule_by_example("cube.collapse", written, fused, dtypes=("float32", "bfloat16"))
    assert ("cube.collapse: NOT RUN in bfloat16 for spelling 0: the pair does not build for "
            "llvm") in caplog.text
    with pytest.raises(PatternError, match="builds for llvm in none of its dtypes"):
        rule_by_example("cube.collapse", written, fused, dtypes=("bfloat16",))
