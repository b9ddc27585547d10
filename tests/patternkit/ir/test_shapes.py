"""ir/shapes.py: symbolic side conditions proved with their reason, trailing axes,
per-feature parameters and symbolic dimension comparison."""

from __future__ import annotations

import pytest
import tvm

from patternkit.ir import (
    NotPerChannel,
    NotPerFeature,
    NotTrailing,
    dims_equal,
    per_channel_axis,
    per_feature_shape,
    prove_equal,
    same_shape,
    trailing_axes,
)

n, c = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("c", "int64")


def test_equal_dimensions_are_proved_for_every_value_of_their_variables():
    assert prove_equal(4, 4) and not prove_equal(4, 3)
    assert prove_equal(c, c)
    assert prove_equal(c * 2, c + c)
    assert not prove_equal(c, n)  # may be equal, is not provably
    assert not prove_equal(c, 3)


def test_shapes_are_the_same_only_when_every_dimension_is_proved():
    assert same_shape((n, c, 4), (n, c, 4))
    assert not same_shape((n, c, 4), (n, n, 4))
    assert not same_shape((n, 4), (n, 4, 1))
    assert not same_shape(None, (1,))


def test_a_symbolic_channel_count_is_per_channel_when_it_is_provably_x_s():
    assert per_channel_axis((c, 1, 1), (n, c, 4, 4)) == 1
    assert per_channel_axis((1, c, 1, 1), (n, c, 4, 4)) == 1


def test_an_unproved_condition_is_named_in_the_reason():
    with pytest.raises(NotPerChannel, match=r"cannot prove 3 == c"):
        per_channel_axis((3, 1, 1), (n, c, 4, 4), name="gamma")
    with pytest.raises(NotPerChannel, match=r"exactly one axis"):
        per_channel_axis((c, 1, n), (n, c, 4, 4), name="gamma")


def test_a_dimension_that_might_be_one_does_not_count_as_one():
    # (c, 1, 1) against (n, 4, 4, 4): c might be 1, might be 4 -- refused, not guessed
    with pytest.raises(NotPerChannel):
        per_channel_axis((c, 1, 1), (n, 4, 4, 4))



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
