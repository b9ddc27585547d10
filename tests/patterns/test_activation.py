"""patterns/activation/: GELU (erf and tanh forms) and SiLU collapse into their ``nn`` ops,
and the expansions a training graph needs keep the numbers and have gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit import ir as C
from patternkit.byoc import composite_counts, merge_composite
from patternkit.models.importing import from_torch
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.activation import (
    CUBIC,
    EXPANSIONS as ACTIVATION_EXPANSIONS,
    RULES,
    SQRT_HALF,
    SQRT_TWO_OVER_PI,
    GeluCollapse,
    GeluExpand,
    GeluTanhCollapse,
    GeluTanhExpand,
    HardsigmoidCanonicalize,
    HardsigmoidComposite,
    HardswishCanonicalize,
    HardswishComposite,
    MishComposite,
    OnnxClipCollapse,
    OnnxMaxCollapse,
    OnnxMinCollapse,
    QuickGeluComposite,
    Relu6Collapse,
    SiluCollapse,
    SoftplusCollapse,
    rational_erf,
)
from patternkit.patterns.activation.examples import (
    example_input,
    gelu_call,
    hardsigmoid_written_out,
    hardswish_written_out,
    mish_written_out,
    onnx_clip_written_out,
    onnx_minmax_written_out,
    quick_gelu_written_out,
    relu6_written_out,
    softplus_written_out,
    swish,
)
from patternkit.patterns.activation.softplus_casts import (
    SoftplusCastBetaCollapse,
    softplus_cast_beta,
)
from patternkit.testing import EXACT, Negative, RuleCase, Tolerance, apply_rule, check_rule
from patternkit.verification import rule_by_example, verify_by_example
from patternkit.verification.numeric import build

#: ``inf`` as a TIR float64, the bound of the torch importer's one-sided clips.
T_INF = tvm.tirx.FloatImm("float64", math.inf)

#: Inputs for the numeric proofs span [-6, 6): past GELU's bend on both sides, where the
#: tanh and erf terms saturate, not only the near-linear [-1, 1) of the default draw.
WIDE = {"low": -6.0, "high": 6.0}

#: float32: the written form and the fused op's legalisation associate the same formula
#: differently, so they round differently: a few ulp of the largest value (ulp(6) = 4.8e-7).
#: gelu and silu collapse to the very operations they legalise to and are bit-exact here;
#: the tolerance is the same for all so that a change of legalisation does not look like a
#: broken rule.
F32 = Tolerance(1e-6, 1e-6, "the fused op's legalisation associates the formula differently "
                            "from the written form: a few float32 ulp of values up to 6")
#: float16 (10-bit mantissa, eps 9.8e-4): each of the written form's ~8 roundings to
#: float16 can move a result by half an ulp; measured worst case is one ulp (9.8e-4 at
#: 0.3..1, 3.9e-3 relative to values near 6 are below 4e-3 * 6).
F16 = {"rtol": 4e-3, "atol": 2e-3}
#: gelu.expand replaces erf by a rational approximation within 3e-7 of it in float32
#: (Eigen's float32 erf), times x * 0.5 with |x| < 6: 9e-7; measured 9.5e-7.
ERF_APPROXIMATION = Tolerance(1e-6, 2e-6, "erf is replaced by a rational approximation "
                                          "within 3e-7 of it, scaled by x / 2 (|x| < 6), "
                                          "plus float32 rounding")


def _torch_import(module, shape=(2, 16)) -> tvm.IRModule:
    """``module`` exported with torch.export and imported as patternkit imports models."""
    program = torch.export.export(module.eval(), (torch.randn(*shape),))
    return from_torch(program, False, "main", type(module).__name__, {})[0]


def _ops(mod: tvm.IRModule) -> list[str]:
    return [C.op_name(b.value) for block in mod["main"].body.blocks for b in block.bindings
            if C.op_name(b.value)]


def _var(shape=(2, 16), dtype="float32", name="x") -> relax.Var:
    return relax.Var(name, relax.TensorType(shape, dtype) if shape is not None
                     else relax.TensorType(ndim=-1, dtype=dtype))


def _c(value, dtype="float32", shape=()) -> relax.Expr:
    return relax.const(np.full(shape, value).astype(dtype)) if shape else relax.const(value, dtype)


def _gelu_erf(x: relax.Expr, half=None, sqrt_half=SQRT_HALF, dtype="float32") -> relax.Expr:
    half = _c(0.5, dtype) if half is None else half
    return (x * half) * (relax.op.erf(x * _c(sqrt_half, dtype)) + _c(1.0, dtype))


def _gelu_tanh(x: relax.Expr, cubic=CUBIC, exponent=3.0, one=None) -> relax.Expr:
    one = _c(1.0) if one is None else one
    cube = relax.op.power(x, _c(exponent))
    return (x * _c(0.5)) * (relax.op.tanh((x + cube * _c(cubic)) * _c(SQRT_TWO_OVER_PI)) + one)


# -- gelu.collapse ------------------------------------------------------------------------------
@I.ir_module
class GeluErfForm:
    """torch's ONNX export of ``nn.GELU()``: the erf argument divided, 0.5 applied last."""

    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.divide(x, R.const(1.4142135623730951, "float32"))
            b = R.erf(a)
            c = R.add(R.const(1.0, "float32"), b)
            d = R.multiply(x, c)
            out = R.multiply(d, R.const(0.5, "float32"))
            R.output(out)
        return out


@I.ir_module
class Gelu:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            out = R.nn.gelu(x)
            R.output(out)
        return out


GELU_CASE = RuleCase(
    GeluCollapse(), GeluErfForm, Gelu,
    negatives=[
        Negative("erf_argument_not_one_over_sqrt_two", pk.from_expr(
            _gelu_erf(_var(), sqrt_half=0.7)), "no match"),
        Negative("half_that_is_not_a_half", pk.from_expr(
            _gelu_erf(_var(), half=_c(0.45))), "no match"),
        Negative("erf_of_another_tensor", pk.from_expr(
            (_var() * _c(0.5)) * (relax.op.erf(_var(name="y") * _c(SQRT_HALF)) + _c(1.0))),
            "no match"),
        Negative("half_broadcasts_x_to_a_higher_rank", pk.from_expr(
            _gelu_erf(_var((16,)), half=_c(0.5, shape=(1, 1)))),
            "fused gives shape (16,), the written form (1, 16): its constants broadcast the "
            "parameters"),
        Negative("x_of_unknown_rank", pk.from_expr(_gelu_erf(_var(None))),
                 "the written form has an unknown rank: cannot tell whether its constants "
                 "broadcast the parameters"),
    ],
    tolerance=F32)


def test_gelu_collapse_meets_the_rule_contract():
    check_rule(GELU_CASE)


# -- gelu_tanh.collapse -------------------------------------------------------------------------
@I.ir_module
class GeluTanhForm:
    """GPT-2's ``NewGELUActivation`` as the torch importer writes it."""

    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.multiply(x, R.const(0.5, "float32"))
            b = R.power(x, R.const(3.0, "float32"))
            c = R.multiply(b, R.const(0.044715, "float32"))
            d = R.add(x, c)
            e = R.multiply(d, R.const(0.7978845608028654, "float32"))
            f = R.tanh(e)
            g = R.add(f, R.const(1.0, "float32"))
            out = R.multiply(a, g)
            R.output(out)
        return out


@I.ir_module
class GeluTanh:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            out = R.nn.gelu_tanh(x)
            R.output(out)
        return out


GELU_TANH_CASE = RuleCase(
    GeluTanhCollapse(), GeluTanhForm, GeluTanh,
    negatives=[
        Negative("cubic_coefficient_off_in_the_fourth_digit",
                 pk.from_expr(_gelu_tanh(_var(), cubic=0.0447)), "no match"),
        Negative("square_instead_of_cube", pk.from_expr(_gelu_tanh(_var(), exponent=2.0)),
                 "no match"),
        Negative("one_broadcasts_x_to_a_higher_rank", pk.from_expr(
            _gelu_tanh(_var((16,)), one=_c(1.0, shape=(1, 1, 1)))),
            "fused gives shape (16,), the written form (1, 1, 16): its constants broadcast"),
        Negative("x_of_unknown_rank", pk.from_expr(_gelu_tanh(_var(None))),
                 "the written form has an unknown rank"),
    ],
    tolerance=F32)


def test_gelu_tanh_collapse_meets_the_rule_contract():
    check_rule(GELU_TANH_CASE)


# -- silu.collapse ------------------------------------------------------------------------------
@I.ir_module
class Swish:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            s = R.sigmoid(x)
            out = R.multiply(s, x)
            R.output(out)
        return out


@I.ir_module
class Silu:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            out = R.nn.silu(x)
            R.output(out)
        return out


SILU_CASE = RuleCase(
    SiluCollapse(), Swish, Silu,
    negatives=[
        Negative("fast_gelu_sigmoid_of_scaled_x", swish(sigmoid_of="scaled"),
                 "no match"),
        Negative("sigmoid_of_another_tensor", pk.from_expr(
            _var() * relax.op.sigmoid(_var(name="y"))), "no match"),
        Negative("sigmoid_plus_x", pk.from_expr(_var() + relax.op.sigmoid(_var())),
                 "no match"),
    ],
    tolerance=F32)


def test_silu_collapse_meets_the_rule_contract():
    check_rule(SILU_CASE)


# -- relu6.collapse -----------------------------------------------------------------------------
@I.ir_module
class Relu6TwoClips:
    """The clamp inside ``nn.Hardswish`` as the torch importer writes it."""

    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.clip(x, 0, R.prim_value(T_INF))
            out = R.clip(a, R.prim_value(-T_INF), 6)
            R.output(out)
        return out


@I.ir_module
class Relu6:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            out = R.clip(x, 0, 6)
            R.output(out)
        return out


RELU6_CASE = RuleCase(
    Relu6Collapse(), Relu6TwoClips, Relu6,
    negatives=[
        Negative("clip_to_five_is_not_relu6", relu6_written_out(upper=5.0), "no match"),
        Negative("minimum_at_five_is_not_relu6",
                 relu6_written_out(spelling="min_max", upper=5.0), "no match"),
        Negative("maximum_at_one_is_not_relu6", pk.from_expr(relax.op.minimum(
            relax.op.maximum(_var(), _c(1.0)), _c(6.0))), "no match"),
        Negative("clips_of_two_tensors", pk.from_expr(relax.op.minimum(
            relax.op.maximum(_var(), _c(0.0)), _var(name="y"))), "no match"),
    ],
    tolerance=Tolerance(0, 0, "clamps do not round"))


def test_relu6_collapse_meets_the_rule_contract():
    check_rule(RELU6_CASE)


def test_relu6_collapse_takes_the_two_clips_torch_writes_for_hardswish():
    """torch.export of ``nn.Hardswish``: the clamp is two clips; after the rule, the one
    ``R.clip(x, 0, 6)`` that ``relax.op.nn.relu6`` builds."""
    mod = _torch_import(torch.nn.Hardswish())
    assert _ops(mod).count("relax.clip") == 2
    after = pk.rewrite(Relu6Collapse(), mod)
    clips = [b.value for b in after["main"].body.blocks[0].bindings
             if C.op_name(b.value) == "relax.clip"]
    assert len(clips) == 1
    canonical = relax.op.nn.relu6(clips[0].args[0])
    tvm.ir.assert_structural_equal(list(clips[0].args[1:]), list(canonical.args[1:]))
    pk.assert_same_numerics(mod, after, **WIDE, rtol=0, atol=0)


# -- clip.collapse_onnx: from_onnx's Clip ------------------------------------------------------
def _with_main(mod: tvm.IRModule, body: relax.Expr) -> tvm.IRModule:
    """``mod`` with ``main`` replaced by ``main(x) = body`` (its PrimFuncs kept: the rewrite
    leaves them for dead-code elimination)."""
    functions = {gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}
    bb = relax.BlockBuilder()
    with bb.function("main", relax.analysis.free_vars(body)):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(body))
        bb.emit_func_output(out)
    functions.update(bb.get().functions.items())
    return tvm.IRModule(functions)


def _clip_of_a_vector_bound() -> tvm.IRModule:
    """``call_tir(maximum, (x, c))`` with ``c`` one bound per feature, then the upper bound."""
    from tvm import topi

    x = _var()
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            low = bb.emit_te(topi.maximum, x, _c(0.0, shape=(16,)))
            out = bb.emit_output(bb.emit_te(topi.minimum, low, _c(6.0)))
        bb.emit_func_output(out)
    return bb.get()


_ONNX_CLIP = onnx_clip_written_out(shape="static")

CLIP_ONNX_CASE = RuleCase(
    OnnxClipCollapse(), _ONNX_CLIP,
    _with_main(_ONNX_CLIP, relax.op.clip(_var((2, 8, 16)), 0, 6)),
    negatives=[
        Negative("lower_bound_above_the_upper", onnx_clip_written_out(low=7.0),
                 "the lower bound 7 is above the upper bound 6: Clip gives the upper bound "
                 "everywhere, R.clip the lower one"),
        Negative("nan_bound", onnx_clip_written_out(high=math.nan),
                 "the upper bound is NaN: Clip leaves that side unbounded"),
        Negative("nan_test_of_another_number", onnx_clip_written_out(tested=1.0),
                 "the NaN test reads 1.0, not the bound 0.0"),
        Negative("callee_not_named_by_emit_te", onnx_clip_written_out(
            names=("fused_maximum", "minimum")),
                 "the call_tir's callee is 'fused_maximum', not a PrimFunc that emit_te names "
                 "after TOPI's maximum"),
        Negative("bound_per_feature", _clip_of_a_vector_bound(),
                 "the lower bound is a float32 tensor of rank 1, not one float32 number"),
    ],
    tolerance=Tolerance(0, 0, "clamps do not round"))


def test_onnx_clip_collapse_meets_the_rule_contract():
    check_rule(CLIP_ONNX_CASE)


@pytest.mark.parametrize("knobs", [
    {"bounds": "folded"}, {"dtype": "float16"}, {"low": -1.5, "high": 1.0},
    {"shape": "vector", "bounds": "folded", "low": 0.25, "high": 0.5}])
def test_onnx_clip_collapse_takes_folded_and_fractional_bounds_exactly(knobs):
    before = onnx_clip_written_out(**knobs)
    after = pk.rewrite(OnnxClipCollapse(), before)
    (clip,) = [b.value for b in after["main"].body.blocks[0].bindings
               if C.op_name(b.value) == "relax.clip"]
    low, high = knobs.get("low", 0.0), knobs.get("high", 6.0)
    assert [float(v.value) for v in clip.args[1:]] == [low, high]
    pk.assert_same_numerics(before, after, **WIDE, rtol=0, atol=0,
                            shape_vars={"batch": 2, "seq": 3})


class _Relu6Net(torch.nn.Module):
    """``nn.ReLU6`` and a ``clamp(0, 6)``: both export as ONNX ``Clip(x, 0, 6)``."""

    def __init__(self):
        super().__init__()
        self.relu6 = torch.nn.ReLU6()

    def forward(self, x):
        return self.relu6(x) + torch.clamp(2.0 * x, 0.0, 6.0)


@pytest.mark.parametrize("exporter", ["torchscript-14", "torchscript-17", "dynamo-18"])
def test_onnx_clip_of_relu6_reaches_the_canonical_relu6(exporter):
    import io

    onnx = pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    kind, opset = exporter.split("-")
    module, x = _Relu6Net().eval(), torch.randn(2, 16) * 5
    if kind == "dynamo":
        pytest.importorskip("onnxscript")
        model = torch.onnx.export(module, (x,), dynamo=True, verbose=False,
                                  opset_version=int(opset)).model_proto
    else:
        buffer = io.BytesIO()
        torch.onnx.export(module, (x,), buffer, dynamo=False, opset_version=int(opset))
        model = onnx.load_from_string(buffer.getvalue())
    mod = from_onnx(model)
    assert _ops(mod).count("relax.call_tir") == 4
    after = pk.rewrite(LIBRARY, mod)
    clips = [b.value for b in after["main"].body.blocks[0].bindings
             if C.op_name(b.value) == "relax.clip"]
    assert len(clips) == 2 and "relax.call_tir" not in _ops(after)
    for clip in clips:  # what relax.op.nn.relu6 builds, as relu6.collapse writes it
        tvm.ir.assert_structural_equal(list(clip.args[1:]),
                                       list(relax.op.nn.relu6(clip.args[0]).args[1:]))
    (got,) = pk.verification.numeric.run(after, [x.numpy()])
    np.testing.assert_array_equal(got, module(x).detach().numpy())


# -- ONNX Max / Min ------------------------------------------------------------------------------
def _minmax_case(cls, op, number: float) -> RuleCase:
    before = onnx_minmax_written_out(shape="static", reduce=cls.reduce)
    return RuleCase(
        cls(), before, _with_main(before, op(_var((2, 8, 16)), _c(number))),
        negatives=[
            Negative("another_axis_reduced", onnx_minmax_written_out(
                reduce=cls.reduce, reduce_axis=1),
                     f"the {cls.reduce} reduces axes [1] (keepdims=False) of the operands "
                     f"stacked along axis 0: only the stacked axis, dropped, is the "
                     f"elementwise {op.__name__}"),
            Negative("stacked_axis_kept", onnx_minmax_written_out(
                reduce=cls.reduce, keepdims=True),
                     f"the {cls.reduce} reduces axes [0] (keepdims=True)"),
        ],
        tolerance=Tolerance(0, 0, "a maximum or minimum does not round"))


MAX_ONNX_CASE = _minmax_case(OnnxMaxCollapse, relax.op.maximum, 0.0)
MIN_ONNX_CASE = _minmax_case(OnnxMinCollapse, relax.op.minimum, 6.0)


def test_onnx_max_collapse_meets_the_rule_contract():
    check_rule(MAX_ONNX_CASE)


def test_onnx_min_collapse_meets_the_rule_contract():
    check_rule(MIN_ONNX_CASE)


def test_onnx_max_of_operands_smaller_than_its_output_is_broadcast_back():
    before = onnx_minmax_written_out(other="outer")  # Max of (4, 1) and (1, 16)
    after = pk.rewrite(OnnxMaxCollapse(), before)
    assert _ops(after) == ["relax.maximum", "relax.broadcast_to"]
    tvm.ir.assert_structural_equal(after["main"].ret_ty, before["main"].ret_ty)
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


class _MinMaxRelu6(torch.nn.Module):
    """``minimum(maximum(x, 0), 6)``: ONNX ``Max`` then ``Min`` through TorchScript."""

    def forward(self, x):
        zero, six = torch.tensor(0.0), torch.tensor(6.0)
        return torch.minimum(torch.maximum(x, zero), six) * 2.0


@pytest.mark.parametrize("opset", [14, 17])
def test_onnx_max_min_of_a_torchscript_export_reach_the_canonical_relu6(opset):
    import io

    onnx = pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    module, x = _MinMaxRelu6().eval(), torch.randn(2, 16) * 5
    buffer = io.BytesIO()
    torch.onnx.export(module, (x,), buffer, dynamo=False, opset_version=opset)
    mod = from_onnx(onnx.load_from_string(buffer.getvalue()))
    assert {"relax.stack", "relax.max", "relax.min"} <= set(_ops(mod))
    after = pk.rewrite(LIBRARY, mod)
    assert _ops(after).count("relax.clip") == 1
    assert not {"relax.stack", "relax.max", "relax.min"} & set(_ops(after))
    (clip,) = [b.value for b in after["main"].body.blocks[0].bindings
               if C.op_name(b.value) == "relax.clip"]
    tvm.ir.assert_structural_equal(list(clip.args[1:]),
                                   list(relax.op.nn.relu6(clip.args[0]).args[1:]))
    (got,) = pk.verification.numeric.run(after, [x.numpy()])
    np.testing.assert_array_equal(got, module(x).detach().numpy())


# -- hard-sigmoid and hard-swish ----------------------------------------------------------------
#: The canonicalisations move a rounding or two (a division for a product by 0.16667,
#: ``x / 6 + 0.5`` for ``(x + 3) / 6``): a few float32 ulp of values up to 6 (hard-swish
#: of 6 is 6).
HARD_F32 = Tolerance(2e-6, 2e-6, "a division instead of a product by 1/6, or (x + 3) / 6 "
                                 "instead of x / 6 + 0.5: a few float32 ulp of values up to 6")


@I.ir_module
class HardsigmoidOnnx:
    """TVM's ``from_onnx`` of ``HardSigmoid`` (alpha 1/6, beta 0.5)."""

    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.multiply(R.const(0.1666666716337204, "float32"), x)
            b = R.add(a, R.const(0.5, "float32"))
            out = R.clip(b, 0, 1)
            R.output(out)
        return out


@I.ir_module
class HardsigmoidCanonical:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.add(x, R.const(3.0, "float32"))
            b = R.clip(a, 0, 6)
            out = R.divide(b, R.const(6.0, "float32"))
            R.output(out)
        return out


HARDSIGMOID_CASE = RuleCase(
    HardsigmoidCanonicalize(), HardsigmoidOnnx, HardsigmoidCanonical,
    negatives=[
        Negative("beta_one_third_is_not_hardsigmoid", hardsigmoid_written_out(offset=2.0),
                 "no match"),
        Negative("add_two_is_not_hardsigmoid",
                 hardsigmoid_written_out(spelling="scaled", offset=2.0), "no match"),
        Negative("clip_to_two_is_not_hardsigmoid", pk.from_expr(relax.op.clip(
            _var() * _c(1.0 / 6.0) + _c(0.5), 0, 2)), "no match"),
    ],
    tolerance=HARD_F32)


def test_hardsigmoid_canonicalize_meets_the_rule_contract():
    check_rule(HARDSIGMOID_CASE)


@I.ir_module
class HardswishOnnx:
    """TVM's ``from_onnx`` of ``HardSwish``: the division inside the product."""

    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.add(x, R.const(3.0, "float32"))
            b = R.clip(a, 0, 6)
            c = R.divide(b, R.const(6.0, "float32"))
            out = R.multiply(x, c)
            R.output(out)
        return out


@I.ir_module
class HardswishCanonical:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.add(x, R.const(3.0, "float32"))
            b = R.clip(a, 0, 6)
            c = R.multiply(x, b)
            out = R.divide(c, R.const(6.0, "float32"))
            R.output(out)
        return out


HARDSWISH_CASE = RuleCase(
    HardswishCanonicalize(), HardswishOnnx, HardswishCanonical,
    negatives=[
        Negative("add_two_is_not_hardswish", hardswish_written_out(offset=2.0), "no match"),
        Negative("scaled_add_two_is_not_hardswish",
                 hardswish_written_out(spelling="scaled", offset=2.0), "no match"),
        Negative("hardsigmoid_of_another_tensor", pk.from_expr(
            _var() * relax.op.divide(relax.op.clip(_var(name="y") + _c(3.0), 0, 6), _c(6.0))),
            "no match"),
    ],
    tolerance=HARD_F32)


def test_hardswish_canonicalize_meets_the_rule_contract():
    check_rule(HARDSWISH_CASE)


_ONE_INPUT_COMPOSITE = """
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            @R.function
            def composite(x1: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
                R.func_attr({{"Composite": "byoc.{name}", "PartitionedFromPattern": "{ops}"}})
                with R.dataflow():
{body}
                    R.output(out1)
                return out1

            out = composite(x)
            R.output(out)
        return out
"""


def composite_of_x(name: str, ops: str, *body: str) -> tvm.IRModule:
    """A ``main`` on ``x: (2, 16) float32`` that is one call of the composite ``byoc.<name>``
    (``PartitionedFromPattern`` ``ops``), whose bindings on ``x1`` are ``body``, the last
    one binding ``out1``."""
    lines = "\n".join(" " * 20 + line for line in body)
    return tvm.script.from_source(_ONE_INPUT_COMPOSITE.format(name=name, ops=ops, body=lines))


#: The hard activations' shared start: ``clip(x + 3, 0, 6)``.
_ADD_THREE_CLIP = ('a = R.add(x1, R.const(3.0, "float32"))', "b = R.clip(a, 0, 6)")

HARDSWISH_COMPOSITE_CASE = RuleCase(
    HardswishComposite(), HardswishCanonical, composite_of_x(
        "hardswish", "add_clip_multiply_divide_", *_ADD_THREE_CLIP,
        "c = R.multiply(x1, b)", 'out1 = R.divide(c, R.const(6.0, "float32"))'),
    negatives=[
        Negative("add_two_is_not_hardswish",
                 hardswish_written_out(spelling="canonical", offset=2.0), "no match"),
        Negative("sixth_applied_to_the_clip_waits_for_the_canonicalize_rule",
                 hardswish_written_out(spelling="scaled"), "no match"),
    ],
    tolerance=EXACT)

HARDSIGMOID_COMPOSITE_CASE = RuleCase(
    HardsigmoidComposite(), HardsigmoidCanonical, composite_of_x(
        "hardsigmoid", "add_clip_divide_", *_ADD_THREE_CLIP,
        'out1 = R.divide(b, R.const(6.0, "float32"))'),
    negatives=[
        Negative("add_two_is_not_hardsigmoid",
                 hardsigmoid_written_out(spelling="canonical", offset=2.0), "no match"),
        Negative("written_as_onnx_writes_it_takes_the_canonicalize_rule_first",
                 HardsigmoidOnnx, "no match"),
    ],
    tolerance=EXACT)


def test_hardswish_composite_meets_the_rule_contract():
    check_rule(HARDSWISH_COMPOSITE_CASE)


def test_hardsigmoid_composite_meets_the_rule_contract():
    check_rule(HARDSIGMOID_COMPOSITE_CASE)


def _hard_sites(mod: tvm.IRModule) -> dict[str, int]:
    """The library's rewrites, then its hard-activation composites: composites formed."""
    rewritten = pk.rewrite(LIBRARY.by_prefix("relu6.") | LIBRARY.by_prefix("hardsigmoid.")
                           | LIBRARY.by_prefix("hardswish."), mod)
    return composite_counts(merge_composite(rewritten, LIBRARY.by_prefix("byoc.hard")))


class _Applied(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


#: Every spelling torch.export gives the importer, and the composite it must form.
TORCH_SPELLINGS = [
    ("nn_hardswish", torch.nn.Hardswish(), "hardswish"),
    ("functional_hardswish", torch.nn.functional.hardswish, "hardswish"),
    ("nn_hardsigmoid", torch.nn.Hardsigmoid(), "hardsigmoid"),
    ("x_relu6_x_plus_3_over_6", lambda x: x * torch.nn.functional.relu6(x + 3) / 6,
     "hardswish"),
    ("x_times_relu6_over_6", lambda x: x * (torch.nn.functional.relu6(x + 3) / 6),
     "hardswish"),
    ("x_times_hardsigmoid", lambda x: x * torch.nn.functional.hardsigmoid(x), "hardswish"),
    ("nn_relu6_module", lambda x: x * torch.nn.ReLU6()(x + 3) / 6, "hardswish"),
    ("relu6_over_6", lambda x: torch.nn.functional.relu6(x + 3) / 6, "hardsigmoid"),
    ("add_two_is_neither", lambda x: x * torch.nn.functional.relu6(x + 2) / 6, None),
    ("over_five_is_neither", lambda x: torch.nn.functional.relu6(x + 3) / 5, None),
]


@pytest.mark.parametrize("name, function, composite", TORCH_SPELLINGS,
                         ids=[case[0] for case in TORCH_SPELLINGS])
def test_every_torch_spelling_of_the_hard_activations_forms_its_composite(name, function,
                                                                           composite):
    batch = torch.export.Dim("batch")
    program = torch.export.export(_Applied(function), (torch.randn(3, 16),),
                                  dynamic_shapes=({0: batch},))
    mod = from_torch(program, False, "main", name, {})[0]
    assert _hard_sites(mod) == ({f"byoc.{composite}": 1} if composite else {})
    rewritten = pk.rewrite(LIBRARY.by_prefix("relu6.") | LIBRARY.by_prefix("hardsigmoid.")
                           | LIBRARY.by_prefix("hardswish."), mod)
    pk.assert_same_numerics(mod, rewritten, shape_vars={"batch": 5}, **WIDE,
                            rtol=HARD_F32.rtol, atol=HARD_F32.atol)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("module, composite", [(torch.nn.Hardswish(), "hardswish"),
                                               (torch.nn.Hardsigmoid(), "hardsigmoid")],
                         ids=["hardswish", "hardsigmoid"])
def test_onnx_hard_activations_imported_by_from_onnx_form_their_composite(module, composite,
                                                                         dynamo, tmp_path):
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    path = tmp_path / "model.onnx"
    torch.onnx.export(_Applied(module), (torch.randn(2, 16),), str(path), dynamo=dynamo,
                      opset_version=18 if dynamo else 17)
    mod = from_onnx(onnx.load(str(path)))
    assert _hard_sites(mod) == {f"byoc.{composite}": 1}


@pytest.mark.parametrize("cls, knobs", [
    (cls, {"dtype": dtype, "shape": shape}) for cls in (HardswishComposite, HardsigmoidComposite)
    for dtype in ("float32", "float16") for shape in ("batch_seq", "static", "vector")])
def test_hard_composites_form_in_each_dtype_and_shape(cls, knobs):
    before = cls().example(**knobs)
    assert composite_counts(merge_composite(before, pk.RuleSet([cls()]))) == {
        f"byoc.{cls.pattern_name}": 1}


# -- softplus.collapse --------------------------------------------------------------------------
@I.ir_module
class SoftplusThresholded:
    """torch.export of ``nn.Softplus()`` (beta 1, threshold 20) as the importer writes it."""

    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.multiply(x, R.const(1.0, "float32"))
            b = R.exp(a)
            c = R.add(b, R.const(1.0, "float32"))
            d = R.log(c)
            e = R.divide(d, R.const(1.0, "float32"))
            f = R.greater(a, R.const(20.0, "float32"))
            out = R.where(f, x, e)
            R.output(out)
        return out


@I.ir_module
class Softplus:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            out = R.nn.softplus(x, beta=1.0, threshold=20.0)
            R.output(out)
        return out


SOFTPLUS_CASE = RuleCase(
    SoftplusCollapse(), SoftplusThresholded, Softplus,
    negatives=[
        Negative("threshold_ten_is_not_the_op", softplus_written_out(threshold=10.0),
                 "no match"),
        Negative("bare_log_one_plus_exp_overflows_where_the_op_does_not",
                 pk.from_expr(relax.op.log(relax.op.exp(_var()) + _c(1.0))), "no match"),
        Negative("dynamo_threshold_ten_changes_the_op", softplus_written_out(
            spelling="dynamo", threshold=10.0), "no match"),
    ],
    tolerance=F32)


def test_softplus_collapse_meets_the_rule_contract():
    check_rule(SOFTPLUS_CASE)


@pytest.mark.parametrize("module", [torch.nn.Softplus(), torch.nn.Mish()],
                         ids=["softplus", "mish"])
def test_torch_softplus_and_the_softplus_inside_mish_collapse(module):
    mod = _torch_import(module)
    after = pk.rewrite(SoftplusCollapse(), mod)
    assert "relax.nn.softplus" in _ops(after) and "relax.where" not in _ops(after)
    pk.assert_same_numerics(mod, after, low=-30.0, high=30.0, rtol=F32.rtol, atol=F32.atol)


# -- mish and quick_gelu composites -------------------------------------------------------------
@I.ir_module
class MishWritten:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.nn.softplus(x, beta=1.0, threshold=20.0)
            b = R.tanh(a)
            out = R.multiply(x, b)
            R.output(out)
        return out


MishComposed = composite_of_x("mish", "nn.softplus_tanh_multiply_",
                              "a = R.nn.softplus(x1, beta=1.0, threshold=20.0)",
                              "b = R.tanh(a)", "out1 = R.multiply(x1, b)")


MISH_CASE = RuleCase(
    MishComposite(), MishWritten, MishComposed,
    negatives=[Negative("tanh_of_sigmoid_is_not_mish", mish_written_out(inner="sigmoid"),
                        "no match"),
               Negative("upcast_softplus_of_beta_two", mish_written_out(
                   dtype="float16", inner="softplus_beta2_upcast"),
                        "the softplus has beta 2 and threshold 20: Mish's is the default "
                        "softplus (beta 1, threshold 20)"),
               Negative("softplus_narrowed_to_float16", mish_written_out(
                   inner="softplus_downcast"),
                        "the softplus computes in float16 on a float32 x and is cast to "
                        "float32: only a round trip through a float as wide or wider")],
    tolerance=EXACT)


@I.ir_module
class QuickGeluWritten:
    @R.function
    def main(x: R.Tensor((2, 16), "float32")) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.multiply(x, R.const(1.702, "float32"))
            b = R.sigmoid(a)
            out = R.multiply(x, b)
            R.output(out)
        return out


QuickGeluComposed = composite_of_x("quick_gelu", "multiply_sigmoid_multiply_",
                                   'a = R.multiply(x1, R.const(1.702, "float32"))',
                                   "b = R.sigmoid(a)", "out1 = R.multiply(x1, b)")


QUICK_GELU_CASE = RuleCase(
    QuickGeluComposite(), QuickGeluWritten, QuickGeluComposed,
    negatives=[Negative("scale_one_point_seven_is_not_quick_gelu",
                        quick_gelu_written_out(scale=1.7), "no match"),
               Negative("plain_swish_is_not_quick_gelu", swish(), "no match")],
    tolerance=EXACT)


def test_mish_composite_meets_the_rule_contract():
    check_rule(MISH_CASE)


def test_quick_gelu_composite_meets_the_rule_contract():
    check_rule(QUICK_GELU_CASE)


@pytest.mark.parametrize("cls, knobs, fires", [
    *[(cls, {"dtype": d, "shape": s}, True) for cls in (MishComposite, QuickGeluComposite)
      for d in ("float32", "float16") for s in ("batch_seq", "static", "vector")],
    *[(MishComposite, {"inner": "log1p_exp", "dtype": d}, True) for d in ("float32", "float16")],
    *[(MishComposite, {"inner": "softplus_upcast", "dtype": d}, True)
      for d in ("float16", "bfloat16")],
    (MishComposite, {"inner": "sigmoid"}, False), (QuickGeluComposite, {"scale": 1.7}, False)])
def test_mish_and_quick_gelu_composites_form_only_on_their_formula(cls, knobs, fires):
    before = cls().example(**knobs)
    merged = merge_composite(before, pk.RuleSet([cls()]))
    assert composite_counts(merged) == ({f"byoc.{cls.pattern_name}": 1} if fires else {})
    pk.assert_same_numerics(before, merged, shape_vars={"batch": 3, "seq": 5}, **WIDE,
                            rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_mish_of_the_bare_softplus_is_mish_where_the_softplus_overflows(dtype):
    """``x * tanh(log(1 + exp(x)))`` (from_onnx's Mish, which the composite takes) against
    ``x * tanh(R.nn.softplus(x))`` past exp's overflow (88 in float32, 11 in float16)."""
    bare, op = (mish_written_out(dtype=dtype, shape="vector", inner=inner)
                for inner in ("log1p_exp", "softplus"))
    x = np.concatenate([np.linspace(-100, 100, 14), [11.5, 89.0]]).astype(dtype)
    (got,), (want,) = (pk.verification.numeric.run(m, [x]) for m in (bare, op))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.astype("float64"), want.astype("float64"),
                               rtol=1e-6 if dtype == "float32" else 1e-3, atol=1e-6)


def test_torch_mish_forms_the_mish_composite_once_softplus_is_collapsed():
    mod = _torch_import(torch.nn.Mish())
    assert composite_counts(merge_composite(mod, pk.RuleSet([MishComposite()]))) == {}
    collapsed = pk.rewrite(SoftplusCollapse(), mod)
    assert composite_counts(merge_composite(collapsed, pk.RuleSet([MishComposite()]))) == {
        "byoc.mish": 1}


class _TwoMishes(torch.nn.Module):
    """``nn.Mish`` (ONNX ``Mish``) then Mish written with ``F.softplus`` (ONNX ``Softplus``
    inside the dynamo exporter's threshold ``where``, once ``softplus.collapse`` made it
    ``R.nn.softplus``)."""

    def forward(self, x):
        y = torch.nn.functional.mish(x)
        return y * torch.tanh(torch.nn.functional.softplus(y))


def test_both_mishes_of_a_dynamo_onnx_export_form_the_mish_composite():
    pytest.importorskip("onnxscript")
    from tvm.relax.frontend.onnx import from_onnx

    module, x = _TwoMishes().eval(), torch.linspace(-30, 30, 32).reshape(2, 16)
    model = torch.onnx.export(module, (x,), dynamo=True, verbose=False).model_proto
    mod = from_onnx(model)
    # from_onnx's stable Softplus inside the exporter's where(y > 20, y, ...)
    assert "relax.where" in _ops(mod) and "relax.abs" in _ops(mod)
    collapsed = pk.rewrite(LIBRARY, mod)
    assert "relax.where" not in _ops(collapsed)
    merged = merge_composite(collapsed, LIBRARY.composites())
    assert composite_counts(merged) == {"byoc.mish": 2}
    (got,) = pk.verification.numeric.run(merged, [x.numpy()])
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_both_mishes_of_a_bfloat16_dynamo_onnx_export_form_the_mish_composite():
    # in bfloat16 the exporter divides the softplus by beta cast from a float32 constant:
    # softplus.collapse_cast_beta takes that form once softplus.collapse ran
    pytest.importorskip("onnxscript")
    from tvm.relax.frontend.onnx import from_onnx

    module = _TwoMishes().eval().to(torch.bfloat16)
    x = torch.linspace(-30, 30, 32).reshape(2, 16).to(torch.bfloat16)
    model = torch.onnx.export(module, (x,), dynamo=True, verbose=False).model_proto
    mod = from_onnx(model)
    assert "relax.where" in _ops(mod) and "relax.divide" in _ops(mod)
    log = pk.RewriteLog()
    collapsed = pk.rewrite(LIBRARY, mod, log=log)
    assert log.count("softplus.collapse_cast_beta") == 1  # the F.softplus one (nn.Mish: Mish)
    merged = merge_composite(collapsed, LIBRARY.composites())
    assert composite_counts(merged) == {"byoc.mish": 2}
    pk.assert_same_numerics(mod, merged, rtol=1.6e-2, atol=1.6e-2)


SOFTPLUS_CAST_BETA_CASE = RuleCase(
    SoftplusCastBetaCollapse(), softplus_cast_beta(shape="static"),
    pk.from_expr(relax.op.nn.softplus(example_input("bfloat16", "static"))),
    negatives=[Negative("beta_of_two", softplus_cast_beta(beta=2.0),
                        "the beta is 2, not 1: another beta is another function"),
               Negative("threshold_of_ten", softplus_cast_beta(threshold=10.0),
                        "the threshold is 10, not 20"),
               Negative("softplus_of_beta_two", softplus_cast_beta(softplus_beta=2.0),
                        "the softplus has beta 2 and threshold 20: only the default one")],
    tolerance=EXACT)


def test_softplus_collapse_cast_beta_meets_the_rule_contract():
    check_rule(SOFTPLUS_CAST_BETA_CASE)


def test_quick_gelu_is_not_taken_by_silu_collapse():
    before = quick_gelu_written_out()
    assert not apply_rule(SiluCollapse(), before).fired
    assert composite_counts(merge_composite(before, pk.RuleSet([QuickGeluComposite()]))) == {
        "byoc.quick_gelu": 1}


# -- gelu.expand --------------------------------------------------------------------------------
def _written_gelu(x: relax.Var) -> relax.Expr:
    """GELU as TVM legalises it, erf as Eigen's rational approximation (float32 ``x``)."""
    numerator = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                 -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                 -1.60960333262415e-02)
    denominator = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                   -7.37332916720468e-03, -1.42647390514189e-02)
    z = relax.op.minimum(relax.op.maximum(x * _c(SQRT_HALF), _c(-4.0)), _c(4.0))
    z2 = z * z
    p, q = _c(numerator[0]), _c(denominator[0])
    for coefficient in numerator[1:]:
        p = p * z2 + _c(coefficient)
    for coefficient in denominator[1:]:
        q = q * z2 + _c(coefficient)
    return x * (_c(0.5) + ((z * p) / q) * _c(0.5))


GELU_EXPAND_CASE = RuleCase(
    GeluExpand(), Gelu, pk.from_expr(_written_gelu(Gelu["main"].params[0])),
    negatives=[
        Negative("float64_beyond_the_approximation", gelu_call(dtype="float64"),
                 "the result is float64; gelu.expand accepts float32, float16, bfloat16 "
                 "(dtypes=)"),
        Negative("x_of_unknown_dtype", pk.from_expr(relax.op.nn.gelu(_var(dtype=""))),
                 "the result has no known dtype; gelu.expand was shown float32, float16, "
                 "bfloat16 only"),
        Negative("gelu_tanh_is_not_gelu", GeluTanh, "no match"),
    ],
    tolerance=ERF_APPROXIMATION)


def test_gelu_expand_meets_the_rule_contract():
    check_rule(GELU_EXPAND_CASE)


# -- gelu_tanh.expand ---------------------------------------------------------------------------
def _written_gelu_tanh(x: relax.Var) -> relax.Expr:
    """``R.nn.gelu_tanh`` as TVM legalises it, operation for operation."""
    arg = (_c(SQRT_TWO_OVER_PI) * x) * (_c(1.0) + (_c(CUBIC) * x) * x)
    return (_c(0.5) * x) * (_c(1.0) + relax.op.tanh(arg))


GELU_TANH_EXPAND_CASE = RuleCase(
    GeluTanhExpand(), GeluTanh, pk.from_expr(_written_gelu_tanh(GeluTanh["main"].params[0])),
    negatives=[
        Negative("x_of_unknown_dtype", pk.from_expr(relax.op.nn.gelu_tanh(_var(dtype=""))),
                 "the result has no known dtype; gelu_tanh.expand was shown float32"),
        Negative("gelu_is_not_gelu_tanh", Gelu, "no match"),
    ],
    tolerance=F32)


def test_gelu_tanh_expand_meets_the_rule_contract():
    check_rule(GELU_TANH_EXPAND_CASE)


# -- every spelling, dtype and shape of the examples --------------------------------------------
def _space(cls, refused: dict[str, tuple]) -> list:
    """(rule class, knobs) for every value of every knob of ``cls.example_space()`` (one knob
    at a time off its default), with whether the rule must fire on it."""
    out = []
    for knob, values in cls().example_space().items():
        for value in values:
            fires = value not in refused.get(knob, ())
            out.append(pytest.param(cls, {knob: value}, fires,
                                    id=f"{cls.name}-{knob}={value}"))
    return out


#: Knob values on which a rule must not fire: not GELU (cubic off), not swish (fast-gelu),
#: beyond the erf approximation (float64), a Clip with its bounds reversed.
REFUSED = {GeluTanhCollapse: {"cubic": (0.0447,)}, SiluCollapse: {"sigmoid_of": ("scaled",)},
           Relu6Collapse: {"upper": (5.0,)}, HardsigmoidCanonicalize: {"offset": (2.0,)},
           HardswishCanonicalize: {"offset": (2.0,)}, SoftplusCollapse: {"threshold": (10.0,)},
           GeluExpand: {"dtype": ("float64",)}, OnnxClipCollapse: {"low": (7.0,)},
           OnnxMaxCollapse: {"reduce_axis": (1,), "keepdims": (True,)},
           OnnxMinCollapse: {"reduce_axis": (1,), "keepdims": (True,)},
           SoftplusCastBetaCollapse: {"beta": (2.0,), "threshold": (10.0,),
                                      "softplus_beta": (2.0,)}}

#: Per-dtype tolerances of the example sweep (see F32, F16 and ERF_APPROXIMATION).
TOLERANCES = {"float32": {"rtol": F32.rtol, "atol": F32.atol}, "float16": F16,
              "bfloat16": {"rtol": 1.6e-2, "atol": 1.6e-2},  # 8-bit mantissa, eps 7.8e-3
              "float64": {"rtol": 1e-12, "atol": 1e-12}}


@pytest.mark.parametrize("cls, knobs, fires", [
    case for cls in (*RULES, *ACTIVATION_EXPANSIONS)
    for case in _space(cls, REFUSED.get(cls, {}))])
def test_every_example_variant_fires_or_is_refused_and_keeps_the_numbers(cls, knobs, fires):
    rule = cls()
    before = rule.example(**knobs)
    applied = apply_rule(rule, before)
    assert bool(applied.fired) == fires, (knobs, [r for r, _ in applied.refusals])
    if not fires:
        tvm.ir.assert_structural_equal(applied.module, before)
        return
    dtype = knobs.get("dtype", "float32")
    tolerance = dict(TOLERANCES[dtype])
    if cls is GeluExpand and dtype == "float32":
        tolerance = {"rtol": ERF_APPROXIMATION.rtol, "atol": ERF_APPROXIMATION.atol}
    # Symbolic batch and sequence (the default shape) bound to distinct sizes.
    pk.assert_same_numerics(before, applied.module, shape_vars={"batch": 3, "seq": 5}, **WIDE,
                            **tolerance)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_collapses_keep_symbolic_batch_and_sequence_dims(dtype):
    for cls, op in ((GeluCollapse, "relax.nn.gelu"), (GeluTanhCollapse, "relax.nn.gelu_tanh"),
                    (SiluCollapse, "relax.nn.silu"), (Relu6Collapse, "relax.clip")):
        before = cls().example(dtype=dtype)
        after = pk.rewrite(cls(), before)
        assert _ops(after) == [op]
        tvm.ir.assert_structural_equal(after["main"].ret_ty, before["main"].ret_ty)


# -- the library and EXPANSIONS -----------------------------------------------------------------
def test_the_library_collapses_every_written_activation_and_expansions_undo_it():
    """GELU-erf, GELU-tanh and swish written out one after another, on a symbolic batch."""
    x = _var((tvm.tirx.Var("batch", "int64"), 16))
    tanh_form = _gelu_tanh(_gelu_erf(x))
    mod = pk.from_expr(tanh_form * relax.op.sigmoid(tanh_form))
    collapsed = pk.rewrite(LIBRARY.by_prefix("gelu") | LIBRARY.by_prefix("silu."), mod)
    assert _ops(collapsed) == ["relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu"]
    pk.assert_same_numerics(mod, collapsed, **WIDE, rtol=F32.rtol, atol=F32.atol)
    # Expanding the collapsed graph gives the gradient-ready form with the same numbers.
    expanded = pk.rewrite(EXPANSIONS, collapsed)
    assert not {"relax.nn.gelu", "relax.nn.gelu_tanh", "relax.erf"} & set(_ops(expanded))
    pk.assert_same_numerics(mod, expanded, **WIDE, rtol=ERF_APPROXIMATION.rtol,
                            atol=ERF_APPROXIMATION.atol)


def test_expansions_are_a_separate_rule_set_of_expand_rules():
    assert [n for n in EXPANSIONS.names if n.startswith(("gelu", "silu"))] == [
        "gelu.expand", "gelu_tanh.expand"]
    assert all(name.endswith(".expand") for name in EXPANSIONS.names)
    assert not set(EXPANSIONS.names) & set(LIBRARY.names)
    assert [r.rule_name for r in LIBRARY.by_prefix("gelu.")] == ["gelu.collapse"]
    assert [r.rule_name for r in LIBRARY.by_prefix("gelu_tanh.")] == ["gelu_tanh.collapse"]
    assert [r.rule_name for r in LIBRARY.by_prefix("silu.")] == ["silu.collapse"]


def _loss_gradient(act, x: np.ndarray) -> np.ndarray:
    """d/dx sum(act(x)) by ``relax.transform.Gradient``, built for llvm."""
    xv = _var(x.shape)
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(act(xv)))
        bb.emit_func_output(out)
    mod = bb.get()
    if act in (relax.op.nn.gelu, relax.op.nn.gelu_tanh):
        with pytest.raises(Exception, match="FPrimalGradient has not been registered"):
            relax.transform.Gradient("main")(mod)
        mod = pk.rewrite(EXPANSIONS, mod)
    grad = relax.transform.Gradient("main")(mod)
    vm = build(relax.transform.LegalizeOps()(grad))
    _, (dx,) = vm["main_adjoint"](tvm.runtime.tensor(x))
    return dx.numpy()


def _phi(x: np.ndarray) -> np.ndarray:
    return np.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def test_expanded_gelus_differentiate_to_the_true_derivatives():
    """Gradient has no rule for nn.gelu / nn.gelu_tanh; after EXPANSIONS it differentiates
    them, and the derivative is GELU's to float32 accuracy (erf's derivative is not
    exp(-z^2) but the rational function's: within 4e-6 of it)."""
    x = np.linspace(-6, 6, 241).astype("float32")
    x64 = x.astype("float64")
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    np.testing.assert_allclose(_loss_gradient(relax.op.nn.gelu, x), cdf + x64 * _phi(x64),
                               rtol=0, atol=1e-5)
    u = SQRT_TWO_OVER_PI * (x64 + CUBIC * x64 ** 3)
    t = np.tanh(u)
    d_tanh = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * SQRT_TWO_OVER_PI * (1 + 3 * CUBIC * x64 ** 2)
    np.testing.assert_allclose(_loss_gradient(relax.op.nn.gelu_tanh, x), d_tanh,
                               rtol=0, atol=1e-5)
    s = 1 / (1 + np.exp(-x64))
    np.testing.assert_allclose(_loss_gradient(relax.op.nn.silu, x), s * (1 + x64 * (1 - s)),
                               rtol=0, atol=1e-5)  # silu differentiates without expansion


def test_rational_erf_is_erf_to_float32_rounding():
    """Measured 2.8e-7 on [-6, 6]: two to three float32 ulp near |erf| = 1."""
    z = np.linspace(-6, 6, 1201).astype("float32")
    zv = _var(z.shape)
    got = build(relax.transform.LegalizeOps()(pk.from_expr(rational_erf(zv))))["main"](
        tvm.runtime.tensor(z)).numpy()
    np.testing.assert_allclose(got, np.vectorize(math.erf)(z.astype("float64")),
                               rtol=0, atol=3e-7)


# -- rules by example ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [c for c in (*RULES, *ACTIVATION_EXPANSIONS)
                                 # classes: they have guards
                                 if c not in (OnnxClipCollapse, OnnxMaxCollapse,
                                              OnnxMinCollapse, SoftplusCastBetaCollapse)],
                         ids=lambda cls: cls.name)
def test_each_rule_is_by_example_and_its_written_and_fused_sides_agree_on_llvm(cls):
    """The library builds these rules without the construction-time check (importing the
    library builds nothing); this is that check: every spelling against ``fused``, in each
    accepted dtype, at sizes 1, 4 and mixed, on seeded and adversarial draws."""
    rule = cls()
    assert rule.describe().startswith(f"{cls.name}: by example")
    verify_by_example(rule)


def test_fast_gelu_is_refused_as_gelu_with_a_counterexample():
    """The module docstring's claim: fast-gelu is not GELU, and a by-example rule saying
    so is refused at construction."""
    with pytest.raises(pk.PatternError, match="written and fused differ"):
        rule_by_example("gelu.fast", lambda x: x * relax.op.sigmoid(
            x * relax.const(1.702, x.ty.dtype)), lambda x: relax.op.nn.gelu(x),
            dtypes=("float32",))
