"""Rewrites of a module TVM 0.27's torch importer made, so that it computes what torch does.

- :func:`wrap_negative_take_indices`: ``from_exported_program`` turns a constant negative
  index (``x[..., -1, :]``, ``x[..., [-2], :]``) into ``R.take(x, idx, axis, mode="fast")``
  with the negative value kept, and ``fast`` reads outside the tensor: wrong numbers, no
  error (``docs/tvm-bugs.md``; Falcon's multi-query attention splits its key and value
  so).  Each such index constant is replaced by the non-negative index torch reads,
  ``idx + n`` with ``n`` the axis' static extent.  An index computed at run time, or an
  axis of symbolic extent, is left as it is: the rewrite cannot know what it reads.

:func:`prepare_torch_import` applies it; the zoo's torch entries call it on every import.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..ir import const_value, is_tensor_constant, op_name, static_shape


def prepare_torch_import(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[str]]:
    """``mod`` with the rewrites of the module docstring applied (a new module; ``mod`` is
    left as it is), and what they did (an empty list: nothing to do, ``mod`` itself).
    """
    mod, wrapped = wrap_negative_take_indices(mod)
    return mod, ([f"wrapped the negative indices of {wrapped} take(mode='fast') "
                  f"(TVM's torch importer keeps them)"] if wrapped else [])


def wrap_negative_take_indices(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with every constant negative ``take`` index on a static axis made the
    non-negative one torch reads, and how many ``take`` calls changed.
    """
    if all(_wrapped_indices(call) is None for call in _takes(mod)):
        return mod, 0
    rewriter = _WrapNegativeTakeIndices(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get(), rewriter.wrapped


def _takes(mod: tvm.IRModule):
    found = []

    def visit(expr):
        if op_name(expr) == "relax.take":
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def _wrapped_indices(call: relax.Call) -> np.ndarray | None:
    """The indices ``call`` should read, when they are a constant with a negative entry
    on a static axis; ``None`` otherwise.
    """
    data, indices = call.args[0], call.args[1]
    if call.attrs.axis is None or not is_tensor_constant(indices):
        return None
    values = const_value(indices)
    if values.dtype.kind not in "iu" or not (values < 0).any():
        return None
    shape = static_shape(data.ty)
    if shape is None:
        return None
    extent = shape[int(call.attrs.axis)]
    if not isinstance(extent, int):
        return None
    return np.where(values < 0, values + extent, values).astype(values.dtype)


@mutator
class _WrapNegativeTakeIndices(PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.wrapped = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) == "relax.take":
            indices = _wrapped_indices(call)
            if indices is not None:
                self.wrapped += 1
                return relax.op.take(call.args[0], relax.const(indices),
                                     int(call.attrs.axis), call.attrs.mode)
        return call
