"""Dtypes as numbers: how coarsely a floating dtype rounds.

Tolerances (:mod:`patternkit.engine.tolerance`) and differential checks
(:mod:`patternkit.verification.differential`) both need to know which dtype of a module
rounds most coarsely; numpy knows ``float16/32/64`` but not ``bfloat16``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

import numpy as np

__all__ = ["is_float_dtype", "machine_epsilon", "coarsest_float", "round_trips_wider",
           "HALF_WIDENINGS"]

#: (exponent bits, significand bits) of the float dtypes a model may compute a step in
#: between casts: a dtype holds every value of another only when it has at least as many of
#: both (float16 and bfloat16 have the same width but neither holds the other's values).
_FLOAT_FIELDS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}

#: The dtype a model may widen each half-precision float to for a reduction (a softmax's
#: max and sum, attention's softmax over its scores): float32 holds every float16 and
#: bfloat16 value exactly, and it is the precision TVM's kernels (R.nn.softmax,
#: R.nn.attention) keep a half-precision softmax in.  Any other widening (a float32
#: model's reduction in float64) is a precision a collapse would not reproduce.
HALF_WIDENINGS: Mapping[str, str] = MappingProxyType({"float16": "float32",
                                                      "bfloat16": "float32"})


def is_float_dtype(dtype: str | None) -> bool:
    """Is ``dtype`` a floating dtype (``float16/32/64``, ``bfloat16``, float8 variants)?"""
    return dtype is not None and str(dtype).startswith(("float", "bfloat"))


def machine_epsilon(dtype: str | None) -> float | None:
    """The spacing of a floating dtype at 1.0 (``None`` for other or unknown dtypes)."""
    if dtype is None:
        return None
    dtype = str(dtype)
    if dtype == "bfloat16":  # 8 significand bits
        return 2.0 ** -7
    if not dtype.startswith("float"):
        return None
    try:
        return float(np.finfo(np.dtype(dtype)).eps)
    except TypeError:  # a float dtype numpy does not know (float8 variants...)
        return None


def coarsest_float(dtypes: Iterable[str | None]) -> str | None:
    """The floating dtype among ``dtypes`` with the largest epsilon (``None``: none)."""
    floats = [(machine_epsilon(d), str(d)) for d in dtypes if machine_epsilon(d) is not None]
    return max(floats)[1] if floats else None


def round_trips_wider(start: str, inner: str, back: str) -> bool:
    """Is ``start -> inner -> back`` a cast round trip through a float at least as wide?

    How exporters write a half-precision step computed wider (a softplus, an activation
    in float32 between casts of float16 values): the step's result is ``start``'s dtype
    again and was computed in a dtype that holds every ``start`` value exactly (at least
    as many exponent and significand bits: ``bfloat16 -> float16`` would overflow past
    65504 and ``float16 -> bfloat16`` drops three significand bits).  An unknown dtype on
    either side never passes.
    """
    if back != start or start not in _FLOAT_FIELDS or inner not in _FLOAT_FIELDS:
        return False
    (start_exponent, start_significand), (inner_exponent, inner_significand) = (
        _FLOAT_FIELDS[start], _FLOAT_FIELDS[inner])
    return inner_exponent >= start_exponent and inner_significand >= start_significand
