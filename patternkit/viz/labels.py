"""Compact text for the visualiser: types, operator names, attributes and literals.

Everything a node label shows is produced here so that the graph model stays free of
string formatting.  Types are written the way compiler engineers scribble them
(``f32[1,64,56,56]``, ``f16[n,2*n]``, ``(f32[4], i64[])``), operator names either
Relay-short (``nn.conv2d``), TVMScript (``R.nn.conv2d``) or in full (``relax.nn.conv2d``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..ir import compat as C

__all__ = [
    "OP_NAME_STYLES",
    "call_attributes",
    "compact_type",
    "key_attributes",
    "literal_text",
    "short_op_name",
]

OP_NAME_STYLES = ("relay", "relax", "full")

_DTYPE_SHORT = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint64": "u64",
    "uint32": "u32",
    "uint16": "u16",
    "uint8": "u8",
    "bool": "bool",
}

# ``n * T.int64(2)`` -> ``n*2``: symbolic dims print with typed immediates.
_TYPED_IMM = re.compile(r"T\.(?:u?int|float)\d+\(([^()]*)\)")

# Attribute values that are the usual defaults and therefore not worth a label line.
_BORING_KEYS = {"data_layout", "kernel_layout", "out_layout", "out_dtype", "layout"}
_ONES_BY_DEFAULT = {"strides", "dilation", "groups"}
_ZEROS_BY_DEFAULT = {"padding"}
_BORING_PAIRS = {("center", "True"), ("scale", "True"), ("momentum", "0.1"), ("ceil_mode", "False"),
                 ("count_include_pad", "False")}

# structural hash of a type -> its text: one C call instead of a walk over the shape.
_TYPE_CACHE: dict[int, str] = {}
_TYPE_CACHE_LIMIT = 65536


def short_dtype(dtype: Any) -> str:
    """``float32`` -> ``f32``; unknown dtypes are returned as written, empty -> ``?``."""
    text = str(dtype) if dtype is not None else ""
    if not text:
        return "?"
    return _DTYPE_SHORT.get(text, text)


def prim_expr_text(expr: Any) -> str:
    """A shape dimension or prim expression without the ``T.int64(...)`` noise."""
    if isinstance(expr, tvm.tirx.IntImm):
        return str(int(expr.value))
    if tvm.ir.is_prim_var(expr):
        return expr.name
    return _TYPED_IMM.sub(r"\1", str(expr)).replace(" ", "")


def compact_type(ty: Any) -> str:
    """A one-line rendering of a Relax type.

    Parameters
    ----------
    ty : relax type or None
        ``TensorType``, ``TupleType``, ``ShapeType``, ``PrimType``, ``ObjectType``, ...

    Returns
    -------
    str
        ``f32[1,64,56,56]``; ``f32[n,4]`` for symbolic dims; ``f32[?x?]`` when only the rank
        is known; ``f32[*]`` when nothing is known; tuples in parentheses; ``""`` for None.
    """
    if ty is None:
        return ""
    key = C.structural_hash(ty)
    text = _TYPE_CACHE.get(key)
    if text is None:
        text = _compact_type(ty)
        if len(_TYPE_CACHE) >= _TYPE_CACHE_LIMIT:
            _TYPE_CACHE.clear()
        _TYPE_CACHE[key] = text
    return text


def _compact_type(ty: Any) -> str:
    if isinstance(ty, relax.TensorType):
        dtype = short_dtype(ty.dtype)
        shape = ty.shape
        if shape is None:
            ndim = int(ty.ndim)
            return f"{dtype}[*]" if ndim < 0 else f"{dtype}[{'x'.join('?' * ndim)}]"
        values = getattr(shape, "values", None)
        if values is None:  # a shape held in a Var: only its name is known
            return f"{dtype}[{getattr(shape, 'name', '?')}]"
        return f"{dtype}[{','.join(prim_expr_text(d) for d in values)}]"
    if isinstance(ty, relax.TupleType):
        return "(" + ", ".join(_compact_type(f) for f in ty.fields) + ")"
    if isinstance(ty, relax.ShapeType):
        values = getattr(ty, "values", None)
        if values is not None:
            return "shape(" + ",".join(prim_expr_text(d) for d in values) + ")"
        return f"shape[{int(ty.ndim)}]" if int(ty.ndim) >= 0 else "shape"
    if isinstance(ty, relax.FuncType):
        return "fn"
    if isinstance(ty, tvm.ir.PrimType):
        return short_dtype(ty.dtype)
    name = type(ty).__name__
    return "obj" if name in ("ObjectType", "AnyType") else name


def short_op_name(name: str, style: str = "relay") -> str:
    """Render ``relax.nn.conv2d`` as ``nn.conv2d`` (relay), ``R.nn.conv2d`` or unchanged."""
    if style == "full" or not name.startswith("relax."):
        return name
    rest = name[len("relax."):]
    return rest if style == "relay" else "R." + rest


def _value_text(value: Any, limit: int = 40) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float, str)):
        text = str(value)
    elif isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        text = str(value.value)
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        text = "[" + ",".join(_value_text(v, limit) for v in value) + "]"
    elif isinstance(value, tvm.ir.PrimExpr):
        text = prim_expr_text(value)
    else:
        text = _TYPED_IMM.sub(r"\1", str(value))
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_attributes(call: Any) -> dict[str, str]:
    """All attributes of a call to an operator, as ``{name: compact text}`` in field order."""
    attrs = getattr(call, "attrs", None)
    if attrs is None:
        return {}
    if isinstance(attrs, tvm.ir.DictAttrs):
        return {str(k): _value_text(attrs[k]) for k in sorted(attrs.keys())}
    out = {}
    for name in C.attr_field_names(attrs):
        try:
            out[name] = _value_text(getattr(attrs, name))
        except AttributeError:  # a field without a Python getter: it stays in no label
            continue
    return out


def key_attributes(attrs: dict[str, str], limit: int = 3) -> list[str]:
    """The (at most ``limit``) attribute names worth a label line: non-default values first."""
    keys = [k for k, v in attrs.items() if not _is_default(k, v)]
    return keys[:limit]


def _is_default(key: str, value: str) -> bool:
    if value in ("None", "", "[]") or key in _BORING_KEYS or (key, value) in _BORING_PAIRS:
        return True
    items = set(value.strip("[]").split(","))
    return ((key in _ONES_BY_DEFAULT and items <= {"1"})
            or (key in _ZEROS_BY_DEFAULT and items <= {"0"}))


def literal_text(expr: Any) -> str:
    """Short text for a value folded into its consumer: constants, prim values, shapes."""
    if isinstance(expr, tvm.ir.GenericConst):
        ty = compact_type(getattr(expr, "ty", None))
        if not ty.endswith("[]"):  # only scalars are read: weights are never copied
            return f"const {ty}"
        try:
            # DLPack views the CPU buffer in place: far cheaper than Tensor.numpy().
            return f"const {np.from_dlpack(expr.value).item()!r}"
        except (BufferError, RuntimeError):  # on a device, or a dtype DLPack cannot carry
            try:
                return f"const {expr.value.numpy().item()!r}"
            except C.TVM_ERRORS:  # a dtype numpy cannot hold either: the type says enough
                return f"const {ty}"
    if isinstance(expr, tvm.ir.Constant):  # IntImm / FloatImm prim values
        return str(expr.value)
    if isinstance(expr, relax.ShapeExpr):
        return "shape(" + ",".join(prim_expr_text(d) for d in expr.values) + ")"
    if isinstance(expr, tvm.ir.GlobalVar):
        return "@" + expr.name_hint
    if isinstance(expr, relax.ExternFunc):
        return "extern " + str(expr.global_symbol)
    for attr in ("value",):
        if hasattr(expr, attr):
            return _value_text(getattr(expr, attr))
    return type(expr).__name__
