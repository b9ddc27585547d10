"""The attention scale as exporters compute it: one number, maybe computed from constants.

A scale is usually a constant.  The TorchScript ONNX exporter writes SDPA's as arithmetic
on constants that ``from_onnx`` keeps as bindings: ``sqrt(astype(1 / sqrt(H)))``
multiplying the query and the key each (opsets 14 and 17).  :func:`scale_pattern` matches
a constant, or :data:`UNARY` and :data:`BINARY` operators over constants up to
:data:`DEPTH` calls deep, or (last) anything, which the check refuses with its reason;
:func:`scale_value` evaluates what matched in numpy, in each call's own dtype, as the
graph would at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import ml_dtypes
import numpy as np

from patternkit.dpl import DFPattern, is_constant, is_op, wildcard
from patternkit.ir import const_value, dtype_of, op_name, type_of

#: The one-operand operators the exporters compute a scale with, evaluated in numpy.
UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
    "relax.astype": lambda x: x,  # the cast is the result's dtype, applied by the caller
}
#: The two-operand ones.
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "relax.divide": np.divide,
    "relax.multiply": np.multiply,
}
#: How many calls deep a computed scale may be (TorchScript's SDPA: 4 in float32, 5 in
#: float16 and bfloat16, where the square root of the head size is cast to float32).
DEPTH = 5


@dataclass(frozen=True)
class ScaleSite:
    """The patterns of one scale site: ``root`` (what the scaling op takes), a constant
    ``leaf``, a ``unary`` call of ``operand`` or a ``binary`` call of ``left`` and
    ``right`` (each a site one call shallower; ``None`` at depth 0), and ``other``, the
    wildcard that takes anything else (refused by the check, with its reason).
    """

    root: DFPattern
    leaf: DFPattern
    other: DFPattern
    unary: DFPattern | None = None
    operand: ScaleSite | None = None
    binary: DFPattern | None = None
    left: ScaleSite | None = None
    right: ScaleSite | None = None


def _any_of(names: Any) -> DFPattern:
    ops = [is_op(name) for name in names]
    found: DFPattern = ops[0]
    for op in ops[1:]:
        found = found | op
    return found


def _site(depth: int, fallback: bool) -> ScaleSite:
    leaf = is_constant()
    other = wildcard()
    if depth == 0:
        return ScaleSite(leaf | other if fallback else leaf, leaf, other)
    operand, left, right = (_site(depth - 1, False) for _ in range(3))
    unary = _any_of(UNARY)(operand.root)
    binary = _any_of(BINARY)(left.root, right.root)
    root = leaf | unary | binary
    return ScaleSite(root | other if fallback else root, leaf, other, unary, operand,
                     binary, left, right)


def scale_pattern() -> ScaleSite:
    """A scale site: a constant, arithmetic on constants, or anything (refused later)."""
    return _site(DEPTH, True)


def scale_value(match: Any, site: ScaleSite) -> np.ndarray | None:
    """The value of the constant or the arithmetic on constants ``site`` matched in
    ``match``, computed in each call's result dtype (``None``: the site's wildcard took
    something else).
    """
    if site.leaf in match:
        return np.asarray(const_value(match[site.leaf]))
    if site.unary is not None and site.unary in match:
        assert site.operand is not None  # built together (_site)
        call = match[site.unary]
        value = scale_value(match, site.operand)
        if value is None:
            return None
        return _in_dtype(UNARY[str(op_name(call))](value), call)
    if site.binary is not None and site.binary in match:
        assert site.left is not None and site.right is not None  # built together (_site)
        call = match[site.binary]
        left, right = scale_value(match, site.left), scale_value(match, site.right)
        if left is None or right is None:
            return None
        return _in_dtype(BINARY[str(op_name(call))](left, right), call)
    return None


def _in_dtype(value: np.ndarray, call: Any) -> np.ndarray:
    dtype = dtype_of(type_of(call))
    if dtype is None:
        return np.asarray(value)
    if dtype == "bfloat16":
        return np.asarray(value).astype(ml_dtypes.bfloat16)
    return np.asarray(value).astype(dtype)


def what_matched(match: Any, site: ScaleSite) -> Any:
    """The expression the site matched (for a refusal's ``at``)."""
    for pattern in (site.leaf, site.unary, site.binary, site.other):
        if pattern is not None and pattern in match:
            return match[pattern]
    return None


__all__ = ["ScaleSite", "scale_pattern", "scale_value", "what_matched", "UNARY", "BINARY",
           "DEPTH"]
