"""through(), up_to_cast() and products(): patterns that look past plumbing and casts, or
take a product in every grouping."""

from __future__ import annotations

import pytest
from tvm import relax

import patternkit as pk


def _var(name, shape=(2, 3), dtype="float32"):
    return relax.Var(name, relax.TensorType(shape, dtype))


def test_through_matches_the_plain_value_and_each_wrapper_up_to_the_depth():
    x, y = _var("x"), _var("y")
    k = pk.wildcard()
    pattern = pk.is_op("matmul")(pk.wildcard(), pk.dpl.through(k, ("reshape", "broadcast_to")))
    plain = relax.op.matmul(y, relax.op.permute_dims(x))
    reshaped = relax.op.matmul(y, relax.op.reshape(relax.op.permute_dims(x), (3, 2)))
    both = relax.op.matmul(y, relax.op.reshape(
        relax.op.broadcast_to(relax.op.permute_dims(x), (3, 2)), (3, 2)))
    for expr in (plain, reshaped, both):
        found = pk.dpl.find_match(pattern, expr)
        assert found is not None
        assert pk.ir.op_name(found.captures[k]) == "relax.permute_dims"  # unwrapped


def test_through_stops_at_its_depth_and_at_operators_it_was_not_given():
    x = _var("x")
    deep = relax.op.reshape(relax.op.reshape(relax.op.reshape(x, (3, 2)), (6,)), (2, 3))
    exp = pk.is_op("exp")(pk.wildcard())
    assert not pk.match(pk.dpl.through(pk.is_var("x"), ("reshape",), depth=2), deep)
    assert pk.match(pk.dpl.through(pk.is_var("x"), ("reshape",), depth=3), deep)
    assert not pk.match(pk.dpl.through(exp, ("reshape",)), relax.op.permute_dims(relax.op.exp(x)))


def test_through_refuses_nonsense_arguments():
    with pytest.raises(pk.PatternError, match="depth"):
        pk.dpl.through(pk.wildcard(), depth=-1)
    with pytest.raises(pk.PatternError, match="at least one operator"):
        pk.dpl.through(pk.wildcard(), ())
    with pytest.raises(pk.PatternError, match="unknown operator"):
        pk.dpl.through(pk.wildcard(), ("reshapee",))


def test_up_to_cast_sees_the_value_before_a_cast():
    x = _var("x", dtype="float16")
    inner = pk.is_op("exp")(pk.wildcard())
    pattern = pk.is_op("sqrt")(pk.dpl.up_to_cast(inner))
    assert pk.match(pattern, relax.op.sqrt(relax.op.astype(relax.op.exp(x), "float32")))
    assert pk.match(pattern, relax.op.sqrt(relax.op.exp(x)))
    assert not pk.match(pattern, relax.op.sqrt(relax.op.astype(x, "float32")))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_square_matches_every_spelling_of_a_square_in_any_float_dtype(dtype):
    x = _var("x", dtype=dtype)
    pattern = pk.dpl.square(pk.is_var("x"))
    for spelling in (relax.op.power(x, relax.const(2.0, dtype)), relax.op.multiply(x, x),
                     relax.op.square(x)):
        assert pk.match(pattern, spelling), spelling


def test_square_does_not_match_other_products_or_powers():
    x, y = _var("x"), _var("y")
    pattern = pk.dpl.square(pk.wildcard())
    assert not pk.match(pattern, relax.op.multiply(x, y))  # both operands one value
    assert not pk.match(pattern, relax.op.power(x, relax.const(3.0, "float32")))


def test_square_takes_an_exponent_of_exactly_two_in_any_dtype():
    import numpy as np

    x = _var("x")
    pattern = pk.dpl.square(pk.is_var("x"))
    assert pk.match(pattern, relax.op.power(x, relax.const(2.0, "float32")))
    half = _var("h", dtype="float16")
    assert pk.match(pk.dpl.square(pk.is_var("h")),
                    relax.op.power(half, relax.const(2.0, "float16")))
    # one ulp above 2: NaN wherever x < 0, so not a square
    above = float(np.nextafter(np.float32(2.0), np.float32(3.0)))
    assert not pk.match(pattern, relax.op.power(x, relax.const(above, "float32")))


def test_divide_by_sqrt_matches_rsqrt_either_side_and_sqrt_as_divisor():
    x, v = _var("x"), _var("v", (2, 1))
    pattern = pk.dpl.divide_by_sqrt(pk.is_var("x"), pk.is_var("v"))
    reciprocal = relax.op.divide(relax.const(1.0, "float32"), relax.op.sqrt(v))
    for spelling in (x * relax.op.rsqrt(v), relax.op.rsqrt(v) * x, x / relax.op.sqrt(v),
                     x * reciprocal, reciprocal * x):  # the last two: ONNX's Reciprocal
        assert pk.match(pattern, spelling), spelling
    two_over = relax.op.divide(relax.const(2.0, "float32"), relax.op.sqrt(v))
    assert not pk.match(pattern, x * two_over)
    assert not pk.match(pattern, x / relax.op.rsqrt(v))  # multiplies by sqrt(v)
    assert not pk.match(pattern, relax.op.sqrt(v) / x)


def test_products_matches_every_grouping_and_order_of_its_factors():
    a, b, c = _var("a"), _var("b"), _var("c")
    pattern = pk.dpl.products(pk.is_var("a"), pk.is_var("b"), pk.is_var("c"))
    for expr in ((a * b) * c, a * (c * b), (c * a) * b, b * (a * c), (b * c) * a):
        assert pk.match(pattern, expr), expr
    assert not pk.match(pattern, a * b)
    assert not pk.match(pattern, (a + b) * c)


def test_products_with_a_repeated_factor_needs_the_same_value_there():
    x, y = _var("x"), _var("y")
    x_pattern = pk.wildcard()
    cubed = pk.dpl.products(x_pattern, x_pattern, x_pattern)
    assert pk.match(cubed, (x * x) * x) and pk.match(cubed, x * (x * x))
    assert not pk.match(cubed, (x * y) * x)
    with pytest.raises(ValueError, match="at least one factor"):
        pk.dpl.products()
