"""``dequantize -> conv2d | matmul -> [bias] [activation] -> quantize``: a quantised kernel,
as one composite an int8 compiler can take.

In a QDQ graph the arithmetic stays in float between ``R.dequantize`` and ``R.quantize``;
a compiler with integer kernels (TensorRT, QNN, CMSIS-NN, the NPUs) wants the whole
sandwich, whose inputs are the 8-bit tensors and their scales and zero points.
:class:`QdqComposite` is one class for both ops (``op=``), named ``<compiler>.qdq_conv2d``
/ ``<compiler>.qdq_matmul``.  It must come before the float conv and matmul composites,
which would otherwise take the op alone.

The guards, each refusing with its reason: the dequantized input and weight and the
quantized output are 8-bit (``int8`` / ``uint8``); the input and the output are
quantised per tensor (one scale: an integer kernel rescales its accumulator once); the
weight per tensor or per output channel (the conv's ``O`` axis, the matmul weight's last
axis), the only scales an integer kernel folds into its output; the added tensor is a
per-channel bias of the op's output (or one value).  The bias is read as it comes (for
onnxruntime's models, an int32 tensor dequantized and reshaped outside the composite).
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm

from patternkit.dpl import DFPattern, is_constant, is_op, wildcard
from patternkit.engine import CompositeRule, RoleMatch, reject
from patternkit.ir import NotPerChannel, per_channel_axis, prove_equal, static_shape, type_of

from .examples import qdq_kernel

#: The quantised dtypes an integer kernel takes.
EIGHT_BIT = ("int8", "uint8")
#: The ops a QDQ composite wraps: op name -> the Relax operator.
QDQ_OPS = {"conv2d": "nn.conv2d", "matmul": "matmul"}


def _check_eight_bit(dtype: str, what: str, at: Any) -> None:
    if dtype not in EIGHT_BIT:
        raise reject(f"{what} is {dtype}, not an 8-bit quantised tensor (int8 or uint8)", at=at)


def _one_scale(scale: Any) -> bool:
    shape = static_shape(type_of(scale))
    return shape is not None and all(prove_equal(d, 1) for d in shape)


def _check_per_tensor(scale: Any, what: str) -> None:
    if not _one_scale(scale):
        raise reject(f"{what} is quantised with scales of shape "
                     f"{static_shape(type_of(scale))}, not one scale: an integer kernel "
                     f"rescales its accumulator by one number", at=scale)


class QdqComposite(CompositeRule):
    """``dequantize -> conv2d | matmul -> [bias] [relu | clip] -> quantize`` as one composite.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that will take it).
    op : {"conv2d", "matmul"}
        The float op between the dequantizations and the quantization.
    """

    def __init__(self, compiler: str = "byoc", op: str = "conv2d"):
        super().__init__(compiler)
        if op not in QDQ_OPS:
            raise ValueError(f"QdqComposite: op must be one of {tuple(QDQ_OPS)}, found {op!r}")
        self.op = op
        self.pattern_name = f"qdq_{op}"
        self.x_q, self.x_scale = wildcard(), wildcard()
        self.w_q, self.w_scale = wildcard(), wildcard()
        self.weight = is_op("dequantize")(self.w_q, self.w_scale, wildcard())
        self.core = is_op(QDQ_OPS[op])(is_op("dequantize")(self.x_q, self.x_scale, wildcard()),
                                       self.weight)
        self.bias = wildcard()
        self.add = is_op("add")(self.core, self.bias)
        body = self.add | self.core
        activated = (is_op("nn.relu")(body) | is_op("clip")(body, is_constant(), is_constant())
                     | body)
        self.out_scale = wildcard()
        self.pattern: DFPattern = is_op("quantize")(activated, self.out_scale, wildcard())

    def check(self, match: RoleMatch) -> Any:
        """Accept 8-bit tensors with per-tensor input and output scales, a per-tensor or
        per-output-channel weight scale, and a per-channel bias.
        """
        _check_eight_bit(str(type_of(match.x_q).dtype), "the dequantized input", match.x_q)
        _check_eight_bit(str(type_of(match.w_q).dtype), "the dequantized weight", match.w_q)
        _check_eight_bit(str(match.root.attrs.out_dtype), "the quantized output", match.root)
        _check_per_tensor(match.x_scale, "the input")
        _check_per_tensor(match.out_scale, "the output")
        weight_ndim = type_of(match.w_q).ndim
        out_axis = (str(match.core.attrs.kernel_layout).index("O") if self.op == "conv2d"
                    else weight_ndim - 1)
        axis = int(match.weight.attrs.axis) % weight_ndim
        if not _one_scale(match.w_scale) and axis != out_axis:
            return reject(f"the weight is quantised per channel along axis {axis}, not its "
                          f"output channels (axis {out_axis}): an integer kernel cannot "
                          f"fold those scales into its output", at=match.weight)
        if "add" in match:
            out_shape = static_shape(type_of(match.core))
            bias_shape = static_shape(type_of(match.bias))
            channel = (str(match.core.attrs.out_layout).index("C") if self.op == "conv2d"
                       else len(out_shape or ()) - 1)
            if bias_shape is not None and all(prove_equal(d, 1) for d in bias_shape):
                return True
            try:
                found = per_channel_axis(bias_shape, out_shape or (), name="the added tensor",
                                         of=f"the {self.op} output")
            except NotPerChannel as why:
                return reject(f"the added tensor is not a per-channel bias: {why}",
                              at=match.bias)
            if found != channel:
                return reject(f"the added tensor varies along axis {found}, not the channel "
                              f"axis {channel}: not a bias", at=match.bias)
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A QDQ kernel of this variant's op: :func:`.examples.qdq_kernel` with ``knobs``."""
        return qdq_kernel(op=self.op, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both 8-bit dtypes (int16: refused), with and without the bias, each activation,
        per-tensor and per-channel weights, a per-channel weight scale on the input-channel
        axis (refused), a bias that is a full tensor or varies along H (refused for the
        conv; the matmul's output has no H), a per-channel output scale
        (refused).
        """
        return {"dtype": ("int8", "uint8", "int16"), "bias": (True, False, "full", "height"),
                "activation": ("none", "relu", "relu6"),
                "weight_scale": ("per_channel", "per_tensor"), "weight_axis": ("output", "input"),
                "out_scale": ("per_tensor", "per_channel"), "seed": (0, 1)}
