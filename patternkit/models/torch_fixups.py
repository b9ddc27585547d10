"""Rewrites of a module TVM 0.27's torch importer made, so that it computes what torch does.

- :func:`wrap_negative_take_indices`: ``from_exported_program`` turns a constant negative
  index (``x[..., -1, :]``, ``x[..., [-2], :]``) into ``R.take(x, idx, axis, mode="fast")``
  with the negative value kept, and ``fast`` reads outside the tensor: wrong numbers, no
  error (``docs/tvm-bugs.md``; Falcon's multi-query attention splits its key and value
  so).  Each such index constant is replaced by the non-negative index torch reads,
  ``idx + n`` with ``n`` the axis' static extent.  An index computed at run time, or an
  axis of symbolic extent, is left as it is: the rewrite cannot know what it reads.

- :func:`positive_strided_slice_axes`: ``torch.diff`` (transformers' mask code calls it
  on the position ids) imports as ``R.strided_slice(x, axes=(-1,), ...)``, and on an input
  of symbolic shape TVM's legalisation refuses the negative axis ("Check failed: axis <
  src_tensor_dim (-1 vs. 2)"): a dynamic-batch Phi-3 did not build.  Each negative axis of
  a strided slice of a symbolic shape is made the axis it counts from the end.

:func:`prepare_torch_import` applies them; the zoo's torch entries call it on every import.
"""

from __future__ import annotations

from typing import Any, Callable

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
    mod, sliced = positive_strided_slice_axes(mod)
    notes = []
    if wrapped:
        notes.append(f"wrapped the negative indices of {wrapped} take(mode='fast') "
                     f"(TVM's torch importer keeps them)")
    if sliced:
        notes.append(f"counted the negative axes of {sliced} strided_slice of a symbolic "
                     f"shape from the front (TVM's legalisation refuses them)")
    return mod, notes


def positive_strided_slice_axes(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with the negative axes of every ``strided_slice`` of an input of symbolic
    shape and known rank counted from the front, and how many calls changed.
    """
    return _rewrite_calls(mod, "relax.strided_slice", _positive_axes, _sliced_from_the_front)


def _positive_axes(call: relax.Call) -> list[int] | None:
    """The axes ``call`` slices, counted from the front, when one is negative and its
    input's shape is symbolic (a static one legalises as it is); ``None`` otherwise.
    """
    axes = call.args[1]
    fields = getattr(axes, "fields", None)
    if fields is None or not all(isinstance(a, tvm.tirx.IntImm) for a in fields):
        return None
    values = [int(a) for a in fields]
    shape = static_shape(call.args[0].ty)
    if not any(v < 0 for v in values) or shape is None:
        return None
    if all(isinstance(d, int) for d in shape):
        return None
    return [v + len(shape) if v < 0 else v for v in values]


def _sliced_from_the_front(call: relax.Call, axes: list[int]) -> relax.Expr:
    """``call``, a ``strided_slice``, over ``axes`` (:func:`_positive_axes`)."""
    x, _, begin, end, *strides = call.args
    return relax.op.strided_slice(x, axes, begin, end, strides[0] if strides else None,
                                  bool(call.attrs.assume_inbound))


def wrap_negative_take_indices(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with every constant negative ``take`` index on a static axis made the
    non-negative one torch reads, and how many ``take`` calls changed.
    """
    return _rewrite_calls(mod, "relax.take", _wrapped_indices, _taken_at)


def _calls(mod: tvm.IRModule, name: str) -> list[relax.Call]:
    """Every call of the operator ``name`` in ``mod``'s Relax functions."""
    found = []

    def visit(expr):
        if op_name(expr) == name:
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


def _taken_at(call: relax.Call, indices: np.ndarray) -> relax.Expr:
    """``call``, a ``take``, of ``indices`` (:func:`_wrapped_indices`)."""
    return relax.op.take(call.args[0], relax.const(indices), int(call.attrs.axis),
                         call.attrs.mode)


def _rewrite_calls(mod: tvm.IRModule, name: str, fix: Callable[[relax.Call], Any],
                   rebuild: Callable[[relax.Call, Any], relax.Expr]
                   ) -> tuple[tvm.IRModule, int]:
    """``mod`` with each call of operator ``name`` for which ``fix(call)`` is not ``None``
    rebuilt as ``rebuild(call, fix(call))``, and how many were; ``mod`` itself when none
    is (one look at the calls, no rebuild of the module).
    """
    if all(fix(call) is None for call in _calls(mod, name)):
        return mod, 0
    rewriter = _CallRewriter(mod, name, fix, rebuild)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get(), rewriter.changed


@mutator
class _CallRewriter(PyExprMutator):
    """:func:`_rewrite_calls`' walk of a module."""

    def __init__(self, mod: tvm.IRModule, name: str, fix: Callable[[relax.Call], Any],
                 rebuild: Callable[[relax.Call, Any], relax.Expr]):
        super().__init__(mod)
        self.name, self.fix, self.rebuild = name, fix, rebuild
        self.changed = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) == self.name:
            found = self.fix(call)
            if found is not None:
                self.changed += 1
                return self.rebuild(call, found)
        return call
