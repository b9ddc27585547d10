"""ir/shapes.py: trailing axes, per-feature parameters and symbolic dimension comparison."""

from __future__ import annotations

import pytest
import tvm

from patternkit.ir import (NotPerFeature, NotTrailing, dims_equal, per_feature_shape,
                           trailing_axes)

N, M = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")


@pytest.mark.parametrize("a, b, expected", [
    (16, 16, True), (16, 8, False), (N, N, True), (N * 2, N + N, True), (N + 1, N, False),
    (N, 16, None), (N, M, None),
], ids=["ints_equal", "ints_differ", "same_var", "n2_is_n_plus_n", "n_plus_1", "var_vs_int",
        "two_vars"])
def test_dims_equal_decides_what_it_can_and_says_none_otherwise(a, b, expected):
    assert dims_equal(a, b) is expected


@pytest.mark.parametrize("axes, ndim, k", [(None, 3, 3), ([-1], 3, 1), ([2], 3, 1),
                                           ([1, 2], 3, 2), ([-1, -2], 4, 2)])
def test_trailing_axes_counts_the_last_axes_a_reduction_names(axes, ndim, k):
    assert trailing_axes(axes, ndim) == k


@pytest.mark.parametrize("axes, message", [
    ([0], "reduces the axes [0] of a rank-3 x, not its last 1"),
    ([0, 2], "not its last 2"),
    ([-1, 2], "expected distinct axes"),
    ([3], "reduces axis 3, which a rank-3 x does not have"),
])
def test_trailing_axes_refuses_other_axes_and_says_which(axes, message):
    with pytest.raises(NotTrailing, match=message.replace("[", r"\[").replace("]", r"\]")):
        trailing_axes(axes, 3)


@pytest.mark.parametrize("shape, features", [((16,), (16,)), ((1, 1, 16), (16,)),
                                             ((5, 16), (5, 16))])
def test_per_feature_shape_drops_leading_unit_dims(shape, features):
    k = len(features)
    assert per_feature_shape(shape, (2, 5, 16), k) == features


def test_per_feature_shape_compares_symbolic_dims():
    assert per_feature_shape((N,), (2, 5, N), 1) == (N,)
    with pytest.raises(NotPerFeature, match="cannot decide whether its dim m equals the "
                                            "normalised dim n"):
        per_feature_shape((M,), (2, 5, N), 1)
    with pytest.raises(NotPerFeature, match="cannot decide whether its leading dim n is 1"):
        per_feature_shape((N, 16), (2, 5, 16), 1)


@pytest.mark.parametrize("shape, message", [
    (None, "has no known shape"),
    ((), "must cover the normalised dims (16,)"),
    ((5, 16), "varies along more than the normalised dims (16,)"),
    ((8,), "must equal the normalised dims (16,)"),
    ((1, 1, 1, 16), "more dimensions (4) than x (3)"),
])
def test_per_feature_shape_refuses_parameters_that_are_not_per_feature(shape, message):
    with pytest.raises(NotPerFeature) as err:
        per_feature_shape(shape, (2, 5, 16), 1, name="gamma")
    assert message in str(err.value)
