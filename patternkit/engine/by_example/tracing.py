"""Tracing a by-example function into a Relax function, at the types it is asked for.

A Relax-side function (``lambda x: x * relax.op.sigmoid(x)``) is called on Vars of the
requested types, and what it returns is bound in a dataflow block, so every
intermediate has its type.  A torch-side function (``lambda x: x * torch.clamp(x + 3, 0,
6) / 6``) goes through ``torch.export`` and patternkit's importer, with its fix-ups, at
concrete sizes (:mod:`patternkit.models.torch_functions`): the pattern is then what the
importer really emits.  Which kind a function is, is read from the modules its code
names (torch is only imported when it is one).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping

import numpy as np
import tvm
from tvm import relax

from ...errors import PatternError, tvm_error_line

__all__ = ["trace", "is_torch_function", "constant_of"]


def is_torch_function(fn: Callable[..., Any]) -> bool:
    """Does ``fn`` compute with torch (its code names the ``torch`` module)?"""
    torch = sys.modules.get("torch")
    code = getattr(fn, "__code__", None)
    if code is None or torch is None:
        return False
    names = set(code.co_names)
    scope = getattr(fn, "__globals__", {})
    return any(scope.get(n) is torch or getattr(scope.get(n), "__name__", "").startswith(
        "torch") for n in names)


def constant_of(value: Any, dtype: str) -> relax.Expr:
    """A named constant's default as a Relax constant: a float in ``dtype``, an array of
    floats cast to it, anything else as it is.
    """
    arr = np.asarray(value)
    if arr.ndim == 0:
        return relax.const(value, dtype) if isinstance(value, float) else relax.const(value)
    if arr.dtype.kind == "f":
        return relax.const(arr.astype(dtype), dtype)
    return relax.const(arr)


def trace(rule: str, side: str, fn: Callable[..., Any], types: Mapping[str, Any],
          constants: Mapping[str, Any]) -> relax.Function:
    """``fn`` traced at ``types`` (name -> tensor type), its constants as Relax constants.

    Raises
    ------
    PatternError
        The function raised, returned something other than a Relax expression, or (torch)
        could not be exported or imported; the message names the rule and the side.
    """
    if is_torch_function(fn):
        from ...models.torch_functions import trace_torch_function

        return trace_torch_function(rule, side, fn, types, constants)
    params = [relax.Var(name, ty) for name, ty in types.items()]
    dtype = next(iter(types.values())).dtype if types else "float32"
    consts = {k: v if isinstance(v, relax.Expr) else constant_of(v, str(dtype))
              for k, v in constants.items()}
    try:
        out = fn(*params, **consts)
    except PatternError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's function: say what it raised
        raise PatternError(f"{rule}: calling {side} on Relax Vars raised "
                           f"{type(err).__name__}: {_error_line(err)}") from None
    if not isinstance(out, relax.Expr) or isinstance(out, tvm.ir.Op):
        raise PatternError(f"{rule}: {side} returned {type(out).__name__}, not a Relax "
                           f"expression (write it with relax.op.*, or with torch)")
    bb = relax.BlockBuilder()
    try:
        with bb.function(side, params):
            with bb.dataflow():
                result = bb.emit_output(out)
            bb.emit_func_output(result)
    except Exception as err:  # noqa: BLE001 - a type error in the user's expression
        raise PatternError(f"{rule}: {side} does not type-check at "
                           f"{_types_text(types)}: {_error_line(err)}") from None
    func = bb.get()[side]
    assert isinstance(func, relax.Function)
    return func


def _types_text(types: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in types.items())


def _error_line(err: BaseException) -> str:
    """What failed in the rule's own expression; where in TVM's C++ would not help its
    author.
    """
    return tvm_error_line(err, limit=200, where=False)
