"""TVMScript a user can paste into a test: tensor constants written out, not as metadata.

``mod.script()`` prints tensor constants as ``metadata["ir.GenericConst"][i]``, which does
not parse back, and ``script(show_meta=True)`` crashes this TVM build on tensor
constants.  A failure that fuzzing found is only useful if it reproduces, so
:func:`module_text` prints each tensor constant inline, as
``R.const(np.array([...], dtype="float32").reshape(4, 3, 3, 3))`` (exact: every float
is printed with the digits that round-trip), and checks that the text parses back to
the same module; :func:`parse_module_text` reads it.  The text is also how a module
crosses a process boundary (IRModules do not pickle in this build).
"""

from __future__ import annotations

import importlib
import math
import re
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..ir import compat as C

__all__ = ["module_text", "parse_module_text", "ScriptError"]

_METADATA = re.compile(r'metadata\["ir\.GenericConst"\]\[(\d+)\]')
_DEF = re.compile(r"^    def (\w+)\(", re.M)
_IMPORT = re.compile(r"^from ([\w.]+) import (\w+)(?: as (\w+))?$")


class ScriptError(ValueError):
    """The module's text does not parse back to the same module."""


def module_text(mod: tvm.IRModule) -> str:
    """``mod`` as standalone TVMScript (imports included) with its constants inline.

    Raises
    ------
    ScriptError
        The inlined text does not parse back to a module structurally equal to ``mod``
        (a construct the printer cannot express); the message holds the text.
    """
    text = mod.script()
    indices = [int(i) for i in _METADATA.findall(text)]
    if indices:
        constants = _constants_in_print_order(mod, text)
        if len(constants) <= max(indices):
            raise ScriptError(f"found {len(constants)} tensor constants, the printer "
                              f"numbered {max(indices) + 1}:\n{text}")
        text = _METADATA.sub(lambda m: _const_text(constants[int(m.group(1))]), text)
    # The printer writes the imports its text needs as comments: make them real.
    lines = text.splitlines()
    imports = ["import numpy as np"] + [line[2:] for line in lines
                                        if _IMPORT.match(line[2:]) and line.startswith("# ")]
    body = [line for line in lines if not line.startswith("# ")]
    text = "\n".join(imports) + "\n\n" + "\n".join(body).strip("\n") + "\n"
    try:
        parsed = parse_module_text(text)
    except Exception as err:  # the parser's errors have no common base class
        raise ScriptError(f"the printed module does not parse back "
                          f"({type(err).__name__}: {err}):\n{text}") from err
    if not C.structural_equal(parsed, mod):
        raise ScriptError(f"the printed module parses back to a different module:\n{text}")
    return text


def parse_module_text(text: str) -> tvm.IRModule:
    """The module of a :func:`module_text`.

    The parser takes no import lines: its ``from X import Y [as Z]`` lines become the
    names it is given instead (``import numpy as np`` is always available).
    """
    names: dict[str, Any] = {"np": np}
    body = []
    for line in text.splitlines():
        found = _IMPORT.match(line)
        if found:
            module, name, alias = found.groups()
            names[alias or name] = getattr(importlib.import_module(module), name)
        elif not line.startswith("import "):
            body.append(line)
    return tvm.script.from_source("\n".join(body), extra_vars=names)


# -- constants in the order the printer numbers them ----------------------------------------
def _constants_in_print_order(mod: tvm.IRModule, text: str) -> list:
    """Tensor constants as the printer meets them: functions in printed order, bindings
    in order, arguments left to right (the printer numbers metadata on first sight).
    """
    by_name = {gv.name_hint: func for gv, func in mod.functions.items()}
    seen: dict[int, Any] = {}

    def visit(expr: Any) -> None:
        if isinstance(expr, tvm.ir.GenericConst):
            if C.static_shape(expr.ty) != ():
                seen.setdefault(C.handle(expr), expr)
        elif isinstance(expr, relax.Call):
            if isinstance(expr.op, relax.Function):
                visit(expr.op)
            for arg in expr.args:
                visit(arg)
        elif isinstance(expr, relax.Tuple):
            for field in expr.fields:
                visit(field)
        elif isinstance(expr, relax.TupleGetItem):
            visit(expr.tuple_value)
        elif isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                for binding in block.bindings:
                    visit(binding.value)
            visit(expr.body)
        elif isinstance(expr, relax.If):
            visit(expr.cond)
            visit(expr.true_branch)
            visit(expr.false_branch)
        elif isinstance(expr, relax.Function):
            visit(expr.body)

    for name in _DEF.findall(text):
        func = by_name.get(name)
        if isinstance(func, relax.Function):
            visit(func)
    return list(seen.values())


def _const_text(const: Any) -> str:
    array = C.const_to_numpy(const)
    dtype = str(array.dtype)
    stored = "float32" if dtype == "bfloat16" else dtype  # numpy spells bfloat16 via ml_dtypes
    flat = array.astype("float64" if dtype.startswith(("float", "bfloat")) else dtype).ravel()
    values = ", ".join(_number(v) for v in flat.tolist())
    text = f'np.array([{values}], dtype="{stored}")'
    if array.ndim != 1:
        text += f".reshape({', '.join(str(d) for d in array.shape)})"
    if dtype != stored:
        text += f'.astype("{dtype}")'
    return f"R.const({text})"


def _number(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "np.nan"
        if math.isinf(value):
            return "np.inf" if value > 0 else "-np.inf"
        return repr(value)
    return repr(value)
