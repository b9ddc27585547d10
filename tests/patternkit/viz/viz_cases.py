"""The small conv/bias/relu/softmax model and its composite form, shared by the drawing tests."""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.transform import FuseOpsByPattern, FusionPattern
from tvm.script import ir as I, relax as R


@I.ir_module
class ConvBiasReluSoftmax:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            b = R.add(c, R.const(np.ones((1, 4, 1, 1), "float32")))
            r = R.nn.relu(b)
            s = R.nn.softmax(r, axis=1)
            R.output(s)
        return s


CONV_BIAS_RELU = is_op("relax.nn.relu")(
    is_op("relax.add")(is_op("relax.nn.conv2d")(wildcard(), wildcard()), is_const()))
SOFTMAX = is_op("relax.nn.softmax")(wildcard())


def composite_module():
    """``ConvBiasReluSoftmax`` with its conv, bias and relu in one ``mybackend`` composite."""
    fuse = FuseOpsByPattern([FusionPattern("mybackend.conv2d_bias_relu", CONV_BIAS_RELU)])
    return fuse(ConvBiasReluSoftmax)
