"""explain(): why a pattern did not match, told at the deepest point where matching failed."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import patternkit as pk
from patternkit.dpl.pattern import pattern_to_text

CONV = pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())


@pytest.fixture
def conv_relu(make_var):
    """relu(conv2d(x, w)) as a bare expression, and as main's bindings: (expr, main)."""
    x, w = make_var("x", (1, 3, 8, 8)), make_var("w", (4, 3, 3, 3))
    expr = relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]), "conv")
            out = bb.emit_output(relax.op.nn.relu(conv), "out")
        bb.emit_func_output(out)
    return expr, bb.get()["main"]


def test_a_match_is_reported_as_matched(conv_relu):
    expr, main = conv_relu
    assert pk.explain(pk.is_op("nn.relu")(CONV), expr) == "matched"
    assert pk.explain(pk.is_op("nn.relu")(CONV), main.body.body, main) == "matched"


def test_an_attribute_mismatch_names_the_constraint_and_the_call_it_met(conv_relu):
    expr, _ = conv_relu
    why = pk.explain(pk.is_op("nn.relu")(CONV.has_attr({"data_layout": "NHWC"})), expr)
    assert why.startswith("no match: nn.conv2d(*, *).has_attr({'data_layout': 'NHWC'}) "
                          "(depth 2) vs R.nn.conv2d(x, w, ")


def test_dtype_and_shape_mismatches_name_the_constraint_and_the_call_it_met(conv_relu):
    expr, _ = conv_relu
    for constraint, text in ((CONV.has_dtype("float16"), "has_dtype('float16')"),
                             (CONV.has_shape([1, 4, 8, 9]), "has_shape([1, 4, 8, 9])")):
        why = pk.explain(pk.is_op("nn.relu")(constraint), expr)
        assert why.startswith(f"no match: nn.conv2d(*, *).{text} (depth 2) vs R.nn.conv2d(x, w"), \
            why


def test_a_type_mismatch_names_the_wanted_type(conv_relu):
    expr, _ = conv_relu
    wanted = relax.TensorType(ndim=3, dtype="float32")
    why = pk.explain(pk.is_op("nn.relu")(pk.dpl.has_type(wanted)), expr)
    assert why.startswith("no match: *.has_type(rank-3 float32 tensor)")


def test_a_type_mismatch_points_at_the_expression_of_the_wrong_type(conv_relu):
    expr, _ = conv_relu
    rank3 = relax.TensorType(ndim=3, dtype="float32")
    why = pk.explain(pk.is_op("nn.relu")(pk.dpl.has_type(rank3)), expr)
    assert why.startswith("no match: *.has_type(") and "(depth 2) vs R.nn.conv2d(x, w" in why


def test_the_deepest_failure_is_reported_not_the_root(conv_relu):
    expr, _ = conv_relu
    pattern = pk.is_op("nn.relu")(pk.is_op("nn.conv2d")(pk.wildcard(), pk.is_constant()))
    assert pk.explain(pattern, expr) == "no match: const (depth 3) vs w"


def test_a_wrong_operator_is_reported_at_its_call_with_the_arguments(conv_relu):
    expr, _ = conv_relu
    why = pk.explain(pk.is_op("nn.gelu")(CONV), expr)
    assert why.startswith("no match: nn.gelu(nn.conv2d(*, *)) (depth 1) vs "
                          "R.nn.relu(R.nn.conv2d(x, w, ")


def test_the_deepest_failure_of_any_alternative_wins(make_var):
    s = make_var("s", (2, 3))
    expr = relax.op.nn.relu(relax.op.exp(relax.op.sigmoid(s)))
    shallow = pk.is_op("nn.relu")(pk.is_op("tanh")(pk.wildcard()))
    deep = pk.is_op("nn.relu")(pk.is_op("exp")(pk.is_op("exp")(pk.wildcard())))
    for pattern in (shallow | deep, deep | shallow):
        assert pk.explain(pattern, expr) == "no match: exp(*) (depth 4) vs R.sigmoid(s)"


def test_with_the_function_the_var_and_its_value_are_shown(conv_relu):
    _, main = conv_relu
    why = pk.explain(pk.is_op("nn.relu")(CONV.has_attr({"data_layout": "NHWC"})), main.body.body,
                     main)
    assert why.startswith("no match: nn.conv2d(*, *).has_attr({'data_layout': 'NHWC'}) "
                          "(depth 2) vs 'conv' = R.nn.conv2d(x, w, ")


def test_long_expressions_are_shortened_to_one_line(conv_relu):
    expr, _ = conv_relu
    why = pk.explain(pk.is_op("nn.gelu")(CONV), expr)
    found = why.split(" vs ", 1)[1]
    assert "\n" not in why and len(found) == 103 and found.endswith("...")


def test_an_expected_constant_is_shown_with_its_dtype_and_values_as_is_the_one_found(make_var):
    x = make_var("x", (2, 3))
    expr = relax.op.multiply(x, relax.const(np.full((3,), 2.0, "float32")))
    wanted = relax.const(np.array([1.0, 2.5, 3.0], "float32"))
    why = pk.explain(pk.is_op("multiply")(pk.wildcard(), pk.is_expr(wanted)), expr)
    assert why == "no match: expr(float32[3] [1, 2.5, 3]) (depth 2) vs const float32[3] [2, 2, 2]"
    assert pk.explain(pk.is_expr(relax.const(0.5, "float32")), relax.const(1.0, "float32")) == \
        "no match: expr(float32 0.5) (depth 1) vs const float32 1"


def test_a_near_miss_of_a_pattern_that_shares_sub_patterns_stays_one_short_line(make_var):
    """A DAG pattern prints as a tree: ten levels of ``x + x`` over a shared ``x`` are
    2^10 copies of the bottom.  The near miss shows the failed node three levels deep."""
    pattern = pk.wildcard()
    for _ in range(10):
        pattern = pk.is_op("multiply")(pattern, pattern) | pk.is_op("add")(pattern, pattern)
    full = pattern_to_text(pattern)
    x = make_var("x", (4,))
    why = pk.explain(pattern, relax.op.subtract(x, x))
    assert len(full) > 100_000
    assert why.startswith("no match: ") and len(why) < 400 and "…" in why
    assert pattern_to_text(pattern, max_depth=1) == (
        "(multiply(…, …) | add(…, …))")
