"""layernorm: written-out layer norms collapse into layer_norm, expand back, and form composites."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.byoc import composite_functions, merge_composite
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.layernorm import LayerNormCollapse, LayerNormComposite, LayerNormExpand
from patternkit.patterns.layernorm.examples import layer_norm_graph
from patternkit.testing import EXACT, Negative, RuleCase, Tolerance, apply_rule, check_rule
from patternkit.verification.numeric import build as build_for_checks, random_inputs, run

EPS = float(np.float32(1e-5))  # the float32 constant's value, as the fused op's attribute

#: float32: the fused op computes the same mean and variance in float32 in another order;
#: measured max abs error 1.2e-7 on outputs of magnitude < 4, i.e. a few ulp.
F32 = Tolerance(1e-5, 1e-5, "layer_norm legalises to the same float32 mean and variance "
                            "in another order: a few ulp apart")
#: float16: the written-out graph rounds each of its ~8 steps (x - mean, its square, the
#: mean, + eps, sqrt, divide, * gamma, + beta) to float16, the fused op computes in
#: float32 and rounds once.  Outputs have magnitude < 4, where a float16 ulp is at most
#: 2e-3; measured max abs error 2.9e-3.  Allowed: 2 ulp relative and 2 ulp of |y| < 4.
F16 = Tolerance(2e-3, 4e-3, "the written-out float16 graph rounds every step to float16, "
                            "the fused op once: a few float16 ulp of outputs below 4")
#: bfloat16: TVM has no bfloat16 layer_norm, so the collapse computes it in float32 between
#: casts (bit for bit the float32 norm rounded once); the written-out bfloat16 graph rounds
#: every step.  Measured max abs error 1.6e-2 (one bfloat16 ulp of outputs in [2, 4)).
BF16 = Tolerance(1.6e-2, 3.2e-2, "the written-out bfloat16 graph rounds every step, the "
                                 "float32 norm between casts once: a bfloat16 ulp or two of "
                                 "outputs below 4")
TOLERANCE = {"float32": F32, "float16": F16, "bfloat16": BF16}
SHAPE_VARS = {"n": 2, "s": 5, "h": 3}


@I.ir_module
class WrittenOut:  # ONNX below opset 17: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), gamma: R.Tensor((16,), "float32"),
             beta: R.Tensor((16,), "float32")) -> R.Tensor(("n", "s", 16), "float32"):
        with R.dataflow():
            mean = R.mean(x, axis=[-1], keepdims=True)
            d = R.subtract(x, mean)
            sq = R.power(d, R.const(2.0, "float32"))
            var = R.mean(sq, axis=[-1], keepdims=True)
            radicand = R.add(var, R.const(1e-5, "float32"))
            std = R.sqrt(radicand)
            y = R.divide(d, std)
            scaled = R.multiply(y, gamma)
            out = R.add(scaled, beta)
            R.output(out)
        return out


@I.ir_module
class Collapsed:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), gamma: R.Tensor((16,), "float32"),
             beta: R.Tensor((16,), "float32")) -> R.Tensor(("n", "s", 16), "float32"):
        with R.dataflow():
            out = R.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=EPS)
            R.output(out)
        return out


def written_out(x_ty=None, mean_axes=(-1,), var_axes=None, keepdims=True, eps=None,
                gamma_ty=None, beta=True) -> tvm.IRModule:
    """``(x - mean) / sqrt(mean((x - mean)^2) + eps) * gamma [+ beta]``, parts replaceable
    by ones no knob of the rule's example makes (:func:`layer_norm_graph` builds it).

    Defaults: ``x: (2, 5, 16)`` float32, means over the last axis, ``eps = 1e-5``, a
    ``(16,)`` gamma and beta.
    """
    x = relax.Var("x", x_ty or relax.TensorType((2, 5, 16), "float32"))
    dtype = x.ty.dtype
    g = relax.Var("gamma", gamma_ty or relax.TensorType((16,), dtype))
    b = relax.Var("beta", relax.TensorType((16,), dtype)) if beta else None
    eps = relax.const(1e-5, dtype) if eps is None else eps
    return layer_norm_graph(x, g, b, eps, mean_axes, var_axes, keepdims=keepdims,
                            square="multiply")


D, E = tvm.tirx.Var("d", "int64"), tvm.tirx.Var("e", "int64")

#: Written-out norms the collapse must refuse, and the reason it gives for each.
REFUSED = {
    "x_of_unknown_rank": (lambda: written_out(relax.TensorType(ndim=-1, dtype="float32")),
                          "x has an unknown rank"),
    "x_without_shape": (lambda: written_out(relax.TensorType(ndim=3, dtype="float32")),
                        "x has rank 3 but no known shape"),
    "float64_x": (lambda: written_out(relax.TensorType((2, 5, 16), "float64")),
                  "x has dtype float64: TVM's layer_norm computes float32 and float16 only "
                  "(and bfloat16 in float32 between casts)"),
    "mean_over_the_leading_axis": (lambda: LayerNormCollapse().example(mean_axes="leading"),
                                   "the mean reduces the axes [0] of a rank-3 x, not its "
                                   "last 1: a layer norm normalises trailing axes"),
    "mean_over_a_middle_axis": (lambda: written_out(mean_axes=(1,), gamma_ty=relax.TensorType(
        (5, 1), "float32")), "the mean reduces the axes [1] of a rank-3 x, not its last 1"),
    "means_without_keepdims": (lambda: written_out(relax.TensorType((16, 16), "float32"),
                                                   keepdims=False),
                               "drops the reduced axes (keepdims=False)"),
    "variance_over_more_axes": (lambda: written_out(var_axes=(-2, -1)),
                                "the mean reduces the last 1 axes of x but the variance the "
                                "last 2"),
    "variable_eps": (lambda: LayerNormCollapse().example(eps="variable"),
                     "eps is 'eps', not a constant"),
    "vector_eps": (lambda: LayerNormCollapse().example(eps="vector"),
                   "eps has shape (16,): epsilon must be a scalar constant"),
    "centring_mean_over_more_axes": (
        lambda: layer_norm_graph(relax.Var("x", relax.TensorType((2, 5, 16), "float32")),
                                 None, None, relax.const(1e-5, "float32"), (-2, -1),
                                 variance_reduce=(-1,), numerator_reduce=(-1,)),
        "the variance centres x with a mean over its last 2 axes, the numerator with one "
        "over its last 1: not one mean computed twice"),
    "variance_reshaped_to_another_shape": (
        lambda: layer_norm_graph(relax.Var("x", relax.TensorType((1, 5, 16), "float32")),
                                 None, None, relax.const(1e-5, "float32"), (-1,),
                                 reshape_variance=True, variance_shape=(5, 1)),
        "the variance is reshaped to (5, 1), not to the mean's shape (1, 5, 1)"),
    "float32_variance_widened_to_float64": (
        lambda: LayerNormCollapse().example(widened="variance"),
        "the variance runs in float64 between casts of float32 x: TVM's layer_norm computes "
        "float32 norms in float32"),
    "float32_normalisation_widened_to_float64": (
        lambda: LayerNormCollapse().example(widened="normalisation"),
        "the normalisation runs in float64 between casts of float32 x"),
    "widened_normalisation_cast_to_another_dtype": (
        lambda: layer_norm_graph(relax.Var("x", relax.TensorType((2, 5, 16), "float16")),
                                 None, None, relax.const(1e-5, "float16"), (-1,),
                                 widened="normalisation", wide_dtype="float64",
                                 back_dtype="float32"),
        "the normalisation runs in float64 from float16 and is cast to float32, not back to "
        "float16"),
    "eps_of_higher_rank": (lambda: written_out(eps=relax.const(np.full((1, 1, 1, 1), 1e-5,
                                                                       "float32"))),
                           "eps has rank 4, more than x's 3"),
}



def norm_then_scaled(gamma_shape, gamma_dtype="float32", x_shape=(2, 5, 16)) -> tvm.IRModule:
    """What the collapse makes of a norm scaled by a gamma it refuses: the bare norm
    collapses (ones and zeros for gamma and beta), the scale stays outside."""
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    g = relax.Var("gamma", relax.TensorType(gamma_shape, gamma_dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g]):
        with bb.dataflow():
            ones = bb.emit(relax.op.ones(x_shape[-1:], "float32"))
            zeros = bb.emit(relax.op.zeros(x_shape[-1:], "float32"))
            norm = bb.emit(relax.op.nn.layer_norm(x, ones, zeros, axes=[-1], epsilon=EPS))
            out = bb.emit_output(bb.emit(relax.op.multiply(norm, g)))
        bb.emit_func_output(out)
    return bb.get()


#: Norms scaled by a gamma that is not per-feature: refused as a whole, the bare norm
#: underneath collapses.
SCALED_OUTSIDE = {
    "scalar_gamma": ("scalar", (), "gamma has shape (): it must cover the normalised dims "
                                   "(16,)"),
    "full_tensor_gamma": ("full", (2, 5, 16), "gamma has shape (2, 5, 16): it varies along "
                                              "more than the normalised dims (16,)"),
}

COLLAPSE_CASE = RuleCase(
    LayerNormCollapse(), WrittenOut, Collapsed,
    negatives=[*(Negative(name, make(), reason) for name, (make, reason) in REFUSED.items()),
               *(Negative(name, LayerNormCollapse().example(gamma=knob, affine="gamma"),
                          reason, expected=norm_then_scaled(shape))
                 for name, (knob, shape, reason) in SCALED_OUTSIDE.items()),
               Negative("gamma_of_unknown_dtype",
                        written_out(gamma_ty=relax.TensorType((16,), ""), beta=False),
                        "gamma has dtype None, x has float32",
                        expected=norm_then_scaled((16,), "")),
               Negative("gamma_of_undecidable_size",
                        written_out(relax.TensorType((2, 5, D), "float32"),
                                    gamma_ty=relax.TensorType((E,), "float32"), beta=False),
                        "cannot decide whether its dim e equals the normalised dim d",
                        expected=norm_then_scaled((E,), x_shape=(2, 5, D)))],
    tolerance=F32)


def collapse(mod):
    log = pk.RewriteLog()
    return pk.rewrite(LayerNormCollapse(), mod, log=log), log


def layer_norms(mod: tvm.IRModule) -> list:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if pk.ir.op_name(b.value) == "relax.nn.layer_norm"]


def test_layernorm_collapse_meets_the_rule_contract():
    proof = check_rule(COLLAPSE_CASE)
    assert {r.negative.name for r in proof.negatives} == (set(REFUSED) | set(SCALED_OUTSIDE)
                                                     | {"gamma_of_unknown_dtype",
                                                        "gamma_of_undecidable_size"})


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("knobs", [
    {}, {"symbolic": True}, {"root": "rsqrt"}, {"root": "reciprocal"}, {"square": "multiply"},
    {"square": "square"},
    {"square": "variance"}, {"centered": "recomputed"}, {"affine": "gamma"},
    {"affine": "beta"}, {"affine": "none"}, {"rank": 4, "axes": 2},
    {"rank": 4, "axes": 2, "symbolic": True}, {"rank": 2},
    {"mean": "twice"}, {"variance_keepdims": "reshaped"},
    {"mean": "twice", "variance_keepdims": "reshaped", "symbolic": True},
    {"square": "variance", "variance_keepdims": "reshaped", "rank": 4, "axes": 2},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "onnx")
def test_every_spelling_collapses_with_the_numbers_kept(knobs, dtype):
    rule = LayerNormCollapse()
    before = rule.example(dtype=dtype, **knobs)
    applied = apply_rule(rule, before)
    assert applied.fired == 1
    (norm,) = layer_norms(applied.module)
    axes = knobs.get("axes", 1)
    assert [int(a) for a in norm.attrs.axes] == list(range(-axes, 0))
    assert float(norm.attrs.epsilon) == float(np.dtype(dtype).type(1e-5))  # the model's eps
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, applied.module, rtol=tol.rtol, atol=tol.atol,
                            shape_vars=SHAPE_VARS)


@pytest.mark.parametrize("knobs", [
    {"widened": "variance"}, {"widened": "variance", "variance_keepdims": "reshaped"},
    {"widened": "variance", "rank": 4, "axes": 2, "symbolic": True, "square": "multiply"},
    {"widened": "normalisation"}, {"widened": "normalisation", "root": "reciprocal"},
    {"widened": "normalisation", "rank": 4, "axes": 2, "symbolic": True, "affine": "none"},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_a_float16_norm_with_wider_statistics_collapses_and_logs_their_precision(knobs, caplog):
    """The dynamo exporter takes a float16 variance over several axes in float32, the
    TorchScript exporter a float16 LayerNorm's whole normalisation in float64: the fused
    op's float32 statistics are within float16 rounding of either."""
    rule = LayerNormCollapse()
    before = rule.example(dtype="float16", **knobs)
    with caplog.at_level("INFO", logger="patternkit.patterns.layernorm.collapse"):
        applied = apply_rule(rule, before)
    assert applied.fired == 1
    (norm,) = layer_norms(applied.module)
    assert [int(a) for a in norm.attrs.axes] == list(range(-knobs.get("axes", 1), 0))
    assert "astype" not in applied.module.script()
    wide = "float32" if knobs["widened"] == "variance" else "float64"
    assert f"ran in {wide} between casts of float16 x" in caplog.text
    pk.assert_same_numerics(before, applied.module, rtol=F16.rtol, atol=F16.atol,
                            shape_vars=SHAPE_VARS)


BF16_EPS = float(ml_dtypes.bfloat16(1e-5))  # the model's bfloat16 eps, as the op's attribute


@I.ir_module
class CollapsedBf16:  # TVM has no bfloat16 layer_norm: float32 between casts
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "bfloat16"), gamma: R.Tensor((16,), "bfloat16"),
             beta: R.Tensor((16,), "bfloat16")) -> R.Tensor(("n", "s", 16), "bfloat16"):
        with R.dataflow():
            wide = R.nn.layer_norm(R.astype(x, "float32"), R.astype(gamma, "float32"),
                                   R.astype(beta, "float32"), axes=[-1],
                                   epsilon=BF16_EPS)
            narrowed = R.astype(wide, "bfloat16")
            out = narrowed
            R.output(out)
        return out


def _bf16_case() -> RuleCase:
    # built in the test, not at module level: the library's meta-tests read one case per
    # rule (COLLAPSE_CASE)
    return RuleCase(
        LayerNormCollapse(),
        LayerNormCollapse().example(dtype="bfloat16", square="multiply", symbolic=True),
        CollapsedBf16,
        negatives=[Negative(
            "bfloat16_variance_narrowed_to_float16",
            layer_norm_graph(relax.Var("x", relax.TensorType((2, 5, 16), "bfloat16")), None,
                             None, relax.const(1e-5, "bfloat16"), (-1,), square="multiply",
                             widened="variance", wide_dtype="float16"),
            "the variance runs in float16 between casts of bfloat16 x")],
        tolerance=BF16)


def test_layernorm_collapse_meets_the_rule_contract_in_bfloat16():
    check_rule(_bf16_case())


@pytest.mark.parametrize("knobs", [
    {"square": "square", "rank": 4, "axes": 2},
    {"square": "multiply", "mean": "twice", "variance_keepdims": "reshaped", "root": "reciprocal"},
    {"square": "variance", "affine": "none"},
    {"widened": "variance", "symbolic": True},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_a_bfloat16_norm_collapses_in_float32_between_casts_and_logs_it(knobs, caplog):
    rule = LayerNormCollapse()
    before = rule.example(dtype="bfloat16", **knobs)
    with caplog.at_level("INFO", logger="patternkit.patterns.layernorm.collapse"):
        applied = apply_rule(rule, before)
    assert applied.fired == 1
    (norm,) = layer_norms(applied.module)
    assert norm.args[0].ty.dtype == "float32"
    assert [int(a) for a in norm.attrs.axes] == list(range(-knobs.get("axes", 1), 0))
    assert "the bfloat16 norm at" in caplog.text and "computed in float32 between casts" \
        in caplog.text
    pk.assert_same_numerics(before, applied.module, rtol=BF16.rtol, atol=BF16.atol,
                            shape_vars=SHAPE_VARS)


def test_a_gamma_with_leading_unit_dims_is_reshaped_to_the_normalised_shape():
    before = written_out(gamma_ty=relax.TensorType((1, 1, 16), "float32"))
    after, log = collapse(before)
    (norm,) = layer_norms(after)
    assert log.count("layernorm.collapse") == 1
    assert pk.ir.static_shape(norm.args[1].ty) == (16,)
    pk.assert_same_numerics(before, after, rtol=F32.rtol, atol=F32.atol)


def test_float16_collapse_is_closer_to_the_exact_norm_than_the_written_out_graph():
    before = LayerNormCollapse().example(dtype="float16")
    after, _ = collapse(before)
    inputs = random_inputs(before["main"], seed=3)
    x, gamma, beta = (a.astype("float64") for a in inputs)
    mean = x.mean(-1, keepdims=True)
    exact = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    (written,), (fused,) = run(before, inputs), run(after, inputs)
    assert np.abs(fused - exact).max() <= np.abs(written - exact).max()


def test_a_norm_whose_intermediate_is_read_elsewhere_is_left_alone():
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    mean = relax.op.mean(x, [-1], keepdims=True)
    d = relax.op.subtract(x, mean)
    y = d / relax.op.sqrt(relax.op.mean(d * d, [-1], keepdims=True)
                          + relax.const(1e-5, "float32"))
    before = pk.from_expr(relax.Tuple([y, mean]))  # the mean is an output too
    after, log = collapse(before)
    assert not layer_norms(after) and log.count("layernorm.collapse") == 0
    tvm.ir.assert_structural_equal(after, before)


def test_decompose_ops_for_training_output_collapses_back():
    original = LayerNormExpand().example()
    decomposed = relax.transform.DecomposeOpsForTraining()(original)
    assert not layer_norms(decomposed)
    after, log = collapse(decomposed)
    assert log.count("layernorm.collapse") == 1 and len(layer_norms(after)) == 1
    pk.assert_same_numerics(original, after, rtol=F32.rtol, atol=F32.atol)


def test_the_library_collapses_every_norm_of_a_stack():
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    y = x
    for _ in range(3):
        mean = relax.op.mean(y, [-1], keepdims=True)
        d = relax.op.subtract(y, mean)
        y = d / relax.op.sqrt(relax.op.mean(d * d, [-1], keepdims=True)
                              + relax.const(1e-5, "float32"))
    before = pk.from_expr(y)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count("layernorm.collapse") == 3 and len(layer_norms(after)) == 3
    pk.assert_same_numerics(before, after, rtol=F32.rtol, atol=F32.atol)


# -- layernorm.expand ---------------------------------------------------------------------------
@I.ir_module
class Fused16:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float16"), gamma: R.Tensor((16,), "float16"),
             beta: R.Tensor((16,), "float16")) -> R.Tensor(("n", "s", 16), "float16"):
        with R.dataflow():
            out = R.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=1e-5)
            R.output(out)
        return out


@I.ir_module
class Expanded16:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float16"), gamma: R.Tensor((16,), "float16"),
             beta: R.Tensor((16,), "float16")) -> R.Tensor(("n", "s", 16), "float16"):
        with R.dataflow():
            h = R.astype(x, "float32")
            mean = R.mean(h, axis=[-1], keepdims=True)
            d = R.subtract(h, mean)
            var = R.mean(R.multiply(d, d), axis=[-1], keepdims=True)
            y = R.divide(d, R.sqrt(R.add(var, R.const(1e-5, "float32"))))
            scaled = R.multiply(y, R.astype(gamma, "float32"))
            shifted = R.add(scaled, R.astype(beta, "float32"))
            out = R.astype(shifted, "float16")
            R.output(out)
        return out


#: The fused float16 op also computes in float32 and rounds once at the end; the
#: expansion does the same operations in another order, so results differ only where a
#: float32 difference of a few ulp crosses a float16 rounding boundary: 1 float16 ulp.
EXPAND_F16 = Tolerance(1e-3, 2e-3, "both compute in float32 and round to float16 once: a "
                                   "float32 reordering moves at most one float16 ulp")

EXPAND_CASE = RuleCase(
    LayerNormExpand(), Fused16, Expanded16,
    negatives=[
        Negative("x_of_unknown_rank", LayerNormExpand().example(known_rank=False),
                 "x has an unknown rank"),
        Negative("float64_x", LayerNormExpand().example(dtype="float64"),
                 "x has dtype float64: layernorm.expand writes out float32 and float16 "
                 "norms only"),
    ],
    tolerance=EXPAND_F16)


def test_layernorm_expand_meets_the_rule_contract():
    check_rule(EXPAND_CASE)


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rank, axes", [(3, 1), (2, 1), (4, 2)])
def test_expanded_norms_keep_the_numbers(rank, axes, dtype, symbolic):
    rule = LayerNormExpand()
    before = rule.example(dtype=dtype, rank=rank, axes=axes, symbolic=symbolic)
    applied = apply_rule(rule, before)
    assert applied.fired == 1 and not layer_norms(applied.module)
    tol = F32 if dtype == "float32" else EXPAND_F16
    pk.assert_same_numerics(before, applied.module, rtol=tol.rtol, atol=tol.atol,
                            shape_vars=SHAPE_VARS)


def test_an_expanded_norm_can_be_differentiated_and_collapses_back():
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    g, b = (relax.Var(n, relax.TensorType((16,), "float32")) for n in ("gamma", "beta"))
    fused = pk.from_expr(relax.op.sum(relax.op.nn.layer_norm(x, g, b, axes=[-1])))
    with pytest.raises(Exception, match="FPrimalGradient has not been registered"):
        relax.transform.Gradient("main")(fused)
    expanded = pk.rewrite(EXPANSIONS, fused)
    relax.transform.Gradient("main")(expanded)  # every op of the expansion has a gradient
    collapsed, log = collapse(expanded)
    assert log.count("layernorm.collapse") == 1 and len(layer_norms(collapsed)) == 1
    pk.assert_same_numerics(fused, collapsed, rtol=F32.rtol, atol=F32.atol)


# -- composites ---------------------------------------------------------------------------------
@I.ir_module
class ResidualNorm:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), r: R.Tensor(("n", "s", 16), "float32"),
             gamma: R.Tensor((16,), "float32"), beta: R.Tensor((16,), "float32"),
             ) -> R.Tensor(("n", "s", 16), "float32"):
        with R.dataflow():
            h = R.add(x, r)
            out = R.nn.layer_norm(h, gamma, beta, axes=[-1], epsilon=1e-5)
            R.output(out)
        return out


@I.ir_module
class ResidualNormComposite:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), r: R.Tensor(("n", "s", 16), "float32"),
             gamma: R.Tensor((16,), "float32"), beta: R.Tensor((16,), "float32"),
             ) -> R.Tensor(("n", "s", 16), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            @R.function
            def composite(x1: R.Tensor((n, s, 16), "float32"),
                          r1: R.Tensor((n, s, 16), "float32"),
                          gamma1: R.Tensor((16,), "float32"), beta1: R.Tensor((16,), "float32"),
                          ) -> R.Tensor((n, s, 16), "float32"):
                R.func_attr({"Composite": "byoc.add_layer_norm",
                             "PartitionedFromPattern": "add_nn.layer_norm_"})
                with R.dataflow():
                    h = R.add(x1, r1)
                    out1 = R.nn.layer_norm(h, gamma1, beta1, axes=[-1], epsilon=1e-5)
                    R.output(out1)
                return out1

            out = composite(x, r, gamma, beta)
            R.output(out)
        return out


@I.ir_module
class Norm:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), gamma: R.Tensor((16,), "float32"),
             beta: R.Tensor((16,), "float32")) -> R.Tensor(("n", "s", 16), "float32"):
        with R.dataflow():
            out = R.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=1e-5)
            R.output(out)
        return out


@I.ir_module
class NormComposite:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), gamma: R.Tensor((16,), "float32"),
             beta: R.Tensor((16,), "float32")) -> R.Tensor(("n", "s", 16), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            @R.function
            def composite(x1: R.Tensor((n, s, 16), "float32"),
                          gamma1: R.Tensor((16,), "float32"), beta1: R.Tensor((16,), "float32"),
                          ) -> R.Tensor((n, s, 16), "float32"):
                R.func_attr({"Composite": "byoc.layer_norm",
                             "PartitionedFromPattern": "nn.layer_norm_"})
                with R.dataflow():
                    out1 = R.nn.layer_norm(x1, gamma1, beta1, axes=[-1], epsilon=1e-5)
                    R.output(out1)
                return out1

            out = composite(x, gamma, beta)
            R.output(out)
        return out


def _norm(data, *, axes=(-1,), center=True, scale=True) -> tvm.IRModule:
    """``layer_norm(data, gamma, beta)`` with (16,)-shaped parameters (``(5, 16)`` for two axes)."""
    features = (5, 16) if len(axes) == 2 else (16,)
    g, b = (relax.Var(n, relax.TensorType(features, "float32")) for n in ("gamma", "beta"))
    return pk.from_expr(relax.op.nn.layer_norm(data, g, b, axes=list(axes), center=center,
                                               scale=scale))


def _var(name, shape):
    return relax.Var(name, relax.TensorType(shape, "float32"))


X, RES, BIAS = _var("x", (2, 5, 16)), _var("r", (2, 5, 16)), _var("bias", (16,))

#: Refusals both composites give (the norm's own conditions), checked for each.
NORM_REFUSED = [
    ("scale_off", lambda data: _norm(data, scale=False), "has center or scale off"),
    ("two_axes", lambda data: _norm(data, axes=(-2, -1)),
     "the layer_norm normalises axes [-2, -1] of a rank-3 tensor: the backends' kernels "
     "take the last axis only"),
]

SKIP_CASE = RuleCase(
    LayerNormComposite(skip=True), ResidualNorm, ResidualNormComposite,
    negatives=[
        *(Negative(name, make(X + RES), reason) for name, make, reason in NORM_REFUSED),
        Negative("bias_add_not_a_residual", _norm(X + BIAS),
                 "the add broadcasts its residual of shape (16,) to (2, 5, 16): a skip "
                 "connection adds two tensors of one shape"),
        Negative("no_add", Norm, "no match: add(*, *) (depth 2) vs x"),
    ],
    tolerance=EXACT)

NORM_CASE = RuleCase(
    LayerNormComposite(), Norm, NormComposite,
    negatives=[Negative(name, make(X), reason) for name, make, reason in NORM_REFUSED],
    tolerance=EXACT)


def test_add_layer_norm_composite_meets_the_rule_contract():
    check_rule(SKIP_CASE)


def test_layer_norm_composite_meets_the_rule_contract():
    check_rule(NORM_CASE)


def test_composites_are_named_as_tvms_tables_name_them():
    assert LayerNormComposite("cutlass").rule_name == "cutlass.layer_norm"
    assert LayerNormComposite("cutlass", skip=True).rule_name == "cutlass.add_layer_norm"
    assert {"byoc.layer_norm", "byoc.add_layer_norm"} <= set(LIBRARY.names)


def test_a_pre_norm_residual_read_again_keeps_the_norm_composite_only():
    h = X + RES  # pre-norm transformers add the residual to the sum again
    g, b = (relax.Var(n, relax.TensorType((16,), "float32")) for n in ("gamma", "beta"))
    before = pk.from_expr(relax.Tuple([relax.op.nn.layer_norm(h, g, b, axes=[-1]), h]))
    after = merge_composite(before, [LayerNormComposite(skip=True), LayerNormComposite()])
    names = sorted(str(func.attrs["Composite"]) for _, func in composite_functions(after))
    assert names == ["byoc.layer_norm"]
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


@pytest.mark.models
@pytest.mark.parametrize("opset", [11, 14])
def test_an_onnx_export_below_opset_17_collapses_back_to_one_layer_norm(opset):
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    import io

    from tvm.relax.frontend.onnx import from_onnx

    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16).eval()
    torch.nn.init.uniform_(norm.weight)
    torch.nn.init.uniform_(norm.bias)
    buffer = io.BytesIO()
    torch.onnx.export(norm, (torch.randn(2, 5, 16),), buffer, opset_version=opset,
                      dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch", 1: "seq"}})
    model = onnx.load_from_string(buffer.getvalue())
    assert "LayerNormalization" not in {node.op_type for node in model.graph.node}
    before = from_onnx(model, keep_params_in_input=False)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count("layernorm.collapse") == 1
    ops = {pk.ir.op_name(b.value) for block in after["main"].body.blocks
           for b in block.bindings} - {None}
    assert ops == {"relax.nn.layer_norm"}
    pk.assert_same_numerics(before, after, rtol=F32.rtol, atol=F32.atol,
                            shape_vars={"batch": 2, "seq": 5})


@pytest.mark.models
@pytest.mark.parametrize("exporter", ["14", "dynamo"])
def test_a_float16_onnx_export_with_wider_statistics_collapses_to_one_layer_norm(exporter):
    """float16 in ONNX: the TorchScript exporter (opset 14) normalises a LayerNorm in
    float64 between casts, the dynamo exporter takes a variance over two axes in float32."""
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    from patternkit.models.onnx_models import export_to_onnx

    class TwoAxisNorm(torch.nn.Module):
        def forward(self, x):
            mean = x.mean((-2, -1), keepdim=True)
            var = x.var((-2, -1), keepdim=True, unbiased=False)
            return (x - mean) / torch.sqrt(var + 1e-5)

    torch.manual_seed(0)
    if exporter == "dynamo":
        module, axes = TwoAxisNorm().eval(), 2
    else:
        module, axes = torch.nn.LayerNorm(16).eval(), 1
        torch.nn.init.uniform_(module.weight, 0.5, 1.5)
        torch.nn.init.uniform_(module.bias, -0.5, 0.5)
    x = torch.randn(2, 5, 16)
    data = export_to_onnx(module.half(), (x.half(),), ["x"],
                          opset=None if exporter == "dynamo" else int(exporter),
                          exporter="dynamo" if exporter == "dynamo" else "torchscript",
                          dynamic_axes={"x": {}}, output_names=["y"], text="norm")
    before = from_onnx(onnx.load_from_string(data))
    assert "astype" in before.script()  # the statistics run wider than x
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count("layernorm.collapse") == 1
    (norm,) = layer_norms(after)
    assert [int(a) for a in norm.attrs.axes] == list(range(-axes, 0))
    assert "astype" not in after.script()
    pk.assert_same_numerics(before, after, rtol=F16.rtol, atol=F16.atol)


def _run(mod, model):
    """``mod``'s entry function on the zoo model's inputs (and kept weights), as numpy."""
    vm = build_for_checks(mod)
    out = vm[model.entry](*(tvm.runtime.tensor(np.array(a)) for a in model.arguments()))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


@pytest.mark.models
@pytest.mark.parametrize("name", ["onnx:gpt2", "onnx:bert"])
def test_every_layer_norm_of_an_opset_14_zoo_model_collapses_with_the_output_kept(name, zoo):
    model = zoo(name, opset=14)  # opset 14 writes LayerNorm out
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, model.mod, log=log)
    count = model.families["layernorm"]
    assert count and log.count("layernorm.collapse") == count
    fused = [pk.ir.op_name(b.value) for block in after[model.entry].body.blocks
             for b in block.bindings].count("relax.nn.layer_norm")
    assert fused == count
    # float32 model output: within 1e-4 of the unrewritten module and of onnx's evaluator.
    got = _run(after, model)
    np.testing.assert_allclose(got, _run(model.mod, model), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, model.reference()[0], rtol=0, atol=1e-4)


class _HandWrittenNorm:
    """Builds the torch module of a layer norm written by hand (``form``: the variance as
    ``x.var(unbiased=False)`` or as ``(x - x.mean()).pow(2).mean()``)."""

    @staticmethod
    def make(torch, form):
        class HandWrittenNorm(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.rand(16) + 0.5)
                self.b = torch.nn.Parameter(torch.rand(16) - 0.5)

            def forward(self, x):
                if form == "var":
                    v = x.var(-1, keepdim=True, unbiased=False)
                else:
                    v = (x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True)
                return (x - x.mean(-1, keepdim=True)) / torch.sqrt(v + 1e-5) * self.w + self.b

        return HandWrittenNorm().eval()


@pytest.mark.models
@pytest.mark.parametrize("exporter", ["14", "17", "dynamo"])
@pytest.mark.parametrize("form", ["var", "pow"])
def test_a_hand_written_norm_exported_by_either_onnx_exporter_collapses(form, exporter):
    """The TorchScript exporter computes mean(x) twice; the dynamo exporter spells one
    axis 2 and the other -1 and takes the variance with keepdims=False plus a reshape."""
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    import contextlib
    import io
    import warnings

    from onnx.reference import ReferenceEvaluator
    from tvm.relax.frontend.onnx import from_onnx

    torch.manual_seed(0)
    module = _HandWrittenNorm.make(torch, form)
    x = torch.randn(2, 5, 16)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            model = torch.onnx.export(module, (x,), dynamo=True, input_names=["x"]).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(module, (x,), buffer, opset_version=int(exporter), dynamo=False,
                              input_names=["x"])
            model = onnx.load_from_string(buffer.getvalue())
    before = from_onnx(model, shape_dict={"x": [2, 5, 16]})
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count("layernorm.collapse") == 1
    assert len(layer_norms(after)) == 1
    pk.assert_same_numerics(before, after, rtol=F32.rtol, atol=F32.atol)
    vm = build_for_checks(after)
    got = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, expected, rtol=F32.rtol, atol=F32.atol)
