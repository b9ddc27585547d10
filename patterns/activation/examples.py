"""Example graphs of the activation rules: the written-out forms frontends emit, and the
``R.nn`` calls the expansions take apart.

The rules' ``example()``, the tests and ``patternkit verify`` build their inputs here, so
:mod:`patternkit.patterns.activation` holds only what the rules recognise and produce.
The numbers are written as the exporters write them, not taken from the rules'
constants: an example that borrowed a rule's constant would still match if that
constant were wrong.
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import relax

from patternkit.engine import NoSuchExample
from patternkit.ir import from_expr


def constant(value: float, dtype: str) -> relax.Expr:
    """A scalar constant of ``dtype`` (TVM rounds the Python float; numpy has no bfloat16)."""
    return relax.const(value, dtype)


#: Shapes of the examples' ``x``: a symbolic batch and sequence (what a transformer's MLP
#: sees), static, and a vector.
SHAPES = ("batch_seq", "static", "vector")


def example_input(dtype: str = "float32", shape: str = "batch_seq") -> relax.Var:
    """``x`` of an activation example: ``(batch, seq, 16)`` with symbolic ``batch`` and
    ``seq`` (``"batch_seq"``), ``(2, 8, 16)`` (``"static"``) or ``(16,)`` (``"vector"``).
    """
    dims = {"batch_seq": (tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64"), 16),
            "static": (2, 8, 16), "vector": (16,)}[shape]
    return relax.Var("x", relax.TensorType(dims, dtype))


def gelu_written_out(dtype: str = "float32", shape: str = "batch_seq",
                     spelling: str = "half_first",
                     erf_argument: str = "multiply") -> tvm.IRModule:
    """GELU's erf form on ``x`` (see :func:`example_input`), spelled ``spelling``:

    ``"half_first"`` ``(0.5 * x) * (1 + erf)``, ``"half_last"`` ``(x * (1 + erf)) *
    0.5`` (torch's ONNX export), ``"half_inner"`` ``x * (0.5 * (1 + erf))``,
    ``"legalised"`` ``x * (0.5 + 0.5 * erf)``; the erf argument is ``x *
    0.7071...`` (``"multiply"``) or ``x / 1.4142...`` (``"divide"``).
    """
    x = example_input(dtype, shape)
    arg = (x * constant(0.5 ** 0.5, dtype) if erf_argument == "multiply"
           else relax.op.divide(x, constant(2.0 ** 0.5, dtype)))
    erf = relax.op.erf(arg)
    half, one = constant(0.5, dtype), constant(1.0, dtype)
    body = {"half_first": lambda: (x * half) * (erf + one),
            "half_last": lambda: (x * (one + erf)) * half,
            "half_inner": lambda: x * (half * (erf + one)),
            "legalised": lambda: x * (half + erf * half)}[spelling]()
    return from_expr(body)


def gelu_tanh_written_out(dtype: str = "float32", shape: str = "batch_seq",
                          cube: str = "power", cubic: float = 0.044715) -> tvm.IRModule:
    """GPT-2's GELU (``NewGELUActivation``) on ``x`` (see :func:`example_input`).

    ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + cubic * x^3)))`` as the torch importer
    writes it, ``x^3`` as ``power(x, 3)`` (``cube="power"``) or ``x * x * x``
    (``"product"``); ``cube="factored"`` writes the argument ``sqrt(2/pi) * x * (1 +
    cubic * x * x)`` (``FastGELUActivation``).  ``cubic`` other than 0.044715 is
    not GELU (the rule must refuse it).
    """
    x = example_input(dtype, shape)

    def c(value):
        return constant(value, dtype)

    if cube == "factored":
        arg = (x * c(math.sqrt(2.0 / math.pi))) * (c(1.0) + (c(cubic) * x) * x)
    else:
        x3 = relax.op.power(x, c(3.0)) if cube == "power" else (x * x) * x
        arg = (x + x3 * c(cubic)) * c(math.sqrt(2.0 / math.pi))
    return from_expr((x * c(0.5)) * (relax.op.tanh(arg) + c(1.0)))


def swish(dtype: str = "float32", shape: str = "batch_seq",
          sigmoid_of: str = "x") -> tvm.IRModule:
    """``x * sigmoid(x)`` on ``x`` (see :func:`example_input`), as the torch importer
    writes ``nn.SiLU``; ``sigmoid_of="scaled"`` gives fast-gelu's ``x * sigmoid(1.702
    * x)``, which is not swish (the rule must leave it alone).
    """
    x = example_input(dtype, shape)
    arg = x if sigmoid_of == "x" else x * constant(1.702, dtype)
    return from_expr(x * relax.op.sigmoid(arg))


def gelu_tanh_call(dtype: str = "float32", shape: str = "batch_seq") -> tvm.IRModule:
    """``R.nn.gelu_tanh(x)`` on ``x`` (see :func:`example_input`)."""
    return from_expr(relax.op.nn.gelu_tanh(example_input(dtype, shape)))


def gelu_call(dtype: str = "float32", shape: str = "batch_seq") -> tvm.IRModule:
    """``R.nn.gelu(x)`` on ``x`` (see :func:`example_input`)."""
    return from_expr(relax.op.nn.gelu(example_input(dtype, shape)))


def relu6_written_out(dtype: str = "float32", shape: str = "batch_seq",
                      spelling: str = "two_clips", upper: float = 6.0) -> tvm.IRModule:
    """relu6 on ``x`` (see :func:`example_input`) as the importers write it:
    ``"two_clips"`` ``clip(clip(x, 0, inf), -inf, 6)`` (the torch importer's ``add(x, 3)
    -> clamp`` of hard-swish), ``"min_max"`` ``minimum(maximum(x, 0), 6)``,
    ``"max_min"`` ``maximum(minimum(x, 6), 0)``.  ``upper`` other than 6 is not relu6
    (the rule must refuse it).
    """
    x = example_input(dtype, shape)
    zero, top = constant(0.0, dtype), constant(upper, dtype)
    body = {"two_clips": lambda: relax.op.clip(relax.op.clip(x, 0, math.inf), -math.inf,
                                               upper),
            "min_max": lambda: relax.op.minimum(relax.op.maximum(x, zero), top),
            "max_min": lambda: relax.op.maximum(relax.op.minimum(x, top), zero)}[spelling]()
    return from_expr(body)


def _hard_clip(x: relax.Expr, dtype: str, offset: float) -> relax.Expr:
    """``clip(x + offset, 0, 6)``: the relu6 of hard-sigmoid and hard-swish."""
    return relax.op.clip(x + constant(offset, dtype), 0, 6)


def hardsigmoid_written_out(dtype: str = "float32", shape: str = "batch_seq",
                            spelling: str = "onnx", offset: float = 3.0) -> tvm.IRModule:
    """hard-sigmoid on ``x`` (see :func:`example_input`): ``"onnx"`` ``clip(x * 0.16667
    + 0.5, 0, 1)`` (TVM's ``from_onnx`` of ``HardSigmoid``), ``"scaled"`` ``clip(x + 3,
    0, 6) * 0.16667``, ``"canonical"`` ``clip(x + 3, 0, 6) / 6`` (torch's
    ``nn.Hardsigmoid`` once relu6 is collapsed).  ``offset`` other than 3 (``"onnx"``:
    ``offset / 6`` for the 0.5) is not hard-sigmoid (the rules must refuse it).
    """
    x = example_input(dtype, shape)
    if spelling == "onnx":
        body = relax.op.clip(constant(1.0 / 6.0, dtype) * x + constant(offset / 6.0, dtype),
                             0, 1)
    elif spelling == "scaled":
        body = _hard_clip(x, dtype, offset) * constant(1.0 / 6.0, dtype)
    else:
        body = relax.op.divide(_hard_clip(x, dtype, offset), constant(6.0, dtype))
    return from_expr(body)


def hardswish_written_out(dtype: str = "float32", shape: str = "batch_seq",
                          spelling: str = "onnx", offset: float = 3.0) -> tvm.IRModule:
    """hard-swish on ``x`` (see :func:`example_input`): ``"onnx"`` ``x * (clip(x + 3, 0,
    6) / 6)`` (TVM's ``from_onnx`` of ``HardSwish``; also ``x * hardsigmoid(x)`` written
    by hand), ``"scaled"`` ``x * clip(x + 3, 0, 6) * 0.16667``, ``"canonical"`` ``x *
    clip(x + 3, 0, 6) / 6`` (torch's ``nn.Hardswish`` once relu6 is collapsed).
    ``offset`` other than 3 is not hard-swish (the rules must refuse it).
    """
    x = example_input(dtype, shape)
    clipped = _hard_clip(x, dtype, offset)
    body = {"onnx": lambda: x * relax.op.divide(clipped, constant(6.0, dtype)),
            "scaled": lambda: (x * clipped) * constant(1.0 / 6.0, dtype),
            "canonical": lambda: relax.op.divide(x * clipped, constant(6.0, dtype)),
            }[spelling]()
    return from_expr(body)


def softplus_written_out(dtype: str = "float32", shape: str = "batch_seq",
                         spelling: str = "torch", threshold: float = 20.0) -> tvm.IRModule:
    """Softplus on ``x`` (see :func:`example_input`): ``"torch"`` ``where(x * 1 >
    threshold, x, log(exp(x * 1) + 1) / 1)`` (torch.export of ``nn.Softplus``),
    ``"mish"`` the same without the ``* 1`` and ``/ 1`` (inside ``nn.Mish``), ``"onnx"``
    ``max(x, 0) + log(1 + exp(-|x|))`` (TVM's ``from_onnx`` of ``Softplus``), ``"dynamo"``
    ``where(x > threshold, x, R.nn.softplus(x))`` (the dynamo exporter's ``F.softplus``
    after ``from_onnx``).  A
    ``threshold`` other than 20 is not ``R.nn.softplus`` (the rule must refuse it).
    """
    x = example_input(dtype, shape)
    one = constant(1.0, dtype)
    if spelling == "onnx":
        body = relax.op.maximum(x, constant(0.0, dtype)) + relax.op.log(
            one + relax.op.exp(relax.op.negative(relax.op.abs(x))))
    elif spelling == "dynamo":
        body = relax.op.where(relax.op.greater(x, constant(threshold, dtype)), x,
                              relax.op.nn.softplus(x))
    else:
        scaled = x * one if spelling == "torch" else x
        log = relax.op.log(relax.op.exp(scaled) + one)
        if spelling == "torch":
            log = relax.op.divide(log, one)
        body = relax.op.where(relax.op.greater(scaled, constant(threshold, dtype)), x, log)
    return from_expr(body)


def mish_written_out(dtype: str = "float32", shape: str = "batch_seq",
                     inner: str = "softplus") -> tvm.IRModule:
    """Mish, ``x * tanh(softplus(x))``, on ``x`` (see :func:`example_input`) once softplus
    is collapsed; ``inner="log1p_exp"`` gives ``x * tanh(log(1 + exp(x)))`` (TVM's
    ``from_onnx`` of ``Mish``), ``inner="sigmoid"`` ``x * tanh(sigmoid(x))``, which is not
    Mish (the composite must refuse it).  ``"softplus_upcast"``: the softplus computed in
    float32 between casts (torch.export of a float16 / bfloat16 Mish written out; float32
    ``x`` has no such form); refusals' edges: ``"softplus_beta2_upcast"`` (beta 2) and
    ``"softplus_downcast"`` (a float32 ``x``'s softplus computed in float16).
    """
    x = example_input(dtype, shape)
    if inner.endswith("cast"):
        return from_expr(x * relax.op.tanh(_cast_softplus(x, inner)))
    inner_op = {"softplus": lambda: relax.op.nn.softplus(x),
                "log1p_exp": lambda: relax.op.log(constant(1.0, dtype) + relax.op.exp(x)),
                "sigmoid": lambda: relax.op.sigmoid(x)}[inner]()
    return from_expr(x * relax.op.tanh(inner_op))


def _cast_softplus(x: relax.Expr, inner: str) -> relax.Expr:
    """``astype(softplus(astype(x, wide)), x's dtype)`` for :func:`mish_written_out`."""
    dtype = str(x.ty.dtype)
    down = inner == "softplus_downcast"
    if down != (dtype == "float32"):
        raise NoSuchExample("a softplus between casts widens a float16 / bfloat16 x "
                            "(softplus_downcast: narrows a float32 x)")
    wide = relax.op.astype(x, "float16" if down else "float32")
    beta = 2.0 if inner == "softplus_beta2_upcast" else 1.0
    return relax.op.astype(relax.op.nn.softplus(wide, beta=beta), dtype)


def quick_gelu_written_out(dtype: str = "float32", shape: str = "batch_seq",
                           scale: float = 1.702) -> tvm.IRModule:
    """Quick-GELU, ``x * sigmoid(1.702 * x)`` (CLIP's ``QuickGELUActivation``), on ``x``
    (see :func:`example_input`); a ``scale`` other than 1.702 is not quick-GELU.
    """
    x = example_input(dtype, shape)
    return from_expr(x * relax.op.sigmoid(x * constant(scale, dtype)))


def onnx_clip_written_out(dtype: str = "float32", shape: str = "batch_seq",
                          bounds: str = "sanitised", low: float = 0.0, high: float = 6.0,
                          names: tuple[str, str] = ("maximum", "minimum"),
                          tested: float | None = None) -> tvm.IRModule:
    """``Clip(x, low, high)`` on ``x`` (see :func:`example_input`) as TVM's ``from_onnx``
    writes it: ``call_tir`` of TOPI's ``maximum`` then ``minimum`` (PrimFuncs called
    ``names``), each bound ``where(isnan(c), -+inf, c)`` (``"sanitised"``) or, after
    ``FoldConstant``, ``c`` (``"folded"``).  ``tested`` replaces the number the NaN test
    reads (a graph that is not a clip).
    """
    from tvm import topi

    x = example_input(dtype, shape)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            result: relax.Expr = x
            for value, infinity, te_op, name in ((low, -math.inf, topi.maximum, names[0]),
                                                 (high, math.inf, topi.minimum, names[1])):
                bound = constant(value, dtype)
                if bounds == "sanitised":
                    checked = constant(value if tested is None else tested, dtype)
                    bound = bb.emit(relax.op.where(bb.emit(relax.op.isnan(checked)),
                                                   constant(infinity, dtype), bound))
                result = bb.emit_te(te_op, result, bound, primfunc_name_hint=name)
            out = bb.emit_output(result)
        bb.emit_func_output(out)
    return bb.get()


def onnx_minmax_written_out(dtype: str = "float32", shape: str = "batch_seq",
                            reduce: str = "max", other: str = "scalar", axis: int = 0,
                            reduce_axis: int | None = None, keepdims: bool = False,
                            relu6: bool = False) -> tvm.IRModule:
    """ONNX ``Max(x, y)`` / ``Min(x, y)`` on ``x`` (see :func:`example_input`) as TVM's
    ``from_onnx`` writes them: both operands ``broadcast_to`` the output's shape, ``stack``
    along ``axis`` and reduced (``reduce``: ``R.max`` / ``R.min``) along ``reduce_axis``
    (default ``axis``), ``keepdims`` as given.  ``other`` is ``"scalar"`` (the number 0 for
    max, 6 for min), ``"tensor"`` (a second input of ``x``'s shape), ``"row"`` (a ``(16,)``
    input broadcast against ``x``) or ``"outer"`` (``x`` replaced: operands of shapes
    ``(4, 1)`` and ``(1, 16)``, neither of the output's shape).  ``relu6=True`` writes
    ``Min(Max(x, 0), 6)`` (torch's ``minimum(maximum(x, 0), 6)`` through the TorchScript
    exporter) and ignores ``reduce`` and ``other``.
    """
    x = example_input(dtype, shape)
    params = [x]
    if other == "tensor":
        params.append(relax.Var("y", relax.TensorType(x.ty.shape, dtype)))
    elif other == "row":
        params.append(relax.Var("y", relax.TensorType((16,), dtype)))
    elif other == "outer":
        params = [relax.Var("a", relax.TensorType((4, 1), dtype)),
                  relax.Var("b", relax.TensorType((1, 16), dtype))]
    bb = relax.BlockBuilder()

    def reduced(a: relax.Expr, b: relax.Expr, op: str, out_shape: Any) -> relax.Expr:
        parts = [bb.emit(relax.op.broadcast_to(v, out_shape)) for v in (a, b)]
        stacked = bb.emit(relax.op.stack(parts, axis=axis))
        on = axis if reduce_axis is None else reduce_axis
        return bb.emit(getattr(relax.op, op)(stacked, axis=[on], keepdims=keepdims))

    with bb.function("main", params):
        with bb.dataflow():
            if relu6:
                low = reduced(x, constant(0.0, dtype), "max", x.ty.shape)
                result = reduced(low, constant(6.0, dtype), "min", x.ty.shape)
            elif other == "outer":
                result = reduced(params[0], params[1], reduce, (4, 16))
            else:
                y = (params[1] if len(params) > 1
                     else constant(0.0 if reduce == "max" else 6.0, dtype))
                result = reduced(x, y, reduce, x.ty.shape)
            out = bb.emit_output(result)
        bb.emit_func_output(out)
    return bb.get()
