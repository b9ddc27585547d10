"""Example graphs of the quantize family: QDQ kernels as ``from_onnx`` imports them, and
quantisation written out by hand.

The rules' ``example()``, the tests and ``patternkit verify`` build their inputs here.  The
QDQ examples follow what TVM's ``from_onnx`` makes of onnxruntime's ``quantize_static``
output (:mod:`patternkit.models.onnx_qdq`): ``R.dequantize`` of the int8 / uint8 input and
of the int8 weight (per tensor, or per output channel), the float op, the bias (for the
conv, an int32 bias dequantized per channel and reshaped to ``(1, C, 1, 1)``), the
activation, then ``R.quantize`` of the output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.ir import from_expr

#: The integer ranges of the quantised dtypes.
QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


def _q(rng: np.random.Generator, shape: tuple, dtype: str) -> relax.Expr:
    low, high = QRANGE[dtype]
    return relax.const(rng.integers(low, high + 1, shape).astype(dtype))


def _qparams(dtype: str, scale: float | np.ndarray, zero_point: int | np.ndarray
             ) -> tuple[relax.Expr, relax.Expr]:
    return (relax.const(np.asarray(scale, "float32")),
            relax.const(np.asarray(zero_point, dtype)))


def qdq_kernel(op: str = "conv2d", dtype: str = "int8", bias: bool | str = True,
               activation: str = "none", weight_scale: str = "per_channel",
               weight_axis: str = "output", out_scale: str = "per_tensor",
               seed: int = 0) -> tvm.IRModule:
    """``main(xq)``: ``dequantize(xq) -> op(., dequantize(w)) -> [bias] -> [activation] ->
    quantize``, as ``from_onnx`` imports a QDQ model.

    Parameters
    ----------
    op : {"conv2d", "matmul"}
        ``conv2d`` of ``(1, 3, 8, 8)`` by ``(8, 3, 3, 3)`` (NCHW / OIHW), or ``matmul`` of
        ``(1, 24)`` by ``(24, 8)``.
    dtype : {"int8", "uint8", "int16"}
        The activations' quantised dtype (the weight is int8).
    bias, activation
        A per-channel bias (``True``; conv: int32 dequantized, reshaped; matmul: a float
        constant), none (``False``), a constant of the output's full shape (``"full"``) or
        one that varies along the conv output's third axis, H (``"height"``);
        ``"relu"``, ``"relu6"`` (``clip(0, 6)``) or ``"none"``.
    weight_scale, weight_axis
        ``"per_tensor"`` or ``"per_channel"``, one scale per ``"output"`` channel (the
        conv's axis 0, the matmul's 1) or per ``"input"`` channel.
    out_scale
        ``"per_tensor"`` or ``"per_channel"`` (one output scale per channel).
    """
    rng = np.random.default_rng(seed)
    x_shape, w_shape, channel_axis = {"conv2d": ((1, 3, 8, 8), (8, 3, 3, 3), 0),
                                      "matmul": ((1, 24), (24, 8), 1)}[op]
    out_channels = 8
    zero = {"int8": -3, "uint8": 120, "int16": 7}[dtype]
    xq = relax.Var("xq", relax.TensorType(x_shape, dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [xq]):
        with bb.dataflow():
            x = bb.emit(relax.op.dequantize(xq, *_qparams(dtype, 0.02, zero), axis=1))
            axis = channel_axis if weight_axis == "output" else 1 - channel_axis
            w_scale: Any = (0.01 if weight_scale == "per_tensor"
                            else rng.uniform(0.005, 0.02, w_shape[axis]))
            w = bb.emit(relax.op.dequantize(_q(rng, w_shape, "int8"),
                                            *_qparams("int8", w_scale, 0 * np.ones_like(
                                                w_scale, dtype="int64")), axis=axis))
            y = bb.emit(relax.op.nn.conv2d(x, w) if op == "conv2d" else relax.op.matmul(x, w))
            if bias in ("full", "height"):
                shape = [int(d) for d in y.ty.shape]
                if bias == "height":  # varies along the conv output's H, 1 elsewhere
                    shape = [d if i == 2 else 1 for i, d in enumerate(shape)]
                b = relax.const(rng.uniform(-0.1, 0.1, shape).astype("float32"))
                y = bb.emit(relax.op.add(y, b))
            elif bias:
                if op == "conv2d":
                    b = bb.emit(relax.op.dequantize(
                        relax.const(rng.integers(-500, 500, out_channels).astype("int32")),
                        relax.const(rng.uniform(1e-4, 4e-4, out_channels).astype("float32")),
                        relax.const(0, "int32"), axis=0))
                    b = bb.emit(relax.op.reshape(b, (1, out_channels, 1, 1)))
                else:
                    b = relax.const(rng.uniform(-0.1, 0.1, out_channels).astype("float32"))
                y = bb.emit(relax.op.add(y, b))
            if activation == "relu":
                y = bb.emit(relax.op.nn.relu(y))
            elif activation == "relu6":
                y = bb.emit(relax.op.clip(y, 0, 6))
            scale = 0.05 if out_scale == "per_tensor" else np.full(out_channels, 0.05)
            points = zero if out_scale == "per_tensor" else np.full(out_channels, zero)
            out = bb.emit_output(relax.op.quantize(y, *_qparams(dtype, scale, points),
                                                   axis=1, out_dtype=dtype))
        bb.emit_func_output(out)
    return bb.get()


def _per_tensor_or_channel(value: float, per_channel: bool | str, dtype: str) -> relax.Expr:
    """``value``, or (``per_channel``) eight values around it, one per column."""
    values = value * np.linspace(0.5, 1.5, 8) if per_channel else np.asarray(value)
    return relax.const(values.astype(dtype))


def _zero_point(value: float, per_channel: bool | str, dtype: str) -> relax.Expr:
    """``value``, or (``per_channel == "zero_point"``) whole numbers around it, per column."""
    values = value + np.arange(8) if per_channel == "zero_point" else np.asarray(value)
    return relax.const(values.astype(dtype))


def dequantize_written_out(dtype: str = "int8", zero_point: float | None = 3.0,
                           order: str = "centred_first", float_dtype: str = "float32",
                           per_channel: bool | str = False) -> tvm.IRModule:
    """``(q.astype(float_dtype) - zero_point) * scale`` of ``q: (n, 8)`` of ``dtype``, as
    the torch importer writes torch's ``(q.float() - zp) * scale`` (``order="scale_first"``:
    ``scale * (...)``); ``per_channel`` gives one scale per column (``"zero_point"``: one
    zero point per column too); ``zero_point=None`` subtracts none
    (``q.astype(float_dtype) * scale``, symmetric).
    """
    q = relax.Var("q", relax.TensorType((tvm.tirx.Var("n", "int64"), 8), dtype))
    centred = relax.op.astype(q, float_dtype)
    if zero_point is not None:
        centred = centred - _zero_point(zero_point, per_channel, float_dtype)
    scale = _per_tensor_or_channel(0.05, per_channel, float_dtype)
    return from_expr(centred * scale if order == "centred_first" else scale * centred)


def quantize_written_out(dtype: str = "int8", zero_point: float = 3.0, clip: str = "full",
                         float_dtype: str = "float32", per_channel: bool | str = False
                         ) -> tvm.IRModule:
    """``clip(round(x / scale) + zero_point, qmin, qmax).astype(dtype)`` of ``x: (n, 8)``,
    as the torch importer writes ``torch.clamp(torch.round(x / s) + zp, qmin,
    qmax).to(dtype)``; ``clip="symmetric"`` clips int8 to ``[-127, 127]`` (uint8 to
    ``[1, 255]``); ``per_channel`` gives one scale per column (``"zero_point"``: one zero
    point per column too).
    """
    x = relax.Var("x", relax.TensorType((tvm.tirx.Var("n", "int64"), 8), float_dtype))
    low, high = QRANGE[dtype]
    if clip == "symmetric":
        low = low + 1
    scale = _per_tensor_or_channel(0.05, per_channel, float_dtype)
    shifted = (relax.op.round(relax.op.divide(x, scale))
               + _zero_point(zero_point, per_channel, float_dtype))
    return from_expr(relax.op.astype(relax.op.clip(shifted, low, high), dtype))
