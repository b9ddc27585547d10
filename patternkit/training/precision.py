"""``as_float64``: a function recomputed in float64, the reference for finite differences.

Central differences in float32 lose most digits to rounding (``f(x+h) - f(x-h)`` cancels);
in float64 a step of 1e-6 gives about nine correct digits.  The copy retypes float32
parameters and constants and re-emits every binding through a ``BlockBuilder``, which
infers the new types; ops that carry a float dtype as an attribute are rebuilt by name
(``astype``; ``zeros``/``ones``/``full`` ...), anything else that names float32 is refused
by name rather than silently computed in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import GradientError
from ..ir import const_value, is_tensor_constant, op_name, type_of

_WIDE = "float64"
#: Fused ops whose TOPI kernels take float32 and float16 only: a float64 copy would not
#: build, so :func:`as_float64` refuses them by name (``layernorm.expand`` writes layer
#: norms out).
NO_FLOAT64_KERNEL = frozenset({"relax.nn.layer_norm", "relax.nn.group_norm",
                               "relax.nn.instance_norm"})


def _wide_type(ty: Any) -> Any:
    if isinstance(ty, relax.TensorType) and str(ty.dtype).startswith("float"):
        if ty.shape is not None:
            return relax.TensorType(ty.shape, _WIDE)
        return relax.TensorType(dtype=_WIDE, ndim=ty.ndim)
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([_wide_type(f) for f in ty.fields])
    return ty


def as_float64(func: relax.Function, name: str = "main") -> relax.Function:
    """``func`` with every floating tensor in float64 (integers and shapes unchanged)."""
    params = [relax.Var(p.name, _wide_type(type_of(p))) for p in func.params]
    env: dict[Any, Any] = dict(zip(func.params, params))
    bb = relax.BlockBuilder()
    with bb.function(name, params):
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                with bb.dataflow():
                    _emit_block(bb, block, env, name, dataflow=True)
            else:
                _emit_block(bb, block, env, name, dataflow=False)
        bb.emit_func_output(_widen(func.body.body, env, name, None))
    return bb.get()[name]


def _emit_block(bb: relax.BlockBuilder, block: Any, env: dict, name: str, dataflow: bool) -> None:
    for binding in block.bindings:
        value = _widen(binding.value, env, name, binding)
        is_output = not isinstance(binding.var, relax.DataflowVar)
        env[binding.var] = bb.emit_output(value) if dataflow and is_output else bb.emit(value)


def _widen(expr: Any, env: dict, func_name: str, binding: Any) -> Any:
    if tvm.ir.is_prim_var(expr):  # a symbolic variable passed as a value: R.arange(0, n)
        return expr
    if isinstance(expr, relax.Var):
        return env[expr]
    if is_tensor_constant(expr):
        value = const_value(expr)
        if value.dtype.kind == "f":
            return relax.const(value.astype(np.float64), _WIDE)
        return expr
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_widen(f, env, func_name, binding) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_widen(expr.tuple_value, env, func_name, binding), expr.index)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        if op_name(expr) in NO_FLOAT64_KERNEL:
            raise GradientError(
                f"{func_name}: cannot recompute {op_name(expr)} in float64: TVM 0.27 has no "
                f"float64 kernel for it (only float32 and float16); write it out first"
                + (f" (binding {binding.var.name})" if binding is not None else ""))
        args = [_widen(a, env, func_name, binding) for a in expr.args]
        dtype = getattr(expr.attrs, "dtype", None) if expr.attrs is not None else None
        if dtype is not None and str(dtype).startswith("float"):
            return _rebuild_with_dtype(expr, args, func_name, binding)
        out_dtype = getattr(expr.attrs, "out_dtype", None) if expr.attrs is not None else None
        if out_dtype is not None and str(out_dtype).startswith("float"):
            return _rebuild_with_out_dtype(expr, args, func_name, binding)
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
    if not isinstance(expr, relax.Call):  # shapes, prim values, strings: no float inside
        return expr
    raise GradientError(f"{func_name}: cannot recompute {type(expr).__name__} in float64"
                        + (f" (binding {binding.var.name})" if binding is not None else ""))


def _rebuild_with_dtype(call: relax.Call, args: list, func_name: str, binding: Any) -> Any:
    name = op_name(call)
    if name == "relax.astype":
        return relax.op.astype(args[0], _WIDE)
    if name in ("relax.zeros", "relax.ones"):
        return getattr(relax.op, name.split(".")[-1])(args[0], _WIDE)
    if name in ("relax.full",):
        return relax.op.full(args[0], args[1], _WIDE)
    if name in ("relax.zeros_like", "relax.ones_like"):
        return getattr(relax.op, name.split(".")[-1])(args[0], _WIDE)
    if name == "relax.full_like":
        return relax.op.full_like(args[0], args[1], _WIDE)
    if name == "relax.arange":
        return relax.op.arange(*args, dtype=_WIDE)
    raise GradientError(f"{func_name}: cannot recompute {name} (dtype attribute) in float64"
                        + (f" (binding {binding.var.name})" if binding is not None else ""))


def _rebuild_with_out_dtype(call: relax.Call, args: list, func_name: str, binding: Any) -> Any:
    """A matmul or convolution whose ``out_dtype`` names a float type (the torch importer
    writes ``out_dtype="float32"`` on every conv2d), accumulating in float64 instead."""
    name = op_name(call)
    if name == "relax.matmul":
        return relax.op.matmul(args[0], args[1], out_dtype=_WIDE)
    if name in ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"):
        a = call.attrs
        conv = getattr(relax.op.nn, name.split(".")[-1])
        return conv(args[0], args[1], strides=a.strides, padding=a.padding,
                    dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                    kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=_WIDE)
    raise GradientError(f"{func_name}: cannot recompute {name} (out_dtype attribute) in "
                        "float64" + (f" (binding {binding.var.name})" if binding is not None
                                     else ""))
