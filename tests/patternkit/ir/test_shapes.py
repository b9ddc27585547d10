"""Shape side conditions: decided for symbolic shapes by TVM's analyzer, with the reason."""

from __future__ import annotations

import pytest
import tvm

from patternkit.ir import NotPerChannel, per_channel_axis, prove_equal, same_shape

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
