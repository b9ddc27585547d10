"""rmsnorm: Llama's and T5's written-out RMS norms collapse into rms_norm, expand back, and
form a composite."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from script_templates import script_in_dtype
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.rmsnorm import (
    RmsNormCollapse,
    RmsNormComposite,
    RmsNormExpand,
    written_out,
)
from patternkit.testing import EXACT, Negative, RuleCase, Tolerance, apply_rule, check_rule
from patternkit.verification.numeric import build as build_for_checks

EPS = float(np.float32(1e-6))  # the float32 constant's value, as the fused op's attribute

#: float32: rms_norm legalises to rsqrt(mean(x^2) + eps) * x * w, the model's operations in
#: another order; measured max abs error 1.2e-7 on outputs below 4.
F32 = Tolerance(1e-5, 1e-5, "rms_norm legalises to the same float32 operations in another "
                            "order: a few ulp apart")
#: float16: TVM's rms_norm computes in float32 and rounds once; the Llama spelling rounds
#: the normalised value to float16, then its product with w (2 roundings), a norm written
#: out in float16 rounds every step.  Outputs are below 4 (|x / rms(x)| <= sqrt(16), w in
#: [-1, 1)), where a float16 ulp is at most 2e-3; measured max abs error 2.0e-3.
F16 = Tolerance(2e-3, 4e-3, "the written-out graph rounds to float16 after some or all "
                            "steps, the fused op once: a few float16 ulp of outputs below 4")
#: bfloat16: as float16, TVM's kernel computes in float32 and rounds once (bit for bit the
#: float32 norm rounded, measured on llvm); the Llama spelling rounds before and after the
#: weight: measured max abs error 7.8e-3, one bfloat16 ulp of outputs in [1, 2).
BF16 = Tolerance(8e-3, 1.6e-2, "the written-out graph rounds to bfloat16 before and after "
                               "the weight, the fused op once: one bfloat16 ulp of outputs "
                               "below 4")
TOLERANCE = {"float32": F32, "float16": F16, "bfloat16": BF16}
SHAPE_VARS = {"n": 2, "s": 5, "h": 3}
RULE = "rmsnorm.collapse"


#: transformers' LlamaRMSNorm on a half-precision model ("{dtype}"), as torch.export gives
#: it: the norm in float32 between casts.
_LLAMA_RMS_NORM = '''
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "{dtype}"), w: R.Tensor((16,), "{dtype}"),
             ) -> R.Tensor(("n", "s", 16), "{dtype}"):
        with R.dataflow():
            h = R.astype(x, "float32")
            sq = R.power(h, R.const(2.0, "float32"))
            var = R.mean(sq, axis=[-1], keepdims=True)
            radicand = R.add(var, R.const(1e-6, "float32"))
            inv = R.rsqrt(radicand)
            y = R.multiply(h, inv)
            back = R.astype(y, "{dtype}")
            out = R.multiply(w, back)
            R.output(out)
        return out
'''

#: What the collapse makes of it: one rms_norm in the model's dtype.
_COLLAPSED = '''
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "{dtype}"), w: R.Tensor((16,), "{dtype}"),
             ) -> R.Tensor(("n", "s", 16), "{dtype}"):
        with R.dataflow():
            out = R.nn.rms_norm(x, w, axes=[-1], epsilon={eps})
            R.output(out)
        return out
'''.replace("{eps}", repr(EPS))

LlamaRmsNorm = script_in_dtype(_LLAMA_RMS_NORM, "float16")
Collapsed = script_in_dtype(_COLLAPSED, "float16")


def norm_then_scaled() -> tvm.IRModule:
    """What the collapse makes of a float32 RMS norm times a full-tensor ``w``: the bare
    norm collapses (a weight of ones), the product stays outside."""
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    w = relax.Var("w", relax.TensorType((2, 5, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            ones = bb.emit(relax.op.ones((16,), "float32"))
            norm = bb.emit(relax.op.nn.rms_norm(x, ones, axes=[-1], epsilon=EPS))
            out = bb.emit_output(bb.emit(relax.op.multiply(w, norm)))
        bb.emit_func_output(out)
    return bb.get()


def eps_outside_the_root() -> tvm.IRModule:
    """``x / (sqrt(mean(x^2)) + eps)``: a different function, not an RMS norm."""
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    rms = relax.op.sqrt(relax.op.mean(x * x, [-1], keepdims=True))
    return pk.from_expr(x / (rms + relax.const(1e-6, "float32")))


def float16_normalised_into_bfloat16() -> tvm.IRModule:
    """A float16 ``x`` normalised in float32 and cast to bfloat16: no exact cast of x."""
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float16"))
    h = relax.op.astype(x, "float32")
    y = h * relax.op.rsqrt(relax.op.mean(h * h, [-1], keepdims=True)
                           + relax.const(1e-6, "float32"))
    return pk.from_expr(relax.op.astype(y, "bfloat16"))


def float16_norm_then_cast_to_bfloat16() -> tvm.IRModule:
    """What the collapse makes of it: the float32 norm of the widened x, then the cast."""
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float16"))
    ones = relax.op.ones((16,), "float32")
    norm = relax.op.nn.rms_norm(relax.op.astype(x, "float32"), ones, axes=[-1], epsilon=EPS)
    return pk.from_expr(relax.op.astype(norm, "bfloat16"))


example = written_out
COLLAPSE_CASE = RuleCase(
    RmsNormCollapse(), LlamaRmsNorm, Collapsed,
    negatives=[
        Negative("float64_x", example(dtype="float64", spelling="plain"),
                 "x has dtype float64: rmsnorm.collapse handles float32, float16 and "
                 "bfloat16"),
        Negative("float64_x_computed_in_float32", example(dtype="float64"),
                 "x has dtype float64"),
        Negative("mean_over_the_leading_axis", example(mean_axes="leading"),
                 "the mean reduces the axes [0] of a rank-3 x, not its last 1"),
        Negative("norm_over_every_axis", example(rank=2, axes=2),
                 "the mean reduces every axis of the rank-2 x: TVM 0.27's rms_norm over all "
                 "of its input's axes does not build"),
        Negative("vector_eps", example(eps="vector"),
                 "eps has shape (16,): epsilon must be a scalar constant"),
        Negative("full_tensor_weight", example(weight="full"),
                 "the weight has shape (2, 5, 16): it varies along more than the normalised "
                 "dims (16,)", expected=norm_then_scaled()),
        Negative("eps_outside_the_root", eps_outside_the_root(),
                 "no match: sqrt(add(mean("),
        Negative("float16_x_bfloat16_result", float16_normalised_into_bfloat16(),
                 "x has dtype float16 and the result bfloat16: neither holds the other's "
                 "values", expected=float16_norm_then_cast_to_bfloat16()),
    ],
    tolerance=F16)


def rms_norms(mod: tvm.IRModule) -> list:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if pk.ir.op_name(b.value) == "relax.nn.rms_norm"]


def test_rmsnorm_collapse_meets_the_rule_contract():
    check_rule(COLLAPSE_CASE)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("knobs", [
    {}, {"symbolic": True}, {"spelling": "t5"}, {"spelling": "plain"}, {"root": "sqrt"},
    {"root": "reciprocal"},
    {"square": "multiply"}, {"square": "square"}, {"weight": "none"},
    {"rank": 4, "axes": 2}, {"rank": 4, "axes": 2, "symbolic": True}, {"rank": 2},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "llama")
def test_every_spelling_collapses_with_the_numbers_kept(knobs, dtype):
    rule = RmsNormCollapse()
    before = rule.example(dtype=dtype, **knobs)
    applied = apply_rule(rule, before)
    assert applied.fired == 1
    (norm,) = rms_norms(applied.module)
    axes = knobs.get("axes", 1)
    assert [int(a) for a in norm.attrs.axes] == list(range(-axes, 0))
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, applied.module, rtol=tol.rtol, atol=tol.atol,
                            shape_vars=SHAPE_VARS)


def test_a_float16_norm_returned_in_float32_runs_in_float32():
    # h = astype(x, f32); y = h * rsqrt(mean(h^2) + eps), no cast back: the output is f32.
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float16"))
    h = relax.op.astype(x, "float32")
    y = h * relax.op.rsqrt(relax.op.mean(h * h, [-1], keepdims=True)
                           + relax.const(1e-6, "float32"))
    before = pk.from_expr(y)
    log = pk.RewriteLog()
    after = pk.rewrite(RmsNormCollapse(), before, log=log)
    (norm,) = rms_norms(after)
    assert log.count(RULE) == 1
    assert norm.args[0].ty.dtype == "float32"  # x widened first: no precision lost
    pk.assert_same_numerics(before, after, rtol=F32.rtol, atol=F32.atol)


def test_a_bfloat16_norm_collapses_as_tvm_builds_it_and_the_log_names_the_precision(caplog):
    # the contract's proofs on bfloat16 (a case built here: the meta-tests read one
    # module-level case per rule, COLLAPSE_CASE, whose negatives cover every refusal)
    check_rule(RuleCase(RmsNormCollapse(), script_in_dtype(_LLAMA_RMS_NORM, "bfloat16"),
                        script_in_dtype(_COLLAPSED, "bfloat16"),
                        negatives=COLLAPSE_CASE.negatives[:1], tolerance=BF16))
    # the plain spelling, computed in bfloat16 throughout, takes the float32 kernel too
    before = written_out(dtype="bfloat16", spelling="plain", square="multiply", symbolic=True)
    with caplog.at_level("INFO", logger="patternkit.patterns.rmsnorm"):
        after = pk.rewrite(RmsNormCollapse(), before)
    (norm,) = rms_norms(after)
    assert norm.args[0].ty.dtype == "bfloat16"
    assert "computed in float32 by R.nn.rms_norm and rounded once to bfloat16" in caplog.text
    pk.assert_same_numerics(before, after, rtol=BF16.rtol, atol=BF16.atol,
                            shape_vars=SHAPE_VARS)


# -- rmsnorm.expand ------------------------------------------------------------------------------
@I.ir_module
class Expanded:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float16"), w: R.Tensor((16,), "float16"),
             ) -> R.Tensor(("n", "s", 16), "float16"):
        with R.dataflow():
            h = R.astype(x, "float32")
            var = R.mean(R.multiply(h, h), axis=[-1], keepdims=True)
            y = R.divide(h, R.sqrt(R.add(var, R.const(EPS, "float32"))))
            back = R.astype(y, "float16")
            out = R.multiply(back, w)
            R.output(out)
        return out


#: The expansion is the Llama spelling, so it rounds to float16 twice (after the norm, after
#: the weight) where the fused op rounds once: 1 float16 ulp of outputs below 4.
EXPAND_F16 = Tolerance(1e-3, 2e-3, "the expansion rounds to float16 before the weight, the "
                                   "fused op after it: one float16 ulp of outputs below 4")

EXPAND_CASE = RuleCase(
    RmsNormExpand(), Collapsed, Expanded,
    negatives=[
        Negative("float64_x", RmsNormExpand().example(dtype="float64"),
                 "x has dtype float64: rmsnorm.expand writes out float32, float16 and "
                 "bfloat16 norms only"),
        Negative("norm_over_the_first_axis", RmsNormExpand().example(axes=0),
                 "the rms_norm reduces the axes [0] of a rank-3 x, not its last 1: the weight "
                 "would not broadcast against x"),
    ],
    tolerance=EXPAND_F16)


def test_rmsnorm_expand_meets_the_rule_contract():
    check_rule(EXPAND_CASE)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rank, axes, symbolic", [(3, 1, False), (3, 1, True), (2, 1, False),
                                                  (4, 2, True)])
def test_expanded_norms_keep_the_numbers_and_collapse_back(rank, axes, symbolic, dtype):
    before = RmsNormExpand().example(dtype=dtype, rank=rank, axes=axes, symbolic=symbolic)
    expanded = pk.rewrite(EXPANSIONS, before)
    assert not rms_norms(expanded)
    tol = {"float32": F32, "float16": EXPAND_F16, "bfloat16": BF16}[dtype]
    pk.assert_same_numerics(before, expanded, rtol=tol.rtol, atol=tol.atol,
                            shape_vars=SHAPE_VARS)
    log = pk.RewriteLog()
    collapsed = pk.rewrite(LIBRARY, expanded, log=log)
    assert log.count(RULE) == 1 and len(rms_norms(collapsed)) == 1


def test_an_expanded_norm_can_be_differentiated():
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16,), "float32"))
    fused = pk.from_expr(relax.op.sum(relax.op.nn.rms_norm(x, w, axes=[-1])))
    with pytest.raises(Exception, match="FPrimalGradient has not been registered"):
        relax.transform.Gradient("main")(fused)
    relax.transform.Gradient("main")(pk.rewrite(EXPANSIONS, fused))


# -- the composite -------------------------------------------------------------------------------
@I.ir_module
class Norm32:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), w: R.Tensor((16,), "float32"),
             ) -> R.Tensor(("n", "s", 16), "float32"):
        with R.dataflow():
            out = R.nn.rms_norm(x, w, axes=[-1], epsilon=1e-6)
            R.output(out)
        return out


@I.ir_module
class NormComposite:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), w: R.Tensor((16,), "float32"),
             ) -> R.Tensor(("n", "s", 16), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            @R.function
            def composite(x1: R.Tensor((n, s, 16), "float32"), w1: R.Tensor((16,), "float32"),
                          ) -> R.Tensor((n, s, 16), "float32"):
                R.func_attr({"Composite": "byoc.rms_norm",
                             "PartitionedFromPattern": "nn.rms_norm_"})
                with R.dataflow():
                    out1 = R.nn.rms_norm(x1, w1, axes=[-1], epsilon=1e-6)
                    R.output(out1)
                return out1

            out = composite(x, w)
            R.output(out)
        return out


COMPOSITE_CASE = RuleCase(
    RmsNormComposite(), Norm32, NormComposite,
    negatives=[Negative(f"norm_over_{name}", RmsNormComposite().example(axes=axes), reason)
               for name, axes, reason in (
                   ("two_axes", 2, "the rms_norm normalises axes [-2, -1] of a rank-3 tensor: "
                                   "the backends' kernels take the last axis only"),
                   ("the_first_axis", 0, "the rms_norm normalises axes [0] of a rank-3 "
                                         "tensor"))],
    tolerance=EXACT)


def test_rms_norm_composite_meets_the_rule_contract():
    check_rule(COMPOSITE_CASE)


def test_the_composite_is_named_for_the_compiler():
    assert RmsNormComposite("cutlass").rule_name == "cutlass.rms_norm"
    assert "byoc.rms_norm" in LIBRARY.names


@pytest.mark.models
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("module", ["llama", "t5"])
def test_transformers_rms_norms_as_torch_export_delivers_them_collapse(module, dtype):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    cls = {"llama": LlamaRMSNorm, "t5": T5LayerNorm}[module]
    norm = cls(16, eps=1e-6).eval().to(getattr(torch, dtype))
    torch.nn.init.uniform_(norm.weight)
    program = torch.export.export(norm, (torch.randn(2, 5, 16, dtype=norm.weight.dtype),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    before = from_exported_program(program, unwrap_unit_return_tuple=True)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count(RULE) == 1
    ops = {pk.ir.op_name(b.value) for block in after["main"].body.blocks
           for b in block.bindings} - {None}
    assert ops == {"relax.nn.rms_norm"}
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol,
                            shape_vars={"batch": 2})


def _run(mod, model):
    """``mod``'s entry function on the zoo model's inputs (and kept weights), as numpy."""
    vm = build_for_checks(mod)
    out = vm[model.entry](*(tvm.runtime.tensor(np.array(a)) for a in model.arguments()))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


@pytest.mark.models
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_rms_norm_of_the_zoo_llama_collapses_with_the_output_kept(dtype, zoo):
    model = zoo("llama", dtype=dtype)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, model.mod, log=log)
    count = model.families["rmsnorm"]
    assert count and log.count(RULE) == count
    fused = [pk.ir.op_name(b.value) for block in after[model.entry].body.blocks
             for b in block.bindings].count("relax.nn.rms_norm")
    assert fused == count
    # float32: 1e-4 on the model output (measured: bit-identical).  float16: the collapsed
    # norms round once where the written-out ones round twice; the model output (below 4)
    # moves by one float16 ulp (measured 2.2e-3 with two layers); allowed: two ulp.
    atol = {"float32": 1e-4, "float16": 4e-3}[dtype]
    got, before = _run(after, model), _run(model.mod, model)
    np.testing.assert_allclose(got.astype("float64"), before.astype("float64"), rtol=0,
                               atol=atol)


def test_an_onnx_norm_whose_noop_cast_the_next_residual_reads_collapses_and_keeps_the_cast():
    # torch.onnx ties T5LayerNorm's `hidden_states.to(float32)` (a no-op in float32) to the
    # residual after it, and torch.rsqrt arrives as 1 / sqrt: the norm must still collapse.
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            h = bb.emit(relax.op.astype(x, "float32"))
            var = bb.emit(relax.op.mean(bb.emit(relax.op.power(h, relax.const(2.0))), [-1],
                                        keepdims=True))
            root = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(var, relax.const(1e-6)))))
            inverse = bb.emit(relax.op.divide(relax.const(1.0), root))
            normed = bb.emit(relax.op.multiply(w, bb.emit(relax.op.multiply(h, inverse))))
            out = bb.emit_output(relax.op.add(h, normed))  # the residual reads the cast
        bb.emit_func_output(out)
    before = bb.get()
    log = pk.RewriteLog()
    after = pk.rewrite(RmsNormCollapse(), before, log=log)
    assert log.counts() == {"rmsnorm.collapse": 1}
    (norm,) = rms_norms(after)
    ops = [pk.ir.op_name(b.value) for b in after["main"].body.blocks[0].bindings]
    assert ops.count("relax.astype") == 1  # kept for the residual
    assert "relax.sqrt" not in ops
    tol = TOLERANCE["float32"]
    pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.models
@pytest.mark.parametrize("name, options", [("t5", {}), ("onnx:t5", {"opset": 14}),
                                           ("onnx:t5", {"opset": 17})])
def test_every_t5_layer_norm_collapses_through_torch_export_and_onnx(name, options, zoo):
    # ONNX writes torch.rsqrt as Sqrt + Reciprocal and ties the no-op cast of x to the
    # next residual; torch.export drops the cast
    model = zoo(name, **options)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, model.mod, log=log)
    count = model.families["rmsnorm"]
    assert count == 3 and log.count(RULE) == count
    ops = [pk.ir.op_name(b.value) for block in after[model.entry].body.blocks
           for b in block.bindings]
    assert ops.count("relax.nn.rms_norm") == count and "relax.sqrt" not in ops
    np.testing.assert_allclose(_run(after, model), _run(model.mod, model), rtol=0, atol=1e-4)

