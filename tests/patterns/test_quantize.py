"""patterns/quantize/: QDQ kernels (dequantize -> conv2d | matmul -> [bias] [activation] ->
quantize) become one composite each, on hand-written graphs and on ONNX QDQ models quantised
offline by onnxruntime."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.byoc import composite_counts, merge_composite
from patternkit.patterns import LIBRARY
from patternkit.patterns.quantize import QdqComposite
from patternkit.patterns.quantize.examples import qdq_kernel
from patternkit.testing import EXACT, Negative, RuleCase, check_rule
from patternkit.verification.numeric import run


@I.ir_module
class QdqConv:
    """A QDQ conv with a per-channel weight scale, a bias and a relu (weights as inputs)."""

    @R.function
    def main(xq: R.Tensor(("n", 3, 8, 8), "int8"), wq: R.Tensor((8, 3, 3, 3), "int8"),
             w_scale: R.Tensor((8,), "float32"), w_zero: R.Tensor((8,), "int8"),
             bias: R.Tensor((1, 8, 1, 1), "float32")) -> R.Tensor(("n", 8, 6, 6), "int8"):
        with R.dataflow():
            x = R.dequantize(xq, R.const(0.02, "float32"), R.const(-3, "int8"), axis=1)
            w = R.dequantize(wq, w_scale, w_zero, axis=0)
            y = R.nn.conv2d(x, w)
            biased = R.add(y, bias)
            act = R.nn.relu(biased)
            out = R.quantize(act, R.const(0.05, "float32"), R.const(-128, "int8"), axis=1,
                             out_dtype="int8")
            R.output(out)
        return out


@I.ir_module
class QdqConvComposite:
    @R.function
    def main(xq: R.Tensor(("n", 3, 8, 8), "int8"), wq: R.Tensor((8, 3, 3, 3), "int8"),
             w_scale: R.Tensor((8,), "float32"), w_zero: R.Tensor((8,), "int8"),
             bias: R.Tensor((1, 8, 1, 1), "float32")) -> R.Tensor(("n", 8, 6, 6), "int8"):
        n = T.int64()
        with R.dataflow():
            @R.function
            def composite(xq1: R.Tensor((n, 3, 8, 8), "int8"), x_scale: R.Tensor((), "float32"),
                          x_zero: R.Tensor((), "int8"), wq1: R.Tensor((8, 3, 3, 3), "int8"),
                          w_scale1: R.Tensor((8,), "float32"), w_zero1: R.Tensor((8,), "int8"),
                          bias1: R.Tensor((1, 8, 1, 1), "float32"),
                          out_scale: R.Tensor((), "float32"), out_zero: R.Tensor((), "int8"),
                          ) -> R.Tensor((n, 8, 6, 6), "int8"):
                R.func_attr({"Composite": "byoc.qdq_conv2d",
                             "PartitionedFromPattern":
                                 "dequantize_dequantize_nn.conv2d_add_nn.relu_quantize_"})
                with R.dataflow():
                    x = R.dequantize(xq1, x_scale, x_zero, axis=1)
                    w = R.dequantize(wq1, w_scale1, w_zero1, axis=0)
                    y = R.nn.conv2d(x, w)
                    biased = R.add(y, bias1)
                    act = R.nn.relu(biased)
                    out1 = R.quantize(act, out_scale, out_zero, axis=1, out_dtype="int8")
                    R.output(out1)
                return out1

            out = composite(xq, R.const(0.02, "float32"), R.const(-3, "int8"), wq, w_scale,
                            w_zero, bias, R.const(0.05, "float32"), R.const(-128, "int8"))
            R.output(out)
        return out


@I.ir_module
class QdqMatmul:
    """A QDQ matmul with a per-tensor weight scale, no bias, no activation."""

    @R.function
    def main(xq: R.Tensor(("n", 24), "int8"), wq: R.Tensor((24, 8), "int8"),
             ) -> R.Tensor(("n", 8), "int8"):
        with R.dataflow():
            x = R.dequantize(xq, R.const(0.02, "float32"), R.const(5, "int8"), axis=1)
            w = R.dequantize(wq, R.const(0.01, "float32"), R.const(0, "int8"), axis=1)
            y = R.matmul(x, w)
            out = R.quantize(y, R.const(0.05, "float32"), R.const(-7, "int8"), axis=1,
                             out_dtype="int8")
            R.output(out)
        return out


@I.ir_module
class QdqMatmulComposite:
    @R.function
    def main(xq: R.Tensor(("n", 24), "int8"), wq: R.Tensor((24, 8), "int8"),
             ) -> R.Tensor(("n", 8), "int8"):
        n = T.int64()
        with R.dataflow():
            @R.function
            def composite(xq1: R.Tensor((n, 24), "int8"), x_scale: R.Tensor((), "float32"),
                          x_zero: R.Tensor((), "int8"), wq1: R.Tensor((24, 8), "int8"),
                          w_scale: R.Tensor((), "float32"), w_zero: R.Tensor((), "int8"),
                          out_scale: R.Tensor((), "float32"), out_zero: R.Tensor((), "int8"),
                          ) -> R.Tensor((n, 8), "int8"):
                R.func_attr({"Composite": "byoc.qdq_matmul",
                             "PartitionedFromPattern": "dequantize_dequantize_matmul_quantize_"})
                with R.dataflow():
                    x = R.dequantize(xq1, x_scale, x_zero, axis=1)
                    w = R.dequantize(wq1, w_scale, w_zero, axis=1)
                    y = R.matmul(x, w)
                    out1 = R.quantize(y, out_scale, out_zero, axis=1, out_dtype="int8")
                    R.output(out1)
                return out1

            out = composite(xq, R.const(0.02, "float32"), R.const(5, "int8"), wq,
                            R.const(0.01, "float32"), R.const(0, "int8"),
                            R.const(0.05, "float32"), R.const(-7, "int8"))
            R.output(out)
        return out


def _negatives(op: str) -> list[Negative]:
    """Every refusal, each at its edge (the examples' knobs)."""
    out_axis = {"conv2d": 0, "matmul": 1}[op]
    cases = [
        Negative("sixteen_bit_input", qdq_kernel(op, dtype="int16"),
                 "the dequantized input is int16, not an 8-bit quantised tensor"),
        Negative("weight_scaled_per_input_channel", qdq_kernel(op, weight_axis="input"),
                 f"the weight is quantised per channel along axis {1 - out_axis}, not its "
                 f"output channels (axis {out_axis})"),
        Negative("output_scaled_per_channel", qdq_kernel(op, out_scale="per_channel"),
                 "the output is quantised with scales of shape (8,), not one scale"),
    ]
    if op == "conv2d":
        cases += [
            Negative("bias_of_the_full_output", qdq_kernel(op, bias="full"),
                     "the added tensor is not a per-channel bias: the added tensor has shape "
                     "(1, 8, 6, 6)"),
            Negative("bias_along_the_height", qdq_kernel(op, bias="height"),
                     "the added tensor varies along axis 2, not the channel axis 1: not a "
                     "bias"),
        ]
    return cases


QDQ_CONV2D_CASE = RuleCase(QdqComposite(op="conv2d"), QdqConv, QdqConvComposite,
                           negatives=_negatives("conv2d"), tolerance=EXACT)
QDQ_MATMUL_CASE = RuleCase(QdqComposite(op="matmul"), QdqMatmul, QdqMatmulComposite,
                           negatives=_negatives("matmul"), tolerance=EXACT)


def test_qdq_conv2d_composite_meets_the_rule_contract():
    check_rule(QDQ_CONV2D_CASE)


def test_qdq_matmul_composite_meets_the_rule_contract():
    check_rule(QDQ_MATMUL_CASE)


@pytest.mark.parametrize("op", ["conv2d", "matmul"])
@pytest.mark.parametrize("knobs", [
    {"dtype": "uint8"}, {"bias": False}, {"activation": "relu6"},
    {"weight_scale": "per_tensor", "activation": "relu"}, {"seed": 1}],
    ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_every_qdq_kernel_form_is_one_composite_with_the_same_integers(op, knobs):
    before = qdq_kernel(op, **knobs)
    merged = merge_composite(before, [QdqComposite(op=op)])
    assert composite_counts(merged) == {f"byoc.qdq_{op}": 1}
    shape = [int(d) for d in before["main"].params[0].ty.shape]
    low, high = {"int8": (-128, 128), "uint8": (0, 256)}[knobs.get("dtype", "int8")]
    xq = np.random.default_rng(0).integers(low, high, shape).astype(knobs.get("dtype", "int8"))
    (want,), (got,) = run(before, [xq]), run(merged, [xq])
    np.testing.assert_array_equal(got, want)


def test_the_qdq_composites_take_the_kernels_before_the_float_conv_and_matmul_ones():
    names = LIBRARY.composites().names
    assert names.index("byoc.qdq_conv2d") < names.index("byoc.conv2d_add_relu")
    assert names.index("byoc.qdq_matmul") < names.index("byoc.matmul")
    merged = merge_composite(qdq_kernel("conv2d", activation="relu"), LIBRARY.composites())
    assert composite_counts(merged) == {"byoc.qdq_conv2d": 1}


# -- ONNX QDQ models quantised offline by onnxruntime -------------------------------------------
@pytest.fixture(scope="module", params=["int8", "uint8"])
def onnx_qdq(request):
    """(the QDQ model, its TVM import) for int8 and uint8 activations."""
    pytest.importorskip("onnxruntime")
    from tvm.relax.frontend.onnx import from_onnx

    from patternkit.models.onnx_qdq import qdq_model

    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice on pre-processing
    model = qdq_model(seed=0, activations=request.param)
    return model, from_onnx(model)


def test_an_onnx_qdq_model_has_one_qdq_conv2d_and_one_qdq_matmul(onnx_qdq):
    model, mod = onnx_qdq
    merged = merge_composite(mod, LIBRARY.composites())
    assert composite_counts(merged) == {"byoc.qdq_conv2d": 1, "byoc.qdq_matmul": 1}
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype("float32")
    (want,), (got,) = run(mod, [x]), run(merged, [x])
    np.testing.assert_array_equal(got, want)  # composites only wrap the bindings


def test_tvm_runs_the_onnx_qdq_model_as_onnxruntime_does(onnx_qdq):
    """The import the composites are tested on computes what onnxruntime computes: the
    output is a dequantized int8/uint8 value, so the two agree to one quantisation step
    (onnxruntime's integer kernels round the accumulator where TVM computes in float)."""
    import onnxruntime

    model, mod = onnx_qdq
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype("float32")
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    (reference,) = session.run(None, {"x": x})
    (got,) = run(mod, [x])
    step = next(float(b.value.args[1].value.numpy()) for b in
                reversed(mod["main"].body.blocks[0].bindings)
                if pk.ir.op_name(b.value) == "relax.quantize")  # the output's scale
    np.testing.assert_allclose(got, reference, rtol=0, atol=1.01 * step)
