"""The shapes an importer left unknown, recovered: a range's length is provably the sequence.

``from_onnx`` writes torch's ``arange(x.shape[2])`` (the positions of HF's rotary tables)
as a count computed at run time and a fresh symbolic length for it::

    lv = R.shape_to_tensor(R.shape([T.Cast("int64", T.Cast("float32", seq))]))
    ...  reshape, astype, subtract 0, divide by 1, ceil, maximum(_, 0), astype, reshape ...
    lv12: R.Shape([range_len_0]) = R.match_cast(R.tensor_to_shape(lv10),
                                                R.Shape([range_len_0]))
    lv13: R.Tensor((range_len_0,), "int64") = R.arange(0, range_len_0, 1)

so the tables are ``(range_len_0, lanes)``, ``x * cos`` has an unknown shape, and the
second rotation's ``x`` has no known lanes.  :func:`proven_lengths` evaluates the count
symbolically (exact integer arithmetic; a round trip through ``float32`` or ``float64``
is exact for lengths below ``2**24``, which every sequence is) and keeps the lengths it
proves to be an expression of the function's own dimensions; :func:`refined_type` reads
an expression's type in a copy of the function with those lengths substituted, where
TVM's shape inference runs again.  A length that is not proven stays what it was, and
the guards refuse with its name.

The rules see one match; the function comes from the module in scope
(:func:`patternkit.engine.current_module`: a rewrite and a composite merge put theirs
there).  Nothing is modified: the copy is for reading types.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax
from tvm.sym import Analyzer, ConstIntBound
from tvm.tirx.analysis import undefined_vars

from patternkit.engine import current_module
from patternkit.ir import type_of

#: Float dtypes whose integers are exact far beyond any sequence length (``2**24``).
_EXACT_FLOATS = frozenset({"float32", "float64"})

#: ``op name -> the integer arithmetic it is``, for ops of two exact integer operands.
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "relax.add": lambda a, b: a + b,
    "relax.subtract": lambda a, b: a - b,
    "relax.multiply": lambda a, b: a * b,
    "relax.floor_divide": tvm.tirx.floordiv,
    "relax.maximum": tvm.tirx.max,
    "relax.minimum": tvm.tirx.min,
}

#: Ops that keep a one-element tensor's value (integral values stay integral).
_KEEP = frozenset({"relax.reshape", "relax.shape_to_tensor", "relax.tensor_to_shape",
                   "relax.ceil", "relax.floor", "relax.round", "relax.trunc"})


def _values(func: relax.Function) -> dict[Any, Any]:
    """``Var -> value`` of every binding of ``func`` (a match cast's value is what it casts)."""
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


def _dtype(expr: Any) -> str:
    """A TIR expression's dtype (a variable's is its type)."""
    try:
        return str(expr.dtype)
    except AttributeError:
        return str(expr.ty)


def _tir_integer(expr: Any) -> Any:
    """``expr`` (a TIR dimension) as an exact integer expression, or ``None``.

    ``Cast(int64, Cast(float32, seq))``, as ``from_onnx`` writes a float ``Range``'s limit,
    is ``seq``: a length below ``2**24`` survives ``float32``.
    """
    if isinstance(expr, tvm.tirx.Cast):
        inner = _tir_integer(expr.value)
        dtype = _dtype(expr)
        if inner is None or not (dtype.startswith("int") or dtype in _EXACT_FLOATS):
            return None
        return inner
    if isinstance(expr, tvm.tirx.IntImm) or tvm.ir.is_prim_var(expr):
        return expr if _dtype(expr) == "int64" else tvm.tirx.Cast("int64", expr)
    if isinstance(expr, tvm.tirx.PrimExpr) and _dtype(expr).startswith("int"):
        return expr
    return None


def integer_value(expr: Any, values: dict[Any, Any], depth: int = 0) -> Any:
    """The exact integer a one-element tensor or shape ``expr`` holds, as a TIR expression.

    Follows ``values`` (a function's bindings) through the integer arithmetic, the casts
    and the roundings ``from_onnx`` writes for a ``Range``'s count; ``None`` for anything
    else (a float division, a cast to ``float16``, a tensor of several elements).
    """
    if depth > 64:
        return None
    if isinstance(expr, relax.ShapeExpr):
        return _tir_integer(expr.values[0]) if len(expr.values) == 1 else None
    if isinstance(expr, relax.Var):
        return integer_value(values[expr], values, depth + 1) if expr in values else None
    if isinstance(expr, tvm.ir.Constant) and hasattr(expr, "value"):
        array = np.asarray(expr.value.numpy())
        if array.size != 1 or array.reshape(()) != np.round(array.reshape(())):
            return None
        return tvm.tirx.IntImm("int64", int(array.reshape(())))
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    name, args = expr.op.name, list(expr.args)
    if name in ("relax.match_cast",) or name in _KEEP:
        return integer_value(args[0], values, depth + 1)
    if name == "relax.astype":
        target = str(expr.attrs.dtype)
        if not (target.startswith("int") or target in _EXACT_FLOATS):
            return None
        return integer_value(args[0], values, depth + 1)
    if name == "relax.negative":
        inner = integer_value(args[0], values, depth + 1)
        return None if inner is None else -inner
    if name == "relax.divide":  # exact only by one
        divisor = integer_value(args[1], values, depth + 1)
        if divisor is None or not isinstance(divisor, tvm.tirx.IntImm) or int(divisor) != 1:
            return None
        return integer_value(args[0], values, depth + 1)
    if name in _BINARY:
        a, b = (integer_value(arg, values, depth + 1) for arg in args[:2])
        return None if a is None or b is None else _BINARY[name](a, b)
    return None


def _dims_of_params(func: relax.Function) -> list[Any]:
    """The symbolic dimensions of ``func``'s parameters (each at least 0)."""
    dims: dict[str, Any] = {}
    for param in func.params:
        for dim in getattr(type_of(param), "shape", None) or ():
            if tvm.ir.is_prim_var(dim):
                dims.setdefault(dim.name, dim)
    return list(dims.values())


def proven_lengths(func: relax.Function) -> dict[Any, Any]:
    """``symbolic length -> the expression of the parameters' dimensions it provably is``.

    One entry per ``R.match_cast(shape, R.Shape([n]))`` defining a new ``n`` whose shape
    :func:`integer_value` evaluates, simplified with every parameter dimension at least 0
    (``max(seq, 0)`` is ``seq``), to an expression of the parameters' dimensions only.
    """
    values = _values(func)
    params = _dims_of_params(func)
    known = {dim.name for dim in params}
    analyzer = Analyzer()
    for dim in params:
        analyzer.update(dim, ConstIntBound(0, ConstIntBound.POS_INF))
    found: dict[Any, Any] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.MatchCast):
                continue
            shape = getattr(binding.ty, "values", None)
            if isinstance(binding.ty, relax.ShapeType) and shape is not None and len(shape) == 1:
                length = shape[0]
                if not tvm.ir.is_prim_var(length) or length.name in known:
                    continue
                value = integer_value(binding.value, values)
                if value is None:
                    continue
                value = analyzer.simplify(value)
                if _free_names(value) <= known:
                    found[length] = value
    return found


def _free_names(expr: Any) -> set[str]:
    return {var.name for var in undefined_vars(expr)}


@functools.lru_cache(maxsize=4)
def _refined(mod: tvm.IRModule) -> dict[Any, Any]:
    """``Var -> its type`` in every Relax function of ``mod`` with its proven lengths
    substituted (only the functions that have any; TVM infers their types again).
    """
    types: dict[Any, Any] = {}
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        lengths = proven_lengths(func)
        if not lengths:
            continue
        try:
            bound = func.bind_symbolic_vars(lengths)
        except Exception:  # noqa: BLE001 (a substitution TVM refuses proves nothing)
            continue
        old = [b.var for block in func.body.blocks for b in block.bindings]
        new = [b.var for block in bound.body.blocks for b in block.bindings]
        if len(old) == len(new):
            types.update({o: n.ty for o, n in zip(old, new)})
    return types


def refined_type(expr: Any) -> Any:
    """``expr``'s type with the importer's range lengths replaced by what they provably
    are (see the module doc); its own type when the module in scope proves nothing.
    """
    mod = current_module()
    if mod is not None and isinstance(expr, relax.Var):
        found = _refined(mod).get(expr)
        if found is not None:
            return found
    return type_of(expr)


def bind_proven_lengths(mod: tvm.IRModule) -> tvm.IRModule:
    """A copy of ``mod`` whose Relax functions have their proven lengths substituted.

    ``from_onnx``'s module of a dynamic sequence does not build for llvm as imported
    (``x * cos`` has an unknown shape, which ``LegalizeOps`` leaves to the VM); with
    ``range_len_0`` replaced by ``seq`` TVM infers every shape and it builds.  The match
    cast that defined the length stays, as a check at run time that it is ``seq``.
    """
    functions = {}
    for gv, func in mod.functions.items():
        lengths = (proven_lengths(func) if isinstance(func, relax.Function)
                   and isinstance(func.body, relax.SeqExpr) else {})
        functions[gv] = func.bind_symbolic_vars(lengths) if lengths else func
    return tvm.IRModule(functions, attrs=mod.attrs)
