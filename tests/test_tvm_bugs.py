"""Known bugs of TVM 0.27, found by ``patternkit fuzz`` and rule tests (docs/tvm-bugs.md).

Each test states what the pass should do and is a strict xfail: when a TVM release fixes
the bug the test passes, the xfail turns into a failure, and the entry can be retired.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
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


BIAS = _RNG.uniform(-1, 1, 32).astype("float16")


@I.ir_module
class Float16AttentionThenBias:
    """A float16 attention whose result meets a float16 bias."""

    @R.function
    def main(q: R.Tensor((2, 8, 2, 16), "float16")) -> R.Tensor((2, 8, 32), "float16"):
        with R.dataflow():
            att = R.nn.attention(q, q, q, scale=0.25)
            out = R.add(R.reshape(att, R.shape([2, 8, 32])), R.const(BIAS))
            R.output(out)
        return out


@pytest.mark.xfail(strict=True, reason="TVM 0.27 legalises a float16 R.nn.attention to a "
                                       "float32 result: the float16 add then fails to build")
def test_a_float16_attention_builds_and_computes_in_float16():
    vm = relax.VirtualMachine(relax.build(Float16AttentionThenBias, target="llvm"), tvm.cpu())
    q = tvm.runtime.tensor(_RNG.uniform(-1, 1, (2, 8, 2, 16)).astype("float16"))
    assert vm["main"](q).dtype == "float16"


_SERIALISE_A_MODULE = textwrap.dedent("""
    import pickle, tvm, tvm_ffi
    from tvm import relax
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    mod = bb.get()
    assert tvm_ffi.structural_equal(tvm.ir.load_json(tvm.ir.save_json(mod)), mod)
    assert tvm_ffi.structural_equal(pickle.loads(pickle.dumps(mod)), mod)
""")


@pytest.mark.xfail(strict=True, reason="TVM 0.27's save_json, behind pickle, crashes the "
                                       "interpreter on a Relax expression (SIGSEGV)")
def test_a_module_round_trips_through_save_json_and_pickle():
    # In a child process: the crash is a segmentation fault, not an exception.
    child = subprocess.run([sys.executable, "-c", _SERIALISE_A_MODULE], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
