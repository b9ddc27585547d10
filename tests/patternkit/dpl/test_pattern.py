"""The pattern language: Relay's names and matching behaviour on Relax."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.dpl.pattern import pattern_to_text


def test_is_op_accepts_relay_and_relax_names():
    assert pk.is_op("nn.conv2d").expr.same_as(tvm.ir.Op.get("relax.nn.conv2d"))
    assert pk.is_op("relax.add").expr.same_as(pk.is_op("add").expr)
    assert pk.is_op("nn.leaky_relu").expr.name == "relax.nn.leakyrelu"
    assert pk.is_op("concatenate").expr.name == "relax.concat"


def test_is_op_rejects_unknown_names_with_a_suggestion():
    with pytest.raises(pk.PatternError, match="did you mean relax.nn.conv2d"):
        pk.is_op("nn.conv2dd")
    with pytest.raises(pk.PatternError, match="no Relax equivalent"):
        pk.is_op("nn.bias_add")


def test_relay_batch_matmul_is_refused_since_it_transposed_its_second_operand():
    # Relay's nn.batch_matmul defaulted to transpose_b=True; relax.matmul never transposes,
    # so the same name in a ported rule would read the other layout, silently
    with pytest.raises(pk.PatternError, match=r"no Relax equivalent.*transpose_b=True"):
        pk.is_op("nn.batch_matmul")


@pytest.mark.parametrize("relay, hint", [("nn.global_avg_pool2d", "nn.adaptive_avg_pool2d"),
                                         ("nn.upsampling", "image.resize2d")])
def test_relay_operators_relax_spells_otherwise_name_what_to_write(relay, hint):
    with pytest.raises(pk.PatternError, match=f"no Relax equivalent; use relax.{hint}"):
        pk.is_op(relay)


def test_arithmetic_operators_build_calls(make_var):
    a, b = pk.wildcard(), pk.wildcard()
    assert pattern_to_text(a * b + a / b - a) == "subtract(add(multiply(*, *), divide(*, *)), *)"
    x, y = make_var("x", (2, 3)), make_var("y", (2, 3))
    assert pk.match(a + b, relax.op.add(x, y))
    assert not pk.match(a + b, relax.op.subtract(x, y))


def test_add_and_multiply_are_commutative_subtract_is_not(make_var):
    x, y = make_var("x", (2, 3)), make_var("y", (2, 3))
    for op in (relax.op.add, relax.op.multiply):
        assert pk.match(pk.is_var("x") + pk.is_var("y") if op is relax.op.add
                        else pk.is_var("x") * pk.is_var("y"), op(y, x))
    assert pk.match(pk.is_var("x") - pk.is_var("y"), relax.op.subtract(x, y))
    assert not pk.match(pk.is_var("x") - pk.is_var("y"), relax.op.subtract(y, x))


def test_divide_multiply_reassociation_matches_like_relay(make_var):
    g, s, q = (make_var(n, (3,)) for n in "gsq")
    pattern = pk.is_var("g") * pk.is_var("s") / pk.is_var("q")
    assert pk.match(pattern, relax.op.multiply(g, relax.op.divide(s, q)))   # g * (s / q)
    assert pk.match(pattern, relax.op.multiply(relax.op.divide(g, q), s))   # g / q * s
    assert not pk.match(pattern, relax.op.divide(g, relax.op.multiply(s, q)))
    reverse = pk.is_var("g") * (pk.is_var("s") / pk.is_var("q"))
    assert pk.match(reverse, relax.op.divide(relax.op.multiply(g, s), q))


def test_match_looks_through_bindings_of_a_function(make_var):
    x = make_var("x", (2, 3))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            out = bb.emit_output(relax.op.nn.relu(a))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    pattern = pk.is_op("nn.relu")(pk.is_op("exp")(pk.wildcard()))
    relu_value = func.body.blocks[0].bindings[1].value
    assert not pk.match(pattern, relu_value)           # without the function: no look-through
    assert pk.match(pattern, relu_value, func)          # the value of a binding
    assert pk.match(pattern, out, func)                 # or the bound Var itself


def test_diamond_requires_the_same_expression(make_var):
    x, y = make_var("x", (2, 3)), make_var("y", (2, 3))
    shared = pk.wildcard()
    pattern = pk.is_op("add")(shared, shared)
    assert pk.match(pattern, relax.op.add(x, x))
    assert not pk.match(pattern, relax.op.add(x, y))


def test_optional_and_alternatives(make_var):
    x, w = make_var("x", (1, 3, 8, 8)), make_var("w", (4, 3, 3, 3))
    conv = pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())
    maybe_relu = conv.optional(lambda p: pk.is_op("nn.relu")(p))
    c = relax.op.nn.conv2d(x, w)
    assert pk.match(maybe_relu, c)
    assert pk.match(maybe_relu, relax.op.nn.relu(c))
    assert not pk.match(maybe_relu, relax.op.nn.gelu(c))
    act = pk.is_op("nn.relu") | pk.is_op("nn.gelu")
    assert pk.match(act(conv), relax.op.nn.gelu(c))


def test_constants_variables_and_expressions(make_var):
    x = make_var("x", (3,))
    one = relax.const(np.ones(3, "float32"))
    assert pk.match(pk.wildcard() + pk.is_constant(), relax.op.add(x, one))
    assert not pk.match(pk.wildcard() + pk.is_constant(), relax.op.add(x, x))
    assert pk.match(pk.is_var("x") + pk.is_expr(relax.const(np.ones(3, "float32"))),
                    relax.op.add(x, one))
    assert not pk.match(pk.is_var("y") + pk.wildcard(), relax.op.add(x, one))


def test_is_var_does_not_match_an_intermediate_result(make_var):
    x = make_var("x", (2, 3))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            out = bb.emit_output(relax.op.nn.relu(a))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    assert pk.match(pk.is_op("nn.relu")(pk.wildcard()), out, func)
    assert not pk.match(pk.is_op("nn.relu")(pk.is_var()), out, func)


def test_tuple_patterns_with_any_arity_and_any_index(make_var):
    a, b, c = (make_var(n, (2,)) for n in "abc")
    tup = relax.Tuple([a, b, c])
    assert pk.match(pk.is_tuple(None), tup)
    assert pk.match(pk.is_tuple([pk.wildcard(), pk.wildcard(), pk.wildcard()]), tup)
    shared = pk.wildcard()  # one object three times means "the same expression"
    assert not pk.match(pk.is_tuple([shared, shared, shared]), tup)
    assert not pk.match(pk.is_tuple([pk.wildcard(), pk.wildcard()]), tup)
    item = relax.TupleGetItem(tup, 2)
    assert pk.match(pk.is_tuple_get_item(pk.is_tuple(None)), item)
    assert pk.match(pk.is_tuple_get_item(pk.wildcard(), -1), item)
    assert not pk.match(pk.is_tuple_get_item(pk.wildcard(), 0), item)
    concat = pk.is_op("concatenate")(pk.is_tuple(None))
    assert pk.match(concat, relax.op.concat([a, b], axis=0))


def test_attribute_dtype_shape_and_type_constraints(make_var):
    x, w = make_var("x", (1, 3, 8, 8)), make_var("w", (4, 3, 3, 3))
    conv = relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1])
    cp = pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())
    assert pk.match(cp.has_attr({"data_layout": "NCHW", "padding": [1, 1, 1, 1]}), conv)
    assert not pk.match(cp.has_attr({"data_layout": "NHWC"}), conv)
    cast = relax.op.astype(x, "float16")
    assert pk.match(pk.is_op("cast")(pk.wildcard()).has_attr({"dtype": "float16"}), cast)
    assert pk.match(pk.dpl.has_dtype("float16"), cast)
    assert not pk.match(pk.dpl.has_dtype("float32"), cast)
    assert pk.match(pk.dpl.has_shape([1, 4, 8, 8]), conv)
    assert not pk.match(pk.dpl.has_shape([1, 4, 8, 9]), conv)
    assert pk.match(pk.dpl.has_type(relax.TensorType((1, 4, 8, 8), "float32")), conv)
    assert pk.match(pk.dpl.has_type(relax.TensorType(ndim=4, dtype="float32")), conv)
    assert not pk.match(pk.dpl.has_type(relax.TensorType(ndim=3, dtype="float32")), conv)


def test_call_with_any_arguments(make_var):
    a, b = make_var("a", (2,)), make_var("b", (2,))
    assert pk.match(pk.is_op("add")(None), relax.op.add(a, b))
    assert pk.match(pk.wildcard()(None), relax.op.add(a, b))
    assert pk.match(pk.is_op("add")(pk.is_var("a"), varg_default_wildcard=True),
                    relax.op.add(a, b))


def test_non_patterns_are_rejected_clearly():
    with pytest.raises(pk.PatternError, match="expected a pattern"):
        pk.is_op("add")(pk.wildcard(), "x")
    with pytest.raises(pk.PatternError, match="tvm.relax.dpl pattern"):
        pk.is_op("add")(pk.wildcard(), relax.dpl.wildcard())


def test_to_dpl_gives_an_equivalent_tvm_pattern(make_var):
    x, w = make_var("x", (1, 3, 8, 8)), make_var("w", (4, 3, 3, 3))
    conv = relax.op.nn.conv2d(x, w)
    pattern = pk.is_op("nn.relu")(pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard()))
    dpl = pattern.to_dpl()
    assert isinstance(dpl, relax.dpl.DFPattern)
    assert dpl.match(relax.op.nn.relu(conv))
    assert not dpl.match(relax.op.nn.gelu(conv))
    with pytest.raises(pk.PatternError, match="no tvm.relax.dpl equivalent"):
        pk.is_tuple(None).to_dpl()


def test_explain_points_at_the_deepest_mismatch(make_var, make_bn):
    x = make_var("x", (2, 3, 4, 4))
    g, b, m, v = (make_var(n, (3, 1, 1)) for n in ("gamma", "beta", "mean", "var"))
    minus_beta = g * (x - m) / relax.op.sqrt(v + relax.const(1e-5, "float32")) - b
    pattern = (pk.wildcard() * (pk.wildcard() - pk.wildcard())
               / pk.is_op("sqrt")(pk.wildcard() + pk.is_constant()) + pk.wildcard())
    assert pk.explain(pattern, make_bn(x, g, b, m, v)) == "matched"
    why = pk.explain(pattern, minus_beta)
    assert why.startswith("no match: add") and "R.subtract" in why
    eps_var = make_var("eps", ())
    variable_eps = g * (x - m) / relax.op.sqrt(v + eps_var) + b
    assert "const (depth" in pk.explain(pattern, variable_eps)


# ------------------------------------------------------------- numbers in patterns
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_number_in_a_pattern_matches_that_constant_in_any_float_dtype(dtype):
    x = relax.Var("x", relax.TensorType((2, 3), dtype))
    expr = relax.op.multiply(x, relax.const(0.044715, dtype))  # rounded to the dtype
    assert pk.match(pk.wildcard() * 0.044715, expr)
    assert not pk.match(pk.wildcard() * 0.05, expr)


def test_a_number_matches_prim_values_integers_and_one_element_tensors():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    assert pk.match(pk.is_op("power")(pk.wildcard(), 3), relax.op.power(x, relax.const(3.0)))
    assert pk.match(pk.is_op("power")(pk.wildcard(), 3),
                    relax.op.power(x, relax.const(np.full((1, 1), 3.0, "float32"))))
    assert not pk.match(pk.is_op("power")(pk.wildcard(), 3),
                        relax.op.power(x, relax.const(np.full((2, 3), 3.0, "float32"))))
    assert pk.match(pk.is_scalar(2), relax.const(2, "int64"))
    assert not pk.match(pk.is_scalar(2.5), relax.const(2, "int64"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_an_infinity_matches_the_same_infinity_only(dtype):
    # a mask's -inf: |inf - inf| is NaN, which no tolerance admits
    x = relax.Var("x", relax.TensorType((2,), dtype))
    minus_inf = relax.op.equal(x, relax.const(-np.inf, dtype))
    assert pk.match(pk.is_op("equal")(pk.wildcard(), float("-inf")), minus_inf)
    assert not pk.match(pk.is_op("equal")(pk.wildcard(), float("inf")), minus_inf)
    assert not pk.match(pk.is_op("equal")(pk.wildcard(), -65504.0), minus_inf)
    assert not pk.match(pk.is_op("equal")(pk.wildcard(), float("-inf")),
                        relax.op.equal(x, relax.const(-65504.0, dtype)))
    with pytest.raises(pk.PatternError, match="NaN"):
        pk.is_scalar(float("nan"))


def test_a_scalar_tolerance_can_be_widened_explicitly_and_is_shown_in_explanations():
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    expr = relax.op.multiply(x, relax.const(1.702, "float32"))
    assert not pk.match(pk.wildcard() * 1.7, expr)
    assert pk.match(pk.wildcard() * pk.is_scalar(1.7, rtol=2e-3), expr)
    assert "const(1.7)" in pk.explain(pk.wildcard() * 1.7, expr)
    with pytest.raises(pk.PatternError, match="non-negative"):
        pk.is_scalar(1.0, rtol=-1)


def test_required_op_names_lists_the_operators_every_match_calls():
    from patternkit.dpl.pattern import required_op_names

    x = pk.wildcard()
    silu = x * pk.is_op("sigmoid")(x)
    required = required_op_names(silu)
    assert frozenset({"relax.sigmoid"}) in required
    # multiply and divide re-associate, so a requirement on one is met by either
    assert frozenset({"relax.multiply", "relax.divide"}) in required


def test_optional_parts_of_a_pattern_require_no_operator():
    from patternkit.dpl.pattern import may_occur, required_op_names

    x = pk.wildcard()
    optional = pk.is_op("exp")(pk.dpl.through(x) | pk.is_op("sqrt")(x))
    required = required_op_names(optional)
    assert required == (frozenset({"relax.exp"}),)
    assert may_occur(required, {"relax.exp": []})
    assert not may_occur(required, {"relax.sqrt": []})


def test_an_alternative_requires_one_operator_of_each_side():
    from patternkit.dpl.pattern import required_op_names

    x = pk.wildcard()
    either = pk.is_op("sqrt")(pk.is_op("exp")(x)) | pk.is_op("rsqrt")(pk.is_op("exp")(x))
    assert set(required_op_names(either)) == {frozenset({"relax.sqrt", "relax.rsqrt"}),
                                              frozenset({"relax.exp"})}


def test_a_requirement_both_alternatives_share_survives_their_product():
    # Each side requires eight operators one by one: joined pairwise, 64 sets, of which
    # at most 32 are kept.  The one both sides share (sum) is the most telling and must
    # be among them, whatever order strings hash in.
    from patternkit.dpl.pattern import required_op_names

    def chain(ops):
        pattern = pk.is_op("sum")(pk.wildcard())
        for op in ops:
            pattern = pk.is_op(op)(pattern)
        return pattern

    either = (chain(("exp", "log", "sqrt", "tanh", "sin", "cos", "abs"))
              | chain(("floor", "ceil", "round", "sign", "negative", "sigmoid", "erf")))
    required = required_op_names(either)
    assert frozenset({"relax.sum"}) in required
    assert all(len(s) <= 2 for s in required)


_REQUIREMENTS_OF_THE_LIBRARY = """
from patternkit.dpl import DFPattern
from patternkit.dpl.pattern import required_op_names
from patternkit.patterns import LIBRARY
print(sorted((rule.name, sorted(sorted(s) for s in required_op_names(rule.pattern)))
             for rule in LIBRARY if isinstance(getattr(rule, "pattern", None), DFPattern)))
"""


def test_the_library_requires_the_same_operators_in_every_process():
    # Which rules a model's run tries follows from these sets: they once depended on the
    # order strings hash in, so a run tried attention.cosine on GPT-2 in one process in
    # six (5-7 ms spent on a rule that cannot fire there).
    import os
    import subprocess
    import sys

    outputs = {subprocess.run([sys.executable, "-c", _REQUIREMENTS_OF_THE_LIBRARY],
                              env={**os.environ, "PYTHONHASHSEED": seed}, check=True,
                              capture_output=True, text=True, timeout=300).stdout
               for seed in ("1", "8")}
    assert len(outputs) == 1
    assert "relax.sum" in outputs.pop()
