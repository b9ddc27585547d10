"""The view algebra of attention's operands (``patterns/attention/layout.py``).

The check of ``attention.collapse`` compares every operand's shape with these helpers;
their fast paths for static dims must answer as the analyzer does for symbolic ones.
"""

from __future__ import annotations

import pytest
from tvm import tirx

from patternkit.patterns.attention.layout import (
    HEADS_FIRST,
    IDENTITY,
    KEY_FROM_TRANSPOSED,
    KEY_TRANSPOSED,
    compose,
    is_view,
    permuted,
)

N = tirx.Var("n", "int64")


def test_compose_and_permuted_follow_permute_dims():
    assert compose(IDENTITY, HEADS_FIRST) == HEADS_FIRST
    assert compose(HEADS_FIRST, HEADS_FIRST) == IDENTITY
    assert compose(KEY_TRANSPOSED, KEY_FROM_TRANSPOSED) == IDENTITY
    assert compose((0, 2, 1), (0, 2, 1)) == (0, 1, 2)  # not 4-D: the general path
    assert compose(IDENTITY, (-1, 0, 1, 2)) == (3, 0, 1, 2)  # negative axes index from the end
    assert permuted((2, 8, 4, 16), HEADS_FIRST) == (2, 4, 8, 16)
    assert permuted([2, N, 4, 16], KEY_TRANSPOSED)[3] is N


@pytest.mark.parametrize("shape, view, merged, expected", [
    ((2, 8, 4, 16), (2, 8, 4, 16), True, True),
    ((2, 8, 4, 16), (2, 8, 16, 4), True, False),
    ([2, 8, 4, 16], (2, 8, 4, 16), True, True),  # a list compares by its dims
    ((16, 4, 16), (2, 8, 4, 16), True, True),  # batch and heads merged
    ((16, 4, 16), (2, 8, 4, 16), False, False),
    ((2, 8, 4), (2, 8, 4, 16), True, False),
    (None, (2, 8, 4, 16), True, False),
    ((N, 8, 4, 16), (N, 8, 4, 16), True, True),  # symbolic: proved equal
    ((N, 8, 4, 16), (2, 8, 4, 16), True, False),  # n might not be 2
    ((N * 8, 4, 16), (N, 8, 4, 16), True, True),
])
def test_is_view_static_and_symbolic(shape, view, merged, expected):
    assert is_view(shape, view, merged=merged) is expected
