"""Dtypes as numbers: how coarsely a floating dtype rounds.

Tolerances (:mod:`patternkit.engine.tolerance`) and differential checks
(:mod:`patternkit.verification.differential`) both need to know which dtype of a module
rounds most coarsely; numpy knows ``float16/32/64`` but not ``bfloat16``.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

__all__ = ["is_float_dtype", "machine_epsilon", "coarsest_float"]


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
