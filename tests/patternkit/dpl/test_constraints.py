"""Constraint patterns: attribute, dtype, shape and type tests on what a pattern matched."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.dpl.constraints import (
    attrs_match,
    check_constraint,
    shape_matches,
    to_python,
    type_matches,
)


def tensor(name, shape, dtype="float32"):
    return relax.Var(name, relax.TensorType(shape, dtype))


@pytest.fixture
def conv():
    x, w = tensor("x", (1, 3, 8, 8)), tensor("w", (4, 3, 3, 3))
    return relax.op.nn.conv2d(x, w, strides=(2, 2), padding=(1, 1))


def test_to_python_turns_tvm_attribute_values_into_plain_values(conv):
    assert to_python(conv.attrs.strides) == [2, 2]
    assert to_python(conv.attrs.data_layout) == "NCHW"
    assert to_python(tvm.DataType("float16")) == "float16"
    assert to_python(tvm.tirx.FloatImm("float32", 0.5)) == 0.5
    assert to_python({"k": tvm.tirx.IntImm("int64", 3)}) == {"k": 3}


def test_attrs_match_compares_arrays_with_lists_and_names_every_attribute(conv):
    assert attrs_match(conv, {"strides": [2, 2], "padding": (1, 1, 1, 1)})
    assert not attrs_match(conv, {"strides": [1, 1]})
    assert not attrs_match(conv, {"no_such_attribute": 1})


def test_attrs_match_compares_booleans_by_truth():
    x = tensor("x", (2, 3))
    summed = relax.op.sum(x, axis=[1], keepdims=True)
    assert attrs_match(summed, {"keepdims": True}) and attrs_match(summed, {"keepdims": 1})
    assert not attrs_match(summed, {"keepdims": False})


def test_attrs_match_reads_operator_attributes_and_misses_unknown_ones():
    add = tvm.ir.Op.get("relax.add")
    assert attrs_match(add, {"FPurity": True})
    assert not attrs_match(add, {"NoSuchOperatorAttribute": 1})


def test_shape_matches_ints_by_value_and_symbolic_dims_by_name():
    n = tvm.tirx.Var("n", "int64")
    assert shape_matches((1, 3), [1, 3])
    assert not shape_matches((1, 3), [1, 4])
    assert not shape_matches((1, 3), [1, 3, 1])
    assert shape_matches((n, 3), ["n", 3])
    assert not shape_matches(None, [1])


def test_type_matches_ignores_what_the_expected_type_leaves_unknown():
    actual = relax.TensorType((2, 3), "float32")
    assert type_matches(actual, relax.TensorType((2, 3), "float32"))
    assert type_matches(actual, relax.TensorType(ndim=2, dtype="float32"))
    assert type_matches(actual, relax.TensorType(ndim=-1, dtype="float32"))
    assert type_matches(actual, relax.TensorType(ndim=2, dtype=""))  # any dtype
    assert not type_matches(actual, relax.TensorType(ndim=3, dtype="float32"))
    assert not type_matches(actual, relax.TensorType((2, 3), "float16"))
    assert not type_matches(actual, relax.TensorType((3, 2), "float32"))


def test_type_matches_a_python_class_and_tuples_field_by_field():
    tensor_ty = relax.TensorType((2,), "float32")
    assert type_matches(tensor_ty, relax.TensorType)
    assert not type_matches(tensor_ty, relax.TupleType)
    pair = relax.TupleType([tensor_ty, relax.TensorType((4,), "int32")])
    any_vector = relax.TensorType(ndim=1, dtype="")
    assert type_matches(pair, relax.TupleType([any_vector, any_vector]))
    assert not type_matches(pair, relax.TupleType([tensor_ty]))
    assert type_matches(relax.ShapeType([2]), relax.ShapeType([2]))
    assert not type_matches(relax.ShapeType([2]), relax.ShapeType([3]))


def test_check_constraint_answers_for_each_constraint_pattern(conv):
    inner = pk.wildcard()
    assert check_constraint(inner.has_attr({"strides": [2, 2]}), conv)
    assert check_constraint(inner.has_dtype("float32"), conv)
    assert not check_constraint(inner.has_dtype("float16"), conv)
    assert check_constraint(inner.has_shape([1, 4, 4, 4]), conv)
    assert not check_constraint(inner.has_shape([1, 4, 8, 8]), conv)
    assert check_constraint(inner.has_type(relax.TensorType(ndim=4, dtype="float32")), conv)
    assert not check_constraint(inner, conv)  # not a constraint pattern
