"""Rebuilding a function around new bindings, and naming a binding in an error message.

Every pass that changes a function ends the same way: new blocks go into a new
``SeqExpr``, the function is rebuilt with its parameters, return type, purity,
attributes and span, and one C++ normalisation gives the new ``SeqExpr`` its type (the
bindings inside are already normal, so the call is linear).  Error messages name the
binding they are about in one shape, on one line, cut to a readable length.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from .compat import const_to_numpy, dtype_of, var_name


def make_block(bindings: Sequence[Any], dataflow: bool, span: Any = None) -> Any:
    """A ``DataflowBlock`` (``dataflow``) or a ``BindingBlock`` holding ``bindings``."""
    if dataflow:
        return relax.DataflowBlock(bindings, span)
    return relax.BindingBlock(bindings, span)


def rebuild_function(func: relax.Function, body: Any, *, params: Sequence[Any] | None = None,
                     ret_ty: Any = None) -> relax.Function:
    """``func`` with a new body, normalised so that every part of it has its type.

    Parameters
    ----------
    func : relax.Function
        The function to rebuild; it is not modified.  Its purity, attributes and span
        are kept, and so are its parameters and return type unless replaced.
    body : relax.SeqExpr or sequence of binding blocks
        The new body, or the new blocks around the function's own result expression.
    params, ret_ty : optional
        Replacements for the parameters and the return type.
    """
    if not isinstance(body, relax.SeqExpr):
        body = relax.SeqExpr(list(body), func.body.body, func.body.span)
    new_func = relax.Function(func.params if params is None else params, body,
                              func.ret_ty if ret_ty is None else ret_ty, func.is_pure,
                              func.attrs, func.span)
    # A SeqExpr built from Python has no type until normalised; one linear C++ call.
    return relax.BlockBuilder().normalize(new_func)


#: TVM's printer writes a constant as ``metadata["ir.GenericConst"][0]`` and ends the text
#: with a note on ``show_meta`` (which crashes on constants in 0.27): in one line of an
#: explanation the constant is ``const`` and the note goes.
_METADATA_REFERENCE = re.compile(r'metadata\["[^"\]]+"\]\[\d+\]')
_METADATA_NOTE = re.compile(r"# Metadata omitted\..*$", re.DOTALL)


def expr_text(expr: Any, limit: int | None = 160) -> str:
    """``expr`` printed on one line, cut after ``limit`` characters (``None``: never).

    Never raises: it runs while an error is being reported, and a printer failure must
    not hide that error.
    """
    try:
        text = str(expr)
    except Exception:  # printing must never hide the real error
        text = type(expr).__name__
    text = " ".join(_METADATA_NOTE.sub("", text).split())
    text = _METADATA_REFERENCE.sub("const", text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return text


def constant_text(expr: Any, limit: int = 6) -> str | None:
    """``"float32 0.5"``, ``"float32[3] [1, 2, 3]"``: a constant's dtype and values.

    What a reader wants to see of a constant in an explanation, where TVM's printer
    shows ``metadata["ir.GenericConst"][0]``; at most ``limit`` values, then ``...``.
    ``None`` when ``expr`` is not a constant (or its value cannot be read).
    """
    if isinstance(expr, tvm.ir.GenericConst):
        dtype = dtype_of(expr.ty) or "?"
    elif isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        dtype = str(expr.ty)  # TVM 0.27's IntImm / FloatImm have no .dtype
    else:
        return None
    try:
        values = np.asarray(const_to_numpy(expr))
    except Exception:  # a value that cannot be read must not hide the explanation
        return None
    flat = [f"{v:g}" if isinstance(v, float) else str(v) for v in values.ravel()[:limit].tolist()]
    if values.size > limit:
        flat.append("...")
    if values.ndim == 0:
        return f"{dtype} {flat[0]}"
    return f"{dtype}[{', '.join(str(d) for d in values.shape)}] [{', '.join(flat)}]"


def binding_text(var: Any, value: Any, *, limit: int | None = 160,
                 with_type: bool = False) -> str:
    """``"lv5 = R.add(lv4, beta)"`` (``"lv5: R.Tensor(...) = ..."`` ``with_type``)."""
    name = var_name(var)
    if with_type:
        name = f"{name}: {expr_text(var.ty, None)}"
    return f"{name} = {expr_text(value, limit)}"


def describe_binding(func_name: str, binding: Any, limit: int = 160) -> str:
    """``"main: lv5 = R.add(lv4, beta)"``: a binding of a function, for error messages."""
    return f"{func_name}: {binding_text(binding.var, binding.value, limit=limit)}"
