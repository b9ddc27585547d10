"""Dtypes as numbers: which cast round trips keep every value (the Mish / gated-MLP guards)."""

import numpy as np
import pytest

from patternkit.ir import round_trips_wider


@pytest.mark.parametrize(("start", "inner"), [
    ("float16", "float16"), ("float16", "float32"), ("float16", "float64"),
    ("bfloat16", "float32"), ("bfloat16", "bfloat16"), ("float32", "float64"),
])
def test_a_wider_or_equal_inner_dtype_round_trips(start, inner):
    assert round_trips_wider(start, inner, start)


@pytest.mark.parametrize(("start", "inner"), [
    ("float32", "float16"), ("float32", "bfloat16"),
    ("float16", "bfloat16"),   # bfloat16 has 7 significand bits to float16's 10
    ("bfloat16", "float16"),   # float16 overflows past 65504, bfloat16 reaches 3e38
    ("float16", "int32"), ("weird", "float32"), ("float16", "unknown"),
])
def test_a_narrower_or_unknown_inner_dtype_does_not(start, inner):
    assert not round_trips_wider(start, inner, start)


def test_a_trip_that_does_not_come_back_to_the_start_dtype_does_not():
    assert not round_trips_wider("float16", "float32", "bfloat16")


def test_the_float16_bfloat16_refusals_are_real_value_losses():
    """Why the two half dtypes are not interchangeable: each loses values of the other."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    big = np.array([70000.0], dtype=ml_dtypes.bfloat16)
    assert not np.isfinite(big.astype(np.float16)).all()
    fine = np.array([1.0 + 2.0 ** -10], dtype=np.float16)
    assert fine.astype(ml_dtypes.bfloat16).astype(np.float16)[0] != fine[0]
