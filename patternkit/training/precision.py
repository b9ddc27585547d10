"""``as_float64``: a function recomputed in float64, the reference for finite differences.

Central differences in float32 lose most digits to rounding (``f(x+h) - f(x-h)`` cancels);
in float64 a step of 1e-6 gives about nine correct digits.  The same copy is the
reference that arbitrates a float16, bfloat16 or float32 model's numeric check
(:mod:`patternkit.app.precision`).

The copy retypes every floating parameter and constant (``float16``, ``bfloat16`` and
``float32`` alike) and re-emits every binding through a ``BlockBuilder``, which infers the
new types; ops that carry a float dtype as an attribute are rebuilt by name (``astype``;
``zeros``/``ones``/``full`` ...), anything else that names a float dtype is refused by
name rather than silently computed in it.  The result is checked: a floating tensor that
is not float64 anywhere in it is an error, since a "float64" reference that still rounds
in bfloat16 somewhere proves nothing.

TVM 0.27 has no float64 kernel for ``layer_norm``, ``group_norm`` and ``instance_norm``
(TOPI takes float32 and float16 only; ``docs/tvm-bugs.md``): the copy writes them out in
``mean``/``variance``/``rsqrt`` arithmetic, which builds in float64 (:data:`WRITTEN_OUT`).
Every other op of the library's models builds in float64 on llvm, ``rms_norm`` and
``attention`` included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import GradientError
from ..ir import const_value, is_tensor_constant, op_name, type_of
from ..ir.dtypes import is_float_dtype

_WIDE = "float64"
#: Fused ops whose TOPI kernels take float32 and float16 only: a float64 copy would not
#: build, so :func:`as_float64` writes them out (:func:`_written_out_norm`).
NO_FLOAT64_KERNEL = frozenset({"relax.nn.layer_norm", "relax.nn.group_norm",
                               "relax.nn.instance_norm"})
#: The ops of :data:`NO_FLOAT64_KERNEL` that :func:`as_float64` writes out: all of them.
WRITTEN_OUT = NO_FLOAT64_KERNEL


def _wide_type(ty: Any) -> Any:
    if isinstance(ty, relax.TensorType) and is_float_dtype(str(ty.dtype)):
        if ty.shape is not None:
            return relax.TensorType(ty.shape, _WIDE)
        return relax.TensorType(dtype=_WIDE, ndim=ty.ndim)
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([_wide_type(f) for f in ty.fields])
    return ty


def as_float64(func: relax.Function, name: str = "main") -> relax.Function:
    """``func`` with every floating tensor in float64 (integers and shapes unchanged).

    Raises :class:`~patternkit.errors.GradientError` naming the binding when an op cannot
    be recomputed in float64, or when a floating tensor of the copy is still narrower.
    """
    params = [relax.Var(p.name, _wide_type(type_of(p))) for p in func.params]
    env: dict[Any, Any] = dict(zip(func.params, params))
    bb = relax.BlockBuilder()
    _BUILDERS.append(bb)
    try:
        wide = _copy(func, name, bb, params, env)
    finally:
        _BUILDERS.pop()
    _assert_float64(wide, name)
    return wide


#: The builder of the copy in progress (a stack: a copy never starts another, but the
#: stack keeps ``_widen``'s signature as it was); norms written out emit through it.
_BUILDERS: list[relax.BlockBuilder] = []


def _copy(func: relax.Function, name: str, bb: relax.BlockBuilder, params: list,
          env: dict) -> relax.Function:
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
        if is_float_dtype(str(value.dtype)) or value.dtype.kind == "f":
            return relax.const(np.asarray(value, dtype=np.float64), _WIDE)
        return expr
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_widen(f, env, func_name, binding) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_widen(expr.tuple_value, env, func_name, binding), expr.index)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        args = [_widen(a, env, func_name, binding) for a in expr.args]
        if op_name(expr) in WRITTEN_OUT:
            return _written_out_norm(expr, args, _BUILDERS[-1])
        dtype = getattr(expr.attrs, "dtype", None) if expr.attrs is not None else None
        if dtype is not None and is_float_dtype(str(dtype)):
            return _rebuild_with_dtype(expr, args, func_name, binding)
        out_dtype = getattr(expr.attrs, "out_dtype", None) if expr.attrs is not None else None
        if out_dtype is not None and is_float_dtype(str(out_dtype)):
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
    writes ``out_dtype="float32"`` on every conv2d), accumulating in float64 instead.
    """
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


def _written_out_norm(call: relax.Call, args: list, bb: relax.BlockBuilder) -> Any:
    """``layer_norm``, ``instance_norm`` or ``group_norm`` as ``(x - mean) * rsqrt(var +
    eps) * gamma + beta`` over the same axes, in the copy's float64.

    The statistics are the population mean and variance, as TOPI's kernels compute them.
    ``gamma`` and ``beta`` run along the normalised axes (layer norm) or the channel axis
    (instance and group norm) and get unit dimensions everywhere else.  A group norm
    splits the channel axis into ``(groups, channels per group)`` and normalises over the
    second and the spatial axes, then takes the input's shape back.
    """
    name, attrs = op_name(call), call.attrs
    x, gamma, beta = args
    ndim = len(type_of(bb.normalize(x)).shape)
    axes = sorted(int(a) % ndim for a in attrs.axes)
    eps = relax.const(float(attrs.epsilon), _WIDE)
    if name == "relax.nn.layer_norm":
        data, stat_axes, along = x, axes, axes
    else:
        channel = int(attrs.channel_axis) % ndim
        along = [channel]
        data, stat_axes = x, axes
        if name == "relax.nn.group_norm":
            shape = list(type_of(bb.normalize(x)).shape)
            groups = int(attrs.num_groups)
            split = shape[:channel] + [groups, shape[channel] // groups] + shape[channel + 1:]
            data = bb.emit(relax.op.reshape(x, split))
            stat_axes = [channel + 1] + [a + (a > channel) for a in axes]
    mean = bb.emit(relax.op.mean(data, stat_axes, keepdims=True))
    var = bb.emit(relax.op.variance(data, stat_axes, keepdims=True))
    out = bb.emit(relax.op.multiply(relax.op.subtract(data, mean),
                                    relax.op.rsqrt(relax.op.add(var, eps))))
    if data is not x:
        out = bb.emit(relax.op.reshape(out, type_of(bb.normalize(x)).shape))
    others = [d for d in range(ndim) if d not in along]
    if attrs.scale:
        out = bb.emit(relax.op.multiply(out, relax.op.expand_dims(gamma, others)
                                        if others and _ndim(bb, gamma) < ndim else gamma))
    if attrs.center:
        out = relax.op.add(out, relax.op.expand_dims(beta, others)
                           if others and _ndim(bb, beta) < ndim else beta)
    return out


def _ndim(bb: relax.BlockBuilder, expr: Any) -> int:
    return len(type_of(bb.normalize(expr)).shape)


def _assert_float64(func: relax.Function, name: str) -> None:
    """Raise naming the first binding (or parameter) of ``func`` whose floating tensors are
    narrower than float64: the copy is a reference only if it is float64 throughout.
    """
    def narrow(ty: Any) -> str | None:
        if isinstance(ty, relax.TupleType):
            return next((d for d in map(narrow, ty.fields) if d), None)
        dtype = str(getattr(ty, "dtype", ""))
        return dtype if is_float_dtype(dtype) and dtype != _WIDE else None

    found: list[str] = []

    def visit(expr: Any) -> None:
        if found or not (isinstance(expr, relax.Var) or is_tensor_constant(expr)):
            return
        dtype = narrow(type_of(expr))
        if dtype:
            what = f"binding {expr.name_hint}" if isinstance(expr, relax.Var) else "a constant"
            found.append(f"{what} is {dtype}")

    relax.analysis.post_order_visit(func, visit)
    if found:
        raise GradientError(f"{name}: the float64 copy is not float64 throughout: {found[0]}")
