"""The constraint patterns' tests: attributes, dtype, shape and type of a matched node.

``has_attr``, ``has_dtype``, ``has_shape`` and ``has_type`` wrap a pattern; once the inner
pattern has matched, the matcher asks :func:`check_constraint` whether the expression it
matched also has the required property.  The comparisons are Relay's: attribute values
are compared as plain Python values (so ``[1, 1]`` equals an ``Array`` of ``IntImm``),
and a partially known expected type (unknown dtype, rank or dims) matches any actual
type that agrees on the known parts.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..ir import compat as C
from .opkinds import TOP_PATTERN, op_kind
from .pattern import (
    AttrPattern,
    DataTypePattern,
    DFPattern,
    ScalarPattern,
    ShapePattern,
    TypePattern,
)

__all__ = ["attrs_match", "check_constraint", "scalar_matches", "shape_matches", "to_python",
           "type_matches"]


def scalar_matches(pattern: ScalarPattern, expr: Any) -> bool:
    """Is ``expr`` a one-element constant whose value is ``pattern.value`` (see ScalarPattern)?"""
    if not C.is_constant(expr):
        return False
    array = C.const_to_numpy(expr)
    if array.size != 1:
        return False
    kind = array.dtype.kind
    have = array.reshape(()).item()
    if kind in "iub":
        return float(have) == pattern.value
    if kind != "f" and str(array.dtype) != "bfloat16":
        return False
    if math.isinf(pattern.value) or math.isinf(have):  # |inf - inf| is NaN: compare exactly
        return float(have) == pattern.value
    rtol = pattern.rtol
    if rtol is None:  # twice the rounding of the constant's own dtype
        rtol = 2 * float(np.finfo(array.dtype).eps) if kind == "f" else 2 ** -7
    return abs(float(have) - pattern.value) <= pattern.atol + rtol * abs(pattern.value)


def check_constraint(pattern: DFPattern, expr: Any) -> bool:
    """Does ``expr`` (what ``pattern.pattern`` matched) satisfy the constraint ``pattern``?"""
    if isinstance(pattern, AttrPattern):
        return attrs_match(expr, pattern.attrs)
    ty = C.type_of(expr)
    if isinstance(pattern, DataTypePattern):
        return C.dtype_of(ty) == pattern.dtype
    if isinstance(pattern, ShapePattern):
        return shape_matches(C.static_shape(ty), pattern.shape)
    if isinstance(pattern, TypePattern):
        return type_matches(ty, pattern.ty)
    return False


def to_python(value: Any) -> Any:
    """Normalise a TVM attribute value (Array, IntImm, DataType, String) to plain Python."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, tvm.DataType):
        return str(value)
    if isinstance(value, tvm.tirx.IntImm):
        return int(value.value)
    if isinstance(value, tvm.tirx.FloatImm):
        return float(value.value)
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (hasattr(value, "__len__")
                                            and hasattr(value, "__getitem__")):
        try:
            return [to_python(v) for v in value]
        except TypeError:
            pass
    return str(value)


def _lookup_attr(expr: Any, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of attribute ``key`` of a call (its attrs), an operator or a
    function (its attrs dict).

    An operator's ``TOpPattern`` is its kind as :func:`~patternkit.dpl.opkinds.op_kind`
    reads it (TVM's registration, else Relay's static kind).
    """
    if isinstance(expr, tvm.ir.Op):
        if key == TOP_PATTERN:
            kind = op_kind(expr)
            return kind is not None, kind
        try:
            return True, expr.get_attr(key)
        except C.TVM_ERRORS:  # the operator has no such attribute
            return False, None
    if isinstance(expr, relax.Call):
        attrs = expr.attrs
    else:
        attrs = getattr(expr, "attrs", None)
    if attrs is None:
        return False, None
    try:
        if key in attrs:
            return True, attrs[key]
    except TypeError:
        pass
    if hasattr(attrs, key):
        return True, getattr(attrs, key)
    return False, None


def attrs_match(expr: Any, expected: dict[str, Any]) -> bool:
    """Does ``expr`` have every attribute of ``expected``, with an equal value?

    Values compare as plain Python (:func:`to_python`), booleans by truth (an attribute
    may hold ``1`` where the pattern says ``True``); a missing attribute never matches.
    """
    for key, want in expected.items():
        found, have = _lookup_attr(expr, key)
        if not found:
            return False
        have, want = to_python(have), to_python(want)
        if isinstance(have, bool) or isinstance(want, bool):
            if bool(have) != bool(want):
                return False
        elif have != want:
            return False
    return True


def shape_matches(actual: tuple[Any, ...] | None, expected: list[Any]) -> bool:
    """Same rank and equal dims: ints by value, symbolic dims by their text (``n``)."""
    if actual is None or len(actual) != len(expected):
        return False
    for have, want in zip(actual, expected):
        if isinstance(want, int) and isinstance(have, int):
            if have != want:
                return False
        elif str(have) != str(want):
            return False
    return True


def type_matches(actual: Any, expected: Any) -> bool:
    """``actual`` fits ``expected``; unknown fields of ``expected`` match anything.

    ``expected`` may also be a Python class (``relax.TensorType``): any instance fits.
    """
    if isinstance(expected, type):
        return isinstance(actual, expected)
    if isinstance(expected, relax.TensorType):
        if not isinstance(actual, relax.TensorType):
            return False
        want_dtype = C.dtype_of(expected)
        if want_dtype and C.dtype_of(actual) != want_dtype:
            return False
        if expected.ndim != -1 and actual.ndim != expected.ndim:
            return False
        want_shape = C.static_shape(expected)
        if want_shape is not None:
            return shape_matches(C.static_shape(actual), list(want_shape))
        return True
    if isinstance(expected, relax.TupleType):
        return (isinstance(actual, relax.TupleType) and len(actual.fields) == len(expected.fields)
                and all(type_matches(a, e) for a, e in zip(actual.fields, expected.fields)))
    return C.structural_equal(actual, expected)
