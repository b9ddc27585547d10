"""Folding an inference ``batch_norm`` into the constant weights and bias of a convolution.

:class:`BatchnormFoldIntoConv` (``conv.fold_batchnorm``) is what Relay's
``prerequisite_optimize`` did before ``MergeComposite``: the conv composites then see a
conv and a bias add where the model has a conv and a batch norm.  The constants are folded
in float64 and rounded once.  It folds into ``conv2d`` (``OIHW`` kernels), ``conv1d``
(``OIW``) and an ungrouped ``conv2d_transpose`` (``IOHW``: the output channels are the
weight's second axis); a grouped transposed conv spreads each output channel over the
groups' blocks of the weight and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import alt, is_constant, is_op, is_tuple_get_item, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import (
    NotPerChannel,
    call_args,
    const_value,
    dtype_of,
    machine_epsilon,
    per_channel_axis,
    static_shape,
    type_of,
)

from .composite import single_value
from .examples import conv_batch_norm

#: The convolutions a batch norm folds into: op -> (kernel layout, the weight's axis of
#: output channels).
FOLDABLE = {"relax.nn.conv2d": ("OIHW", 0), "relax.nn.conv1d": ("OIW", 0),
            "relax.nn.conv2d_transpose": ("IOHW", 1)}


@dataclass(frozen=True)
class FoldPlan:
    """What the check found, for the rewrite: output channels and the channel axis."""

    channels: int
    channel_axis: int
    weight_axis: int


class BatchnormFoldIntoConv(RewriteRule):
    """Fold an inference ``batch_norm`` into the constant weights and bias of a convolution."""

    name = "conv.fold_batchnorm"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.weight = is_constant()
        self.conv = (is_op("nn.conv2d") | is_op("nn.conv1d")
                     | is_op("nn.conv2d_transpose"))(self.x, self.weight)
        # a float16 conv accumulated in float32 and cast back (ToMixedPrecision, patternkit's
        # float16 torch import): the fold scales the weight under the cast
        self.cast_back = is_op("astype")(self.conv)
        conv = alt(tag="cast", cast_back=self.cast_back, direct=self.conv)
        self.conv_bias = is_constant()
        self.reshaped_bias = is_op("reshape")(self.conv_bias, wildcard())
        self.biased = is_op("add")(conv, alt(tag="bias_form", reshaped=self.reshaped_bias,
                                              direct=self.conv_bias))
        self.gamma, self.beta, self.mean, self.var = (is_constant() for _ in range(4))
        self.bn = is_op("nn.batch_norm")(alt(tag="bias", biased=self.biased, unbiased=conv),
                                         self.gamma, self.beta, self.mean, self.var)
        self.pattern = is_tuple_get_item(self.bn, 0)

    def check(self, match: RoleMatch) -> Any:
        """A :class:`FoldPlan` when the batch norm and the conv bias are per-channel."""
        bn, conv = match.bn, match.conv
        if bool(bn.attrs.training):
            return reject("batch_norm is in training mode (batch statistics); only an "
                          "inference batch norm can be folded", at=bn)
        kernel_layout, weight_axis = FOLDABLE[conv.op.name]
        if str(conv.attrs.kernel_layout) != kernel_layout:
            return reject(f"kernel layout {conv.attrs.kernel_layout} is not {kernel_layout}",
                          at=conv)
        if conv.op.name == "relax.nn.conv2d_transpose" and int(conv.attrs.groups) != 1:
            return reject(f"the conv2d_transpose has {int(conv.attrs.groups)} groups: each "
                          f"output channel's weights are spread over the groups' blocks of "
                          f"the IOHW weight, which the fold does not scale", at=conv)
        out_layout = str(conv.attrs.out_layout)
        channel_axis = out_layout.index("C")
        if int(bn.attrs.axis) != channel_axis:
            return reject(f"batch_norm axis {int(bn.attrs.axis)} is not the channel axis of "
                          f"the conv output layout {out_layout}", at=bn)
        weight_ty = type_of(match.weight)
        if machine_epsilon(dtype_of(weight_ty)) is None:
            return reject(f"weight dtype {dtype_of(weight_ty)} is not floating point",
                          at=match.weight)
        if match.tag("cast") == "cast_back":
            cast = match.cast_back
            if str(cast.attrs.dtype) != str(dtype_of(weight_ty)):
                return reject(f"the conv's result is cast to {cast.attrs.dtype}, not back to "
                              f"its weight's {dtype_of(weight_ty)}: the batch norm does not "
                              f"run in the conv's dtype", at=cast)
        weight_shape = static_shape(weight_ty)
        assert weight_shape is not None  # a constant's shape is static
        channels = weight_shape[weight_axis]
        if match.tag("bias") == "biased":
            # The bias as it is added: a (C,) constant broadcasts along the last axis, so
            # its element count alone does not make it per-channel.
            added = (match.var_of("reshaped_bias") if match.tag("bias_form") == "reshaped"
                     else match.conv_bias)
            bias_shape = static_shape(type_of(added))
            out_shape = static_shape(type_of(match.var_of("conv")))
            # a constant or its reshape, and a conv2d's output: read as known shapes below
            assert bias_shape is not None and out_shape is not None
            if not single_value(bias_shape):
                try:
                    axis = per_channel_axis(bias_shape, out_shape, name="the conv bias",
                                            of="the conv output")
                except NotPerChannel as why:
                    return reject(str(why), at=added)
                if axis != channel_axis:
                    return reject(f"the conv bias varies along axis {axis} of the conv output "
                                  f"{tuple(out_shape)}, not along its channel axis "
                                  f"{channel_axis}: folding it as a per-channel bias would "
                                  f"change the numbers", at=added)
        return FoldPlan(channels, channel_axis, weight_axis)

    def rewrite(self, match: RoleMatch) -> Any:
        """The conv with its weight scaled and a bias added (folded in float64, cast back to
        the weight's and the output's dtypes): the batch norm is gone.
        """
        plan: FoldPlan = match.plan
        bn, conv = match.bn, match.conv
        weight = const_value(match.weight)
        channels, dtype = plan.channels, weight.dtype

        def per_channel(pattern):
            return const_value(match[pattern]).astype("float64").reshape(channels)

        gamma = per_channel(self.gamma) if bool(bn.attrs.scale) else np.ones(channels)
        beta = per_channel(self.beta) if bool(bn.attrs.center) else np.zeros(channels)
        mean, var = per_channel(self.mean), per_channel(self.var)
        scale = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        bias = np.zeros(channels)
        if match.tag("bias") == "biased":  # per-channel, or one value for every channel
            values = const_value(match.conv_bias).astype("float64").reshape(-1)
            bias = np.broadcast_to(values, (channels,))
        scale_shape = [-1 if axis == plan.weight_axis else 1 for axis in range(weight.ndim)]
        new_weight = (weight.astype("float64") * scale.reshape(scale_shape)).astype(dtype)
        # the bias joins the batch norm's input: the conv's output, whose dtype may be
        # wider than the weight's (a float16 conv with out_dtype="float32"), or its cast
        out_dtype = dtype_of(type_of(call_args(bn)[0]))
        new_bias = ((bias - mean) * scale + beta).astype(out_dtype)
        ndim = len(str(conv.attrs.out_layout))
        bias_shape = [channels if axis == plan.channel_axis else 1 for axis in range(ndim)]
        new_conv = relax.Call(conv.op, [match.x, relax.const(new_weight)],
                              conv.attrs)
        if match.tag("cast") == "cast_back":
            new_conv = relax.op.astype(new_conv, out_dtype)
        return relax.op.add(new_conv, relax.const(new_bias.reshape(bias_shape)))

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A conv, an optional bias and a batch norm: :func:`~.examples.conv_batch_norm`."""
        return conv_batch_norm(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both data layouts and three kernel layouts, every bias spelling (some broadcast
        along another axis, which 8 output channels make the width), a batch norm along
        the height, training mode, the float dtypes, an int8 conv into float32, a wider
        ``out_dtype``, a symbolic batch; conv2d, conv1d and conv2d_transpose.
        """
        return {"conv_bias": (False, True), "training": (False, True), "channels": (4, 8),
                "seed": (0, 1), "layout": ("NCHW", "NHWC"),
                "kernel_layout": ("OIHW", "HWIO", "OHWI"),
                "bias": ("reshape", "1C11", "C11", "C", "1"), "bn_axis": ("channel", "height"),
                "dtype": ("float32", "float16", "bfloat16", "int8"),
                "out_dtype": ("same", "float32", "cast_back"), "batch": (1, "n"),
                "op": ("conv2d", "conv1d", "conv2d_transpose")}
