"""Rules by example: tracing, generalisation, the rewrite, composites and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.engine.by_example import example_rule_class
from patternkit.errors import PatternError
from patternkit.ir import from_expr
from patternkit.verification.numeric import assert_same_numerics


def _var(shape=(2, 3), dtype="float32", name="x"):
    return relax.Var(name, relax.TensorType(shape, dtype))


def _silu_class():
    return example_rule_class("silu.collapse", lambda x: x * relax.op.sigmoid(x),
                              lambda x: relax.op.nn.silu(x))


def _silu_module(x):
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.silu(x))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(2, 3), (5,), (1, 4, 1, 2)])
def test_a_traced_pair_rewrites_any_rank_dtype_and_operand_order(shape, dtype):
    rule = _silu_class()()
    x = _var(shape, dtype)
    before = from_expr(relax.op.sigmoid(x) * x)  # the operands swapped against the example
    after = pk.rewrite(rule, before)
    tvm.ir.assert_structural_equal(after, _silu_module(x))
    assert_same_numerics(before, after, rtol=2e-3 if dtype == "float16" else 1e-5,
                         atol=2e-3 if dtype == "float16" else 1e-5)


def test_a_by_example_rule_does_not_mutate_the_users_module():
    x = _var()
    before = from_expr(x * relax.op.sigmoid(x))
    text = before.script()
    pk.rewrite(_silu_class()(), before)
    assert before.script() == text


def test_the_parameter_must_be_the_same_expression_everywhere():
    x, y = _var(), _var(name="y")
    before = from_expr(x * relax.op.sigmoid(y))
    assert pk.rewrite(_silu_class()(), before).same_as(before)


def test_a_number_matches_in_any_float_dtype_within_its_rounding():
    cls = example_rule_class("half.scale", lambda x: x * relax.const(0.5, "float32"),
                             lambda x: x / relax.const(2.0, x.ty.dtype))
    for dtype in ("float16", "float64"):
        x = _var(dtype=dtype)
        after = pk.rewrite(cls(), from_expr(relax.const(0.5, dtype) * x))
        assert "R.divide" in after.script()
    x = _var()
    other = from_expr(x * relax.const(0.51, "float32"))
    assert pk.rewrite(cls(), other).same_as(other)


def test_the_replacement_must_have_the_type_of_what_it_replaces():
    cls = example_rule_class("half.scale", lambda x: x * relax.const(0.5, "float32"),
                             lambda x: x / relax.const(2.0, x.ty.dtype))
    x = _var(shape=(3,))
    before = from_expr(x * relax.const(np.full((1, 1, 1), 0.5, "float32")))
    log = pk.RewriteLog()
    after = pk.rewrite(cls(), before, log=log)
    assert after.same_as(before)
    (skip,) = log.skipped
    assert "fused gives" in skip.reason and "(1, 1, 3)" in skip.reason


def test_a_reduction_keeps_its_rank_and_axis_and_exact_constants_must_match():
    def written(x, eps=1e-5):
        mean = relax.op.mean(x, axis=[-1], keepdims=True)
        return (x - mean) / relax.op.sqrt(relax.op.variance(x, axis=[-1], keepdims=True) + eps)

    def fused(x, eps=1e-5):
        width = x.ty.shape[-1]
        dtype = x.ty.dtype
        return relax.op.nn.layer_norm(x, relax.op.ones((width,), dtype),
                                      relax.op.zeros((width,), dtype), axes=[-1],
                                      epsilon=1e-5)

    cls = example_rule_class("norm.plain", written, fused, exact=("eps",))
    rule = cls()
    text = rule.describe()
    assert "x: any tensor of rank 2" in text and "eps: a constant equal to" in text
    x = _var(shape=(4, 6))
    fires = from_expr(written(x, eps=relax.const(1e-5, "float32")))
    assert "R.nn.layer_norm" in pk.rewrite(rule, fires).script()
    other_eps = from_expr(written(x, eps=relax.const(1e-3, "float32")))
    log = pk.RewriteLog()
    assert pk.rewrite(rule, other_eps, log=log).same_as(other_eps)
    assert "the constant eps differs" in log.skipped[0].reason
    x3 = _var(shape=(2, 4, 6))
    rank3 = from_expr(written(x3, eps=relax.const(1e-5, "float32")))
    log = pk.RewriteLog()
    assert pk.rewrite(rule, rank3, log=log).same_as(rank3)
    assert "x has rank 3; the example's body needs rank 2" in log.skipped[0].reason
    other_axis = from_expr(x - relax.op.mean(x, axis=[0], keepdims=True))
    assert pk.rewrite(rule, other_axis).same_as(other_axis)


def test_a_dtype_outside_dtypes_is_refused_with_the_reason():
    cls = example_rule_class("silu.collapse", lambda x: x * relax.op.sigmoid(x),
                             lambda x: relax.op.nn.silu(x), dtypes=("float32",))
    x = _var(dtype="float16")
    log = pk.RewriteLog()
    before = from_expr(x * relax.op.sigmoid(x))
    assert pk.rewrite(cls(), before, log=log).same_as(before)
    assert log.skipped[0].reason == ("the result is float16; silu.collapse accepts float32 "
                                     "(dtypes=)")


def test_extra_commutative_operators_match_either_order():
    def written(x, y):
        return relax.op.maximum(x, relax.op.sigmoid(y))

    def fused(x, y):
        return relax.op.maximum(relax.op.sigmoid(y), x)

    plain = example_rule_class("max.plain", written, fused)
    swapped = example_rule_class("max.swapped", written, fused, commutative=("maximum",))
    x, y = _var(), _var(name="y")
    before = from_expr(relax.op.maximum(relax.op.sigmoid(y), x))
    assert pk.rewrite(plain(), before).same_as(before)
    assert "maximum: operands in either order" in swapped().describe()
    assert not pk.rewrite(swapped(rewrite_once=True), before).same_as(before)


def test_associative_products_match_in_every_grouping():
    def written(x):
        return relax.const(0.5, "float32") * x * relax.op.tanh(x)

    def fused(x):
        return x * relax.op.tanh(x) / relax.const(2.0, x.ty.dtype)

    cls = example_rule_class("half.tanh", written, fused, associative=True)
    x = _var()
    regrouped = from_expr(x * (relax.op.tanh(x) * relax.const(0.5, "float32")))
    assert not pk.rewrite(cls(), regrouped).same_as(regrouped)
    assert "products: in every grouping" in cls().describe()


def test_without_fused_the_rule_is_a_composite_of_that_name():
    cls = example_rule_class("silu", lambda x: x * relax.op.sigmoid(x))
    rule = cls()
    assert isinstance(rule, pk.CompositeRule) and rule.name == "byoc.silu"
    x = _var()
    merged = pk.MergeComposite([rule])(from_expr(x * relax.op.sigmoid(x)))
    assert '"Composite": "byoc.silu"' in merged.script()


def test_the_class_builds_the_rule_again_and_its_example_fires():
    cls = _silu_class()
    assert cls.__name__ == "SiluCollapse" and cls.__doc__
    rule = cls()
    space = rule.example_space()
    assert space["m"][1] == 1 and "float16" in space["dtype"]
    mod = rule.example(dtype="float16", m=1, n=3)
    assert [int(d) for d in mod["main"].params[0].ty.shape] == [1, 3]
    assert "R.nn.silu" in pk.rewrite(rule, mod).script()


@pytest.mark.parametrize("written, fused, message", [
    (lambda x: x, lambda x: relax.op.nn.silu(x),
     "nothing.rule: written returns its parameter 'x' unchanged: there is nothing to match"),
    (lambda x: relax.const(1.0, "float32"), lambda x: relax.op.nn.silu(x),
     "nothing.rule: written returns a constant: there is nothing to match"),
    (lambda x, y: x * y, lambda x: relax.op.nn.silu(x),
     "nothing.rule: written takes (x, y) but fused takes (x); both sides need the same "
     "parameters"),
    (lambda x: x * relax.op.sigmoid(x), "silu",
     "nothing.rule: fused must be a function with written's parameters (or None for a "
     "composite), found str 'silu'"),
    (lambda x: 3, lambda x: x, "nothing.rule: written returned int, not a Relax expression"),
    (lambda x: x.no_such, lambda x: x,
     "nothing.rule: calling written on Relax Vars raised AttributeError"),
])
def test_bad_input_is_a_one_line_pattern_error_naming_the_rule(written, fused, message):
    with pytest.raises(PatternError) as err:
        example_rule_class("nothing.rule", written, fused)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_one_graph_with_a_broadcast_site_and_a_plain_site_gets_each_its_own_verdict():
    cls = example_rule_class("half.scale", lambda x: x * relax.const(0.5, "float32"),
                             lambda x: x / relax.const(2.0, x.ty.dtype))
    rule = cls()
    x, y = _var(shape=(3,)), _var(shape=(3,), name="y")
    broadcast = x * relax.const(np.full((1, 1), 0.5, "float32"))
    plain = y * relax.const(0.5, "float32")
    for _ in range(2):  # the second time from the rule's remembered conclusions
        after = pk.rewrite(rule, from_expr(relax.op.add(broadcast, plain)))
        assert after.script().count("R.divide") == 1
        assert after.script().count("R.multiply") == 1
        log = pk.RewriteLog()
        pk.rewrite(rule, from_expr(broadcast), log=log)
        assert len(log.skipped) == 1 and "(1, 3)" in log.skipped[0].reason
    assert str(rule) == rule.describe()
