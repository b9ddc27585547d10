"""Known bugs of TVM 0.27 passes, found by ``patternkit fuzz`` (see docs/tvm-bugs.md).

Each test states what the pass should do and is a strict xfail: when a TVM release fixes
the bug the test passes, the xfail turns into a failure, and the entry can be retired.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from patternkit.verification import numeric

_RNG = np.random.default_rng(0)
WEIGHT = (_RNG.standard_normal((4, 2, 3, 3)) * 0.3).astype("float32")  # OIHW
GAMMA, BETA, MEAN = (_RNG.uniform(-1, 1, 4).astype("float32") for _ in range(3))
VAR = _RNG.uniform(0.5, 1.5, 4).astype("float32")


@I.ir_module
class NhwcConvBatchNorm:
    """conv2d on NHWC data with an OIHW kernel, then an inference batch norm on the
    channel axis (3); the 4x4 output has 4 channels, so H equals C."""

    @R.function
    def main(x: R.Tensor((1, 6, 6, 2), "float32")) -> R.Tensor((1, 4, 4, 4), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, R.const(WEIGHT), data_layout="NHWC", kernel_layout="OIHW")
            bn = R.nn.batch_norm(y, R.const(GAMMA), R.const(BETA), R.const(MEAN), R.const(VAR),
                                 axis=3, epsilon=1e-5, training=False)
            out = bn[0]
            R.output(out)
        return out


@pytest.mark.xfail(strict=True, reason="TVM 0.27 FoldBatchnormToConv2D assumes an NCHW "
                                       "output: with NHWC data it shifts along H")
def test_fold_batchnorm_to_conv2d_keeps_the_numbers_of_an_nhwc_conv():
    folded = relax.transform.FoldBatchnormToConv2D()(NhwcConvBatchNorm)
    comparison = numeric.compare(NhwcConvBatchNorm, folded, rtol=1e-5, atol=1e-5)
    assert comparison.ok, comparison
