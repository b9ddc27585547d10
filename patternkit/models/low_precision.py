"""Converters handed to TVM 0.27's torch importer so that a float16 model stays float16.

``from_exported_program`` converts every matmul, linear and convolution with
``out_dtype="float32"``, whatever its inputs' dtype, and then adds the bias in the bias's
dtype (``docs/tvm-bugs.md``, "every matmul, linear and conv of a float16 model returns
float32").  A float16 linear or conv with a bias therefore fails to import ("Binary
operators must have the same datatype"), and one without a bias hands float32 to the rest
of the model, which fails at the next layer norm or residual add, or silently runs the
model in float32.  That is why only Llama (no biases) imported in float16.

:class:`LowPrecisionConverters` keeps TVM's conversion for every call whose input is not
a low-precision float (a float32 model imports exactly as without it).  For a float16
or bfloat16 input it emits what TVM's own ``ToMixedPrecision`` writes: the same
operator, accumulating in float32 (``out_dtype="float32"``, as TVM's converter asks),
cast back to the input's dtype, then the bias added in that dtype.  Torch computes the
same sums in float32 and rounds once, bias included; the extra rounding before the bias
is within float16's tolerance, and it is the form backend pattern tables expect.
Transposed convolutions (``conv_transpose1d``/``conv_transpose2d``, and ``convolution``
with ``transposed=True``, what ``torch.export``'s decomposition leaves of them) are
converted the same way: TVM's converter adds a float16 bias to their float32 result too.

Pass :meth:`~LowPrecisionConverters.convert_map` as ``custom_convert_map``;
:meth:`~LowPrecisionConverters.notes` says what was converted.  3-D transposed
convolutions (``conv_transpose3d``) are left to TVM, which refuses them in every dtype.
``baddbmm`` needs nothing: TVM converts it in the input's dtype.
"""

from __future__ import annotations

from typing import Any, Callable

from tvm import relax

from ..ir import dtype_of, type_of
from .fallback_converters import Converter, FallbackConverters

#: The dtype TVM's converters accumulate in.
ACCUMULATE = "float32"
#: Input dtypes converted here; any other dtype goes through TVM's own converter.
LOW_PRECISION = frozenset({"float16", "bfloat16"})
#: Torch ops (their ``target`` names in an exported program) this module converts.
CONVERTED_OPS = ("linear.default", "addmm.default", "mm.default", "bmm.default",
                 "matmul.default", "conv1d.default", "conv2d.default", "conv3d.default",
                 "convolution.default", "conv_transpose1d.default", "conv_transpose2d.input")

class LowPrecisionConverters(FallbackConverters):
    """The ``custom_convert_map`` of one import; counts what it converted, per torch op."""

    def convert_map(self) -> dict[str, Converter]:
        """Torch op -> converter, for ``from_exported_program(custom_convert_map=...)``."""
        return {op: self._converter(op) for op in CONVERTED_OPS}

    def notes(self) -> list[str]:
        """One line per converted torch op (empty when the model has no low-precision
        matmul or conv), in the words ``patternkit run`` logs.
        """
        return [f"{count} {op} kept in the input's dtype (TVM's torch importer returns "
                f"float32)" for op, count in sorted(self.converted.items())]

    def _converter(self, op: str) -> Converter:
        convert = _LOW_PRECISION_CONVERTERS[op]

        def converter(node: Any, importer: Any) -> relax.Var:
            dtype = _input_dtype(op, node, importer)
            if dtype not in LOW_PRECISION:
                return self._original(importer, op)(node)
            result = convert(node, importer, dtype)
            if result is None:  # a form left to TVM (a 3-D transposed convolution)
                return self._original(importer, op)(node)
            self.converted[op.split(".")[0]] += 1
            return result

        return converter


def _input_dtype(op: str, node: Any, importer: Any) -> str | None:
    """The dtype of the call's data input (``addmm``'s second argument: its first is the
    bias), or None when it is not a tensor.
    """
    position = 1 if op == "addmm.default" else 0
    arg = importer.env.get(node.args[position]) if len(node.args) > position else None
    if not isinstance(arg, relax.Expr):
        return None
    return dtype_of(type_of(arg))


def _accumulated(builder: relax.BlockBuilder, call: relax.Expr, dtype: str) -> relax.Var:
    """``astype(call, dtype)``, ``call`` accumulating in float32."""
    return builder.emit(relax.op.astype(builder.emit(call), dtype))


def _linear(node: Any, importer: Any, dtype: str) -> relax.Var:
    args = importer.retrieve_args(node)
    bias = args[2] if len(args) > 2 else None
    builder = importer.block_builder
    out = _accumulated(builder, relax.op.linear(args[0], args[1], None, ACCUMULATE), dtype)
    return out if importer._is_no_bias(bias) else builder.emit(relax.op.add(out, bias))


def _addmm(node: Any, importer: Any, dtype: str) -> relax.Var:
    """``beta * bias + alpha * (x @ w)``: what ``aten.linear`` of a 2-D input decomposes
    into, and what GPT-2's ``Conv1D`` calls.
    """
    bias, x, weight = (importer.env[arg] for arg in node.args[:3])
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    builder = importer.block_builder
    out = None
    if alpha != 0:
        out = _accumulated(builder, relax.op.matmul(x, weight, out_dtype=ACCUMULATE), dtype)
        if alpha != 1:
            out = builder.emit(relax.op.multiply(out, relax.const(alpha, dtype)))
    if beta != 0:
        if beta != 1:
            bias = builder.emit(relax.op.multiply(bias, relax.const(beta, bias.ty.dtype)))
        out = bias if out is None else builder.emit(relax.op.add(bias, out))
    return out


def _matmul(node: Any, importer: Any, dtype: str) -> relax.Var | None:
    """``mm``, ``bmm`` and ``matmul`` of two tensors of the same dtype."""
    lhs, rhs = (importer.env.get(arg) for arg in node.args[:2])
    if not isinstance(rhs, relax.Expr) or dtype_of(type_of(rhs)) != dtype:
        return None
    return _accumulated(importer.block_builder,
                        relax.op.matmul(lhs, rhs, out_dtype=ACCUMULATE), dtype)


#: Convolution rank (spatial dims + 2) -> (Relax op, data layout, kernel layout).
_CONVOLUTIONS = {3: (relax.op.nn.conv1d, "NCW", "OIW"),
                 4: (relax.op.nn.conv2d, "NCHW", "OIHW"),
                 5: (relax.op.nn.conv3d, "NCDHW", "OIDHW")}


def _conv(node: Any, importer: Any, dtype: str) -> relax.Var | None:
    """``conv1d``/``conv2d``/``conv3d``: (x, weight, bias, stride, padding, dilation,
    groups).
    """
    return _any_conv(node, importer, dtype, general=False)


def _convolution(node: Any, importer: Any, dtype: str) -> relax.Var | None:
    """``convolution``: (x, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups), what ``torch.export``'s decomposition leaves of a conv.
    """
    return _any_conv(node, importer, dtype, general=True)


def _any_conv(node: Any, importer: Any, dtype: str, general: bool) -> relax.Var | None:
    args = importer.retrieve_args(node)
    if general and len(args) > 6 and args[6]:
        return _transposed(importer, dtype, [*args[:6], *args[7:9]])
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    stride, padding, dilation = (args[i] if len(args) > i else default
                                 for i, default in ((3, 1), (4, 0), (5, 1)))
    group_at = 8 if general else 6
    groups = args[group_at] if len(args) > group_at else 1
    rank = len(importer.shape_of(x))
    if rank not in _CONVOLUTIONS:
        return None
    conv, data_layout, kernel_layout = _CONVOLUTIONS[rank]
    builder = importer.block_builder
    out = _accumulated(builder, conv(x, weight, strides=stride, padding=padding,
                                     dilation=dilation, groups=groups,
                                     data_layout=data_layout, kernel_layout=kernel_layout,
                                     out_dtype=ACCUMULATE), dtype)
    return _channel_bias(importer, out, bias, rank)


def _channel_bias(importer: Any, out: relax.Var, bias: Any, rank: int) -> relax.Var:
    """``out`` plus a per-channel ``bias`` (axis 1 of a rank-``rank`` result), if any."""
    if importer._is_no_bias(bias):
        return out
    channels = relax.op.reshape(bias, (1, -1) + (1,) * (rank - 2))
    return importer.block_builder.emit(relax.op.add(out, channels))


#: Transposed convolution rank -> (Relax op, data layout, kernel layout).
_TRANSPOSED = {3: (relax.op.nn.conv1d_transpose, "NCW", "IOW"),
               4: (relax.op.nn.conv2d_transpose, "NCHW", "IOHW")}


def _conv_transpose(node: Any, importer: Any, dtype: str) -> relax.Var | None:
    """``conv_transpose1d``/``conv_transpose2d``: (x, weight, bias, stride, padding,
    output_padding, groups, dilation).
    """
    args = importer.retrieve_args(node)
    defaults = (None, None, None, 1, 0, 0, 1, 1)
    x, weight, bias, stride, padding, output_padding, groups, dilation = (
        args[i] if len(args) > i else default for i, default in enumerate(defaults))
    return _transposed(importer, dtype, [x, weight, bias, stride, padding, dilation,
                                         output_padding, groups])


def _transposed(importer: Any, dtype: str, args: list[Any]) -> relax.Var | None:
    """A transposed convolution given ``convolution``'s arguments without ``transposed``:
    (x, weight, bias, stride, padding, dilation, output_padding, groups); None for a rank
    TVM has no transposed convolution of.
    """
    defaults = (None, None, None, 1, 0, 1, 0, 1)
    x, weight, bias, stride, padding, dilation, output_padding, groups = (
        args[i] if len(args) > i else default for i, default in enumerate(defaults))
    rank = len(importer.shape_of(x))
    if rank not in _TRANSPOSED:
        return None
    conv, data_layout, kernel_layout = _TRANSPOSED[rank]
    builder = importer.block_builder
    out = _accumulated(builder, conv(x, weight, strides=stride, padding=padding,
                                     output_padding=output_padding, dilation=dilation,
                                     groups=groups, data_layout=data_layout,
                                     kernel_layout=kernel_layout, out_dtype=ACCUMULATE),
                       dtype)
    return _channel_bias(importer, out, bias, rank)


_LOW_PRECISION_CONVERTERS: dict[str, Callable[[Any, Any, str], relax.Var | None]] = {
    "linear.default": _linear, "addmm.default": _addmm, "mm.default": _matmul,
    "bmm.default": _matmul, "matmul.default": _matmul, "conv1d.default": _conv,
    "conv2d.default": _conv, "conv3d.default": _conv, "convolution.default": _convolution,
    "conv_transpose1d.default": _conv_transpose, "conv_transpose2d.input": _conv_transpose}
