"""patterns/quantize/: QDQ kernels (dequantize -> conv2d | matmul -> [bias] [activation] ->
quantize) become one composite each, on hand-written graphs and on ONNX QDQ models quantised
offline by onnxruntime."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.byoc import composite_counts, merge_composite
from patternkit.models.importing import from_torch
from patternkit.patterns import LIBRARY
from patternkit.patterns.quantize import DequantizeCollapse, QdqComposite, QuantizeCollapse
from patternkit.patterns.quantize.examples import (
    dequantize_written_out,
    qdq_kernel,
    quantize_written_out,
)
from patternkit.testing import EXACT, Negative, RuleCase, Tolerance, apply_rule, check_rule
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

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_static's advice on pre-processing
    try:
        model = qdq_model(seed=0, activations=request.param)
    finally:
        root.setLevel(level)
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


# -- dequantize.collapse and quantize.collapse: quantisation written by hand --------------------
#: Both rules produce the op whose legalisation is the written arithmetic: bit-identical.
SAME_ARITHMETIC = Tolerance(0.0, 0.0, "R.dequantize / R.quantize legalise to the same "
                                      "subtract-multiply / divide-round-add-clip-cast: "
                                      "bit-identical")


@I.ir_module
class DequantizeWrittenOut:
    """torch's ``(q.float() - 3) * 0.05`` as the torch importer writes it."""

    @R.function
    def main(q: R.Tensor(("n", 8), "int8")) -> R.Tensor(("n", 8), "float32"):
        with R.dataflow():
            f = R.astype(q, dtype="float32")
            centred = R.subtract(f, R.const(3.0, "float32"))
            out = R.multiply(centred, R.const(0.05, "float32"))
            R.output(out)
        return out


@I.ir_module
class Dequantized:
    @R.function
    def main(q: R.Tensor(("n", 8), "int8")) -> R.Tensor(("n", 8), "float32"):
        with R.dataflow():
            out = R.dequantize(q, R.const(0.05, "float32"), R.const(3, "int8"), axis=-1)
            R.output(out)
        return out


@I.ir_module
class QuantizeWrittenOut:
    """torch's ``clamp(round(x / 0.05) + 3, -128, 127).to(torch.int8)``, imported."""

    @R.function
    def main(x: R.Tensor(("n", 8), "float32")) -> R.Tensor(("n", 8), "int8"):
        with R.dataflow():
            scaled = R.divide(x, R.const(0.05, "float32"))
            rounded = R.round(scaled)
            shifted = R.add(rounded, R.const(3.0, "float32"))
            clipped = R.clip(shifted, -128, 127)
            out = R.astype(clipped, dtype="int8")
            R.output(out)
        return out


@I.ir_module
class Quantized:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32")) -> R.Tensor(("n", 8), "int8"):
        with R.dataflow():
            out = R.quantize(x, R.const(0.05, "float32"), R.const(3, "int8"), axis=-1,
                             out_dtype="int8")
            R.output(out)
        return out


def _dequantized_by(shape: tuple, scale_shape: tuple, zero_point_shape: tuple
                    ) -> tvm.IRModule:
    """``(q.astype(float32) - zp) * scale`` of an int8 ``q`` with the given constants' shapes."""
    rng = np.random.default_rng(0)
    q = relax.Var("q", relax.TensorType(shape, "int8"))
    zero_point = relax.const(rng.integers(-3, 4, zero_point_shape).astype("float32"))
    scale = relax.const(rng.uniform(0.01, 0.1, scale_shape).astype("float32"))
    return pk.from_expr((relax.op.astype(q, "float32") - zero_point) * scale)


def _quantized_by_fractional_zero_points() -> tvm.IRModule:
    """``clip(round(x / scale) + zp, -128, 127).astype(int8)``, zp one per column, halves."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    shifted = (relax.op.round(x / relax.const(np.full(4, 0.05, "float32")))
               + relax.const(np.arange(4, dtype="float32") + 0.5))
    return pk.from_expr(relax.op.astype(relax.op.clip(shifted, -128, 127), "int8"))


DEQUANTIZE_CASE = RuleCase(
    DequantizeCollapse(), DequantizeWrittenOut, Dequantized,
    negatives=[
        Negative("int32_tensor", dequantize_written_out(dtype="int32"),
                 "the integer tensor is int32, not int8 or uint8"),
        Negative("to_float16", dequantize_written_out(float_dtype="float16"),
                 "the float tensor is float16: R.dequantize / R.quantize compute in float32"),
        Negative("zero_point_out_of_range", dequantize_written_out(zero_point=300.0),
                 "the zero point 300 is not a whole number in int8's range [-128, 127]"),
        Negative("fractional_zero_point", dequantize_written_out(zero_point=2.5),
                 "the zero point 2.5 is not a whole number"),
        Negative("scale_along_two_axes", _dequantized_by((4, 8), (4, 8), ()),
                 "the scale has shape (4, 8)"),
        Negative("scale_and_zero_point_along_different_axes",
                 _dequantized_by((4, 8), (1, 8), (4, 1)),
                 "the scale varies along axis 1 and the zero point along axis 0: "
                 "R.dequantize / R.quantize take one axis"),
    ],
    tolerance=SAME_ARITHMETIC)

QUANTIZE_CASE = RuleCase(
    QuantizeCollapse(), QuantizeWrittenOut, Quantized,
    negatives=[
        Negative("symmetric_int8_clip", quantize_written_out(clip="symmetric"),
                 "the clip to [-127, 127] is not int8's whole range [-128, 127], which "
                 "R.quantize clips to"),
        Negative("sixteen_bit", quantize_written_out(dtype="int16"),
                 "the integer tensor is int16, not int8 or uint8"),
        Negative("from_float16", quantize_written_out(float_dtype="float16"),
                 "the float tensor is float16"),
        Negative("fractional_zero_points", _quantized_by_fractional_zero_points(),
                 "the zero point [0.5, 1.5, 2.5, 3.5] is not whole numbers in int8's range"),
    ],
    tolerance=SAME_ARITHMETIC)


def test_dequantize_collapse_meets_the_rule_contract():
    check_rule(DEQUANTIZE_CASE)


def test_quantize_collapse_meets_the_rule_contract():
    check_rule(QUANTIZE_CASE)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("zero_point", [0.0, 3.0])
@pytest.mark.parametrize("per_channel", [False, True, "zero_point"])
def test_written_quantisation_round_trips_bit_identically_after_the_collapses(
        dtype, zero_point, per_channel):
    quantize_before = quantize_written_out(dtype, zero_point, per_channel=per_channel)
    dequantize_before = dequantize_written_out(dtype, zero_point, "scale_first",
                                               per_channel=per_channel)
    quantize = pk.rewrite(QuantizeCollapse(), quantize_before)
    dequantize = pk.rewrite(DequantizeCollapse(), dequantize_before)
    assert "R.quantize" in quantize.script() and "R.dequantize" in dequantize.script()
    axis = "axis=1" if per_channel else "axis=-1"  # the columns, q's last axis, by number
    assert axis in quantize.script() and axis in dequantize.script()
    # values past both ends of the range, and halves, where rounding and clipping decide
    x = np.concatenate([np.linspace(-20, 20, 64), np.arange(-8, 8) * 0.05 + 0.025]
                       ).astype("float32").reshape(-1, 8)
    (want_q,), (got_q,) = run(quantize_before, [x]), run(quantize, [x])
    np.testing.assert_array_equal(got_q, want_q)
    (want,), (got,) = run(dequantize_before, [got_q]), run(dequantize, [got_q])
    np.testing.assert_array_equal(got, want)


def test_torch_quantisation_by_hand_collapses_then_forms_the_qdq_composite():
    """A torch module that quantises by hand around a matmul (the weight symmetric): after
    the library's rewrites the dequantize / quantize ops are there, and the QDQ matmul
    composite takes them."""
    import torch

    class HandQuantisedLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            generator = torch.Generator().manual_seed(0)
            self.wq = torch.randint(-128, 128, (24, 8), dtype=torch.int8, generator=generator)

        def forward(self, q):
            x = (q.float() - 3) * 0.02
            w = self.wq.float() * 0.01
            y = x @ w
            return torch.clamp(torch.round(y / 0.05) + 3, -128, 127).to(torch.int8)

    q = torch.randint(-128, 128, (2, 24), dtype=torch.int8)
    mod = from_torch(torch.export.export(HandQuantisedLinear(), (q,)), False, "main",
                     "HandQuantisedLinear", {})[0]
    rewritten = pk.rewrite(LIBRARY, mod)
    script = rewritten.script()
    assert script.count("R.dequantize") == 2 and script.count("R.quantize(") == 1
    merged = merge_composite(rewritten, LIBRARY.composites())
    assert composite_counts(merged) == {"byoc.qdq_matmul": 1}
    (want,), (got,) = run(mod, [q.numpy()]), run(merged, [q.numpy()])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, HandQuantisedLinear()(q).numpy())


@pytest.mark.parametrize("dtype", ["bool", "int64"])
def test_casts_of_masks_and_indices_are_not_taken_for_quantised_values(dtype):
    """T5's ``(mask.astype(float32) - 1) * big``: a bool (or int64) cast is no dequantize,
    and the rule does not even look at it (no refusal in the log)."""
    mask = relax.Var("mask", relax.TensorType((2, 8), dtype))
    mod = pk.from_expr((relax.op.astype(mask, "float32") - relax.const(1.0, "float32"))
                       * relax.const(-1e9, "float32"))
    applied = apply_rule(DequantizeCollapse(), mod)
    assert applied.fired == 0 and applied.refusals == ()
