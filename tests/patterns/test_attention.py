"""attention: softmax(q @ k^T * scale [+ mask]) @ v, as the torch and ONNX importers write it,
collapses into R.nn.attention on BSNH tensors; grouped-query repeats are kept.

The modules come from the family's own builders (one per model form, one per refusal:
``patternkit.patterns.attention.examples``); the tests walk the forms' example space
instead of listing knob combinations again."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from test_attention_causal_mask import CAUSAL_CASE  # the cases live with their tests
from test_attention_cosine import COSINE_CASE
from test_attention_einsum import EINSUM_CASE
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.attention.collapse import AttentionCollapse
from patternkit.patterns.attention.composite import AttentionComposite
from patternkit.patterns.attention.examples import (
    FORMS,
    REFUSALS,
    SPACE,
    multi_query,
    sdpa,
    torch_eager,
)
from patternkit.patterns.attention.expand import AttentionExpand
from patternkit.patterns.attention.plan import FLOAT16, FLOAT32
from patternkit.testing import EXACT, Negative, RuleCase, apply_rule, check_rule
from patternkit.testing.contract import prove_reasons, prove_round_trip, prove_structure
from patternkit.training import check_gradients, gradient, ops_without_gradient, with_loss
from patternkit.verification import numeric

RULE = "attention.collapse"
SHAPE_VARS = {"batch": 2, "seq": 8}
TOLERANCE = {"float32": FLOAT32, "float16": FLOAT16}
FUSED_OPS = ("relax.nn.attention", "relax.nn.attention_bias")


@I.ir_module
class TorchAttention:
    """GPT-2's eager attention after the torch importer, batch and sequence symbolic."""

    @R.function
    def main(xq: R.Tensor(("batch", "seq", 32), "float32"),
             xk: R.Tensor(("batch", "seq", 32), "float32"),
             xv: R.Tensor(("batch", "seq", 32), "float32"),
             mask: R.Tensor(("batch", 1, "seq", "seq"), "float32"),
             ) -> R.Tensor(("batch", "seq", 32), "float32"):
        batch, seq = T.int64(), T.int64()
        with R.dataflow():
            q = R.reshape(xq, R.shape([batch, seq, 2, 16]))
            k = R.reshape(xk, R.shape([batch, seq, 2, 16]))
            v = R.reshape(xv, R.shape([batch, seq, 2, 16]))
            q_heads = R.permute_dims(q, axes=[0, 2, 1, 3])
            k_heads = R.permute_dims(k, axes=[0, 2, 1, 3])
            k_t = R.permute_dims(k_heads, axes=[0, 1, 3, 2])
            v_heads = R.permute_dims(v, axes=[0, 2, 1, 3])
            q_b = R.broadcast_to(q_heads, R.shape([batch, 2, seq, 16]))
            q_3 = R.reshape(q_b, R.shape([batch * 2, seq, 16]))
            k_b = R.broadcast_to(k_t, R.shape([batch, 2, 16, seq]))
            k_3 = R.reshape(k_b, R.shape([batch * 2, 16, seq]))
            s_3 = R.matmul(q_3, k_3, out_dtype="float32")
            s = R.reshape(s_3, R.shape([batch, 2, seq, seq]))
            scaled = R.multiply(s, R.const(0.25, "float32"))
            masked = R.add(scaled, mask)
            p = R.nn.softmax(masked, axis=-1)
            p_b = R.broadcast_to(p, R.shape([batch, 2, seq, seq]))
            p_3 = R.reshape(p_b, R.shape([batch * 2, seq, seq]))
            v_b = R.broadcast_to(v_heads, R.shape([batch, 2, seq, 16]))
            v_3 = R.reshape(v_b, R.shape([batch * 2, seq, 16]))
            o_3 = R.matmul(p_3, v_3, out_dtype="float32")
            o = R.reshape(o_3, R.shape([batch, 2, seq, 16]))
            o_t = R.permute_dims(o, axes=[0, 2, 1, 3])
            out = R.reshape(o_t, R.shape([batch, seq, 32]))
            R.output(out)
        return out


@I.ir_module
class TorchAttentionCollapsed:
    @R.function
    def main(xq: R.Tensor(("batch", "seq", 32), "float32"),
             xk: R.Tensor(("batch", "seq", 32), "float32"),
             xv: R.Tensor(("batch", "seq", 32), "float32"),
             mask: R.Tensor(("batch", 1, "seq", "seq"), "float32"),
             ) -> R.Tensor(("batch", "seq", 32), "float32"):
        batch, seq = T.int64(), T.int64()
        with R.dataflow():
            q = R.reshape(xq, R.shape([batch, seq, 2, 16]))
            k = R.reshape(xk, R.shape([batch, seq, 2, 16]))
            v = R.reshape(xv, R.shape([batch, seq, 2, 16]))
            o_t = R.nn.attention(q, k, v, mask, scale=0.25)
            out = R.reshape(o_t, R.shape([batch, seq, 32]))
            R.output(out)
        return out


def _onnx_form(q_ty=None, also_return_probabilities: bool = False,
               permute_back: bool = True) -> tvm.IRModule:
    """The ONNX importer's attention on BNSH q, BSNH k and BNSH v, built expression-wise."""
    q = relax.Var("q", q_ty or relax.TensorType((2, 2, 8, 16), "float32"))
    k = relax.Var("k", relax.TensorType((2, 8, 2, 16), "float32"))
    v = relax.Var("v", relax.TensorType((2, 2, 8, 16), "float32"))
    scores = relax.op.matmul(q, relax.op.permute_dims(k, [0, 2, 3, 1]))
    p = relax.op.nn.softmax(scores * relax.const(0.25))
    out = relax.op.matmul(p, v)
    if permute_back:
        out = relax.op.permute_dims(out, [0, 2, 1, 3])
    return pk.from_expr(relax.Tuple([out, p]) if also_return_probabilities else out)


#: The reason each refusal builder of the family is refused with (one per builder).
REFUSED = {
    "scale_not_a_scalar": "the scores' scale is not a scalar constant (a constant of shape "
                          "(1, 2, 1, 1))",
    "softmax_over_the_query_axis": "the softmax normalises axis 2, attention the key axis (-1)",
    "mask_of_one_key": "does not broadcast as attention's bias: its last axis is 1, the key "
                       "length 8",
    "mask_broadcasting_the_query_rows": "the mask (2, 1, 8, 8) does not broadcast as "
                                        "attention's bias (2, 2, 1, 8)",
    "mask_of_rank_5": "the mask has shape (1, 2, 1, 1, 8): attention's bias has at most 4 axes",
    "k_not_transposed": "k is not transposed: the score matmul contracts axis 1 of the key",
    "v_from_a_different_head_split": "the matmul's right operand has shape (4, 8, 16), "
                                     "neither (2, 4, 8, 8)",
    "key_grouped_by_batch_and_heads": "the key (transposed) has batch 4 on axis 0 where the "
                                      "query has 2",
    "single_key_head_broadcast_after_a_reshape": "the key (2, 1, 16, 8) is broadcast to the "
                                                 "query's (2, 2) after a reshape",
    "scores_split_into_sequence_first": "the softmax's input has shape (2, 8, 2, 8), the "
                                        "scores (2, 2, 8, 8)",
    "result_split_into_sequence_first": "the attention's result has shape (2, 8, 2, 16), not "
                                        "(2, 2, 8, 16)",
    "float16_scores_accumulated_in_float32": "the scores are float32, the query float16",
    "masked_fill_with_a_finite_value": "the masked scores are filled with -10000.0, not -inf",
    "safe_softmax_over_the_query_axis": "the safe softmax zeroes the probabilities where "
                                        "max(axis=[2], keepdims=True) finds no score above "
                                        "-inf, not on the fully masked rows",
    "nan_guard_filling_one": "the probabilities' NaN guard fills 1, not 0",
    "scores_regrouped_into_sequence_first": "the scaled scores are reshaped to (2, 8, 2, 8), "
                                            "not a view of the scores (2, 2, 8, 8)",
    "second_term_of_one_key": "the second additive term (2, 1, 8, 1) does not broadcast as "
                              "attention's bias: its last axis is 1",
    "softmax_run_in_float64": "the softmax runs in float64 between casts of the float32 "
                              "scores (softmax(..., dtype=float64)): R.nn.attention keeps the "
                              "softmax in float32 only for float16 and bfloat16 scores",
    "merged_bias_over_the_queries": "the bias added to the merged scores (4, 8, 8) has shape "
                                    "(4, 8, 1), which does not broadcast as attention's bias",
    "bias_before_the_scale_over_the_queries": "the bias added to the scores before the scale "
                                              "(2, 2, 8, 1) does not broadcast as attention's "
                                              "bias: its last axis is 1, the key length 8",
    "merged_bias_of_unknown_shape": "the bias added to the merged scores has no known shape",
    "heads_folded_into_the_sequence": "the key is reshaped to (2, 16, 16) and permuted with "
                                      "axes [0, 2, 1], not merged from (2, 2, 8, 16) into "
                                      "batch * heads",
    "query_of_unknown_shape": "the query has no known shape",
    "mask_of_rank_4_on_merged_scores": "the mask added to the merged scores (4, 8, 8) has "
                                       "shape (1, 4, 8, 8): its heads would meet the "
                                       "scores' batch * heads axis",
    "merged_result_split_into_sequence_first": "the attention's result has shape (2, 8, 2, "
                                               "16), not (2, 2, 8, 16): the batched matmul's "
                                               "result is not split back",
    "scale_computed_per_head": "the query's scale is not a scalar constant (a constant "
                               "computed from constants of shape (1, 2, 1, 1))",
    "scale_computed_from_a_shape": "the query's scale is not a scalar constant (a tensor of "
                                   "shape (1))",
    "key_split_back_across_the_batch": "the key's 3-D transpose is reshaped to (1, 2, 16, 16), "
                                       "not split back into batch and heads (2, 2, 16, 8)",
    "float16_operands_cast_to_bfloat16": "the query is cast from float16 to bfloat16 before "
                                         "the score matmul: only float16 or bfloat16 widened "
                                         "to float32 keeps its values",
}

COLLAPSE_CASE = RuleCase(
    AttentionCollapse(), TorchAttention, TorchAttentionCollapsed,
    negatives=[Negative(name, REFUSALS[name](), reason) for name, reason in REFUSED.items()],
    tolerance=FLOAT32)


def test_every_refusal_builder_has_its_reason_asserted():
    assert set(REFUSED) == set(REFUSALS)


def attentions(mod: tvm.IRModule, func: str = "main") -> list:
    return [b.value for block in mod[func].body.blocks for b in block.bindings
            if pk.ir.op_name(b.value) in FUSED_OPS]


def op_names(mod: tvm.IRModule, func: str = "main") -> list:
    return [pk.ir.op_name(b.value) for block in mod[func].body.blocks for b in block.bindings]


def test_attention_collapse_meets_the_rule_contract():
    check_rule(COLLAPSE_CASE)


def test_attention_einsum_matmul_meets_the_rule_contract():
    check_rule(EINSUM_CASE)


def test_attention_cosine_meets_the_rule_contract():
    check_rule(COSINE_CASE)


def test_attention_causal_mask_meets_the_rule_contract_but_the_wide_draw():
    # opt-in (not in LIBRARY): TVM 0.27's llvm causal attention gives NaN on rows whose
    # kept scores are all below about -88, which the wide draw of the site proof makes
    # (test_attention_causal_mask.py shows it); the seeded draws must agree
    after = prove_structure(CAUSAL_CASE)
    prove_reasons(CAUSAL_CASE)
    prove_round_trip(CAUSAL_CASE, after)
    tol = CAUSAL_CASE.tolerance
    pk.assert_same_numerics(CAUSAL_CASE.before, after, rtol=tol.rtol, atol=tol.atol)


def _form_instances() -> list[tuple[str, str, dict]]:
    """Every model form of the example space, its default and each knob moved alone
    (``(form, dtype, knobs)``): float32 everywhere, float16 at each product's default."""
    found: dict[tuple, tuple[str, str, dict]] = {}
    for product in SPACE:
        form = product["form"][0]
        if form not in FORMS:
            continue
        knobs = {k: v for k, v in product.items() if k not in ("form", "dtype")}
        default = {k: values[0] for k, values in knobs.items()}
        points = [default] + [{**default, k: value} for k, values in knobs.items()
                              for value in values[1:]]
        for dtype, chosen in [("float16", default)] + [("float32", p) for p in points]:
            found.setdefault((form, dtype, *sorted(chosen.items(), key=str)),
                             (form, dtype, chosen))
    return list(found.values())


FORM_INSTANCES = _form_instances()


@pytest.mark.parametrize("form, dtype, knobs", FORM_INSTANCES,
                         ids=[f"{f}-{d}-" + "-".join(f"{k}={v}" for k, v in kn.items())
                              for f, d, kn in FORM_INSTANCES])
def test_every_form_collapses_into_one_attention_with_the_numbers_kept(form, dtype, knobs):
    before = FORMS[form](dtype=dtype, **knobs)
    applied = apply_rule(AttentionCollapse(), before)
    assert applied.fired == 1
    (fused,) = attentions(applied.module)
    assert not {"relax.nn.softmax", "relax.matmul"} & set(op_names(applied.module))
    assert float(fused.attrs.scale) == pytest.approx(0.25 if knobs.get("scale") != "none"
                                                     else 1.0, rel=1e-6)
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, applied.module, rtol=tol.rtol, atol=tol.atol,
                            shape_vars=SHAPE_VARS)


def test_a_grouped_query_collapse_keeps_the_key_value_repeat():
    # TVM 0.27's llvm attention computes wrongly with fewer key/value heads than query
    # heads: the repeat must stay, and the fused op must see the full head count.
    before = torch_eager(kv_heads=1)
    after = pk.rewrite(AttentionCollapse(), before)
    (fused,) = attentions(after)
    assert op_names(after).count("relax.broadcast_to") == 2  # repeat_kv of k and v
    for operand in fused.args[1:3]:
        assert int(operand.ty.shape[2]) == 2  # BSNH: both heads
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


@pytest.mark.parametrize("frontend", ["torch", "onnx"])
def test_a_multi_query_collapse_repeats_the_single_key_value_head(frontend):
    # The matmuls broadcast one key/value head to the query's two; the fused op must be
    # given both heads (TVM 0.27's llvm attention is wrong with fewer), so the rewrite
    # broadcasts k and v itself.
    before = multi_query(frontend=frontend)
    after = pk.rewrite(AttentionCollapse(), before)
    (fused,) = attentions(after)
    for operand in fused.args[1:3]:
        assert [int(d) for d in operand.ty.shape] == [2, 8, 2, 16]  # BSNH: both heads
        assert pk.ir.op_name(_bound_value(after, operand)) == "relax.broadcast_to"
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


def _bound_value(mod: tvm.IRModule, var: relax.Var) -> relax.Expr:
    return next(b.value for block in mod["main"].body.blocks for b in block.bindings
                if b.var.same_as(var))


def test_an_attention_whose_result_stays_head_first_collapses_with_one_permute():
    before = _onnx_form(permute_back=False)
    after = pk.rewrite(AttentionCollapse(), before)
    assert len(attentions(after)) == 1
    # q and v permuted to BSNH (the key is given BSNH), the result back to head-first
    assert op_names(after).count("relax.permute_dims") == 3
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


def _run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    vm = numeric.build(mod)
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_torch_sdpa_keeps_a_fully_masked_row_at_zero_where_attention_alone_gives_nan(dtype):
    # torch's SDPA gives a row with no allowed key probabilities 0 (its _safe_softmax);
    # R.nn.attention gives NaN there, so the collapse zeroes the rows the bias masks whole.
    before = sdpa(dtype=dtype, mask="boolean")
    after = pk.rewrite(AttentionCollapse(), before)
    assert len(attentions(after)) == 1
    rng = np.random.default_rng(0)
    xq, xk, xv = (rng.uniform(-1, 1, (2, 8, 32)).astype(dtype) for _ in range(3))
    allowed = np.ones((2, 1, 1, 8), bool)
    allowed[0] = False  # the first sequence is padding throughout
    allowed[1, ..., 5:] = False
    want, got = _run(before, xq, xk, xv, allowed), _run(after, xq, xk, xv, allowed)
    assert not np.isnan(want).any() and np.all(want[0] == 0)
    np.testing.assert_array_equal(got[0], want[0])
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got[1], want[1], rtol=tol.rtol, atol=tol.atol)
    plain = torch_eager(mask="boolean", dtype=dtype)  # softmax without SDPA's guard: NaN rows
    assert np.isnan(_run(pk.rewrite(AttentionCollapse(), plain), xq, xk, xv, allowed)[0]).all()


def test_a_float16_collapse_builds_with_a_bias_after_it_and_stays_float16():
    # TVM 0.27 legalises a float16 R.nn.attention to float32 (docs/tvm-bugs.md): without
    # the rule's cast, the bias add after it would not build
    before = torch_eager(dtype="float16")
    bias = relax.const(np.random.default_rng(1).uniform(-1, 1, 32).astype("float16"))
    func = before["main"]
    body = relax.SeqExpr(func.body.blocks, relax.op.add(func.body.body, bias))
    returns = relax.TensorType((2, 8, 32), "float16")
    before = tvm.IRModule({"main": relax.Function(func.params, body, returns)})
    before = relax.transform.Normalize()(before)
    after = pk.rewrite(AttentionCollapse(), before)
    assert len(attentions(after)) == 1
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, [int(d) for d in p.ty.shape]).astype("float16")
            for p in after["main"].params]
    got, want = _run(after, *args), _run(before, *args)
    assert got.dtype == "float16"
    np.testing.assert_allclose(got, want, rtol=FLOAT16.rtol, atol=FLOAT16.atol)


def test_torch_sdpa_without_a_mask_collapses_to_attention_alone():
    # no bias: with q and k finite no score is -inf, so no row needs the guard
    after = pk.rewrite(AttentionCollapse(), sdpa(mask="none"))
    assert attentions(after) and "relax.where" not in op_names(after)


def test_a_rank_2_mask_becomes_a_4_d_bias():
    after = pk.rewrite(AttentionCollapse(), torch_eager(mask="causal"))
    (fused,) = attentions(after)
    assert fused.args[3].ty.ndim == 4


def test_attention_whose_probabilities_are_read_elsewhere_is_left_alone():
    assert len(attentions(pk.rewrite(AttentionCollapse(), _onnx_form()))) == 1
    returned = _onnx_form(also_return_probabilities=True)  # the softmax is an output too
    log = pk.RewriteLog()
    after = pk.rewrite(AttentionCollapse(), returned, log=log)
    assert log.count(RULE) == 0 and not attentions(after)
    tvm.ir.assert_structural_equal(after, returned)


def test_the_library_collapses_the_softmax_and_then_the_attention():
    written = torch_eager()
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY.rewrite_rules(), written, log=log)
    assert log.count(RULE) == 1 and len(attentions(after)) == 1


# -- the expand rule: for training graphs -------------------------------------------------------
@I.ir_module
class Fused:
    @R.function
    def main(q: R.Tensor(("batch", "seq", 2, 16), "float32"),
             k: R.Tensor(("batch", "seq", 2, 16), "float32"),
             v: R.Tensor(("batch", "seq", 2, 16), "float32"),
             mask: R.Tensor(("batch", 1, 1, "seq"), "float32"),
             ) -> R.Tensor(("batch", "seq", 2, 16), "float32"):
        with R.dataflow():
            out = R.nn.attention(q, k, v, mask, scale=0.25)
            R.output(out)
        return out


@I.ir_module
class WrittenOut:
    @R.function
    def main(q: R.Tensor(("batch", "seq", 2, 16), "float32"),
             k: R.Tensor(("batch", "seq", 2, 16), "float32"),
             v: R.Tensor(("batch", "seq", 2, 16), "float32"),
             mask: R.Tensor(("batch", 1, 1, "seq"), "float32"),
             ) -> R.Tensor(("batch", "seq", 2, 16), "float32"):
        with R.dataflow():
            q_heads = R.permute_dims(q, axes=[0, 2, 1, 3])
            k_t = R.permute_dims(k, axes=[0, 2, 3, 1])
            scores = R.matmul(q_heads, k_t)
            scaled = R.multiply(scores, R.const(0.25, "float32"))
            masked = R.add(scaled, mask)
            p = R.nn.softmax(masked, axis=-1)
            v_heads = R.permute_dims(v, axes=[0, 2, 1, 3])
            o = R.matmul(p, v_heads)
            out = R.permute_dims(o, axes=[0, 2, 1, 3])
            R.output(out)
        return out


EXPAND_CASE = RuleCase(
    AttentionExpand(), Fused, WrittenOut,
    negatives=[
        Negative("window_without_causal_mask", AttentionExpand().example(window_size=3),
                 "window_size=3 without a causal mask"),
        Negative("unknown_causal_mask", AttentionExpand().example(causal_mask="Diagonal"),
                 "the attention has causal_mask=Diagonal: TVM 0.27 knows TopLeft and "
                 "BottomRight only"),
        Negative("causal_mask_of_unknown_dtype",
                 AttentionExpand().example(causal_mask="TopLeft", dtype=None),
                 "the attention's causal mask is built from the query and key lengths in the "
                 "query's dtype: the query is (2, 8, 2, 16) of None"),
        Negative("default_scale_of_a_symbolic_head_size",
                 AttentionExpand().example(shape="symbolic_head", scale=None),
                 "the attention's default scale 1/sqrt(H) needs a static head size"),
    ],
    tolerance=FLOAT32)


def test_attention_expand_meets_the_rule_contract():
    check_rule(EXPAND_CASE)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("knobs", [{}, {"bias": False}, {"scale": None}, {"shape": "symbolic"},
                                   {"shape": "cross", "bias": False}],
                         ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "bias")
def test_expanded_attention_computes_the_fused_numbers_and_collapses_back(knobs, dtype):
    fused = AttentionExpand().example(dtype=dtype, **knobs)
    expanded = pk.rewrite(EXPANSIONS, fused)
    assert not attentions(expanded)
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(fused, expanded, rtol=tol.rtol, atol=tol.atol,
                            shape_vars=SHAPE_VARS)
    back = pk.rewrite(LIBRARY.rewrite_rules(), expanded)
    (again,) = attentions(back)
    # The default scale comes back spelled out: the collapse always passes it.
    head = 16
    assert float(again.attrs.scale) == pytest.approx(knobs.get("scale", 0.25) or head ** -0.5)


def test_gradient_differentiates_attention_through_its_expansion():
    fused = with_loss(AttentionExpand().example(), reduce="sum")
    assert "relax.nn.attention_bias" in ops_without_gradient(fused["main_loss"])
    grads = gradient(fused, "main_loss")
    check = check_gradients(fused, grads, "main_loss")
    assert check.ok, check


# -- the composites ----------------------------------------------------------------------------
def _composite_script(bias: bool, composite: bool) -> tvm.IRModule:
    """R.nn.attention on (2, 8, 2, 16) BSNH tensors, as it is or as the composite makes it."""
    args = "q, k, v, mask" if bias else "q, k, v"
    mask_param = ', mask: R.Tensor((2, 1, 1, 8), "float32")' if bias else ""
    tensor = 'R.Tensor((2, 8, 2, 16), "float32")'
    params = f"q: {tensor}, k: {tensor}, v: {tensor}{mask_param}"
    name = "attention_bias" if bias else "attention"
    body = f"R.nn.attention({args}, scale=0.25)"
    if composite:
        inner = (f"            @R.function\n"
                 f"            def fused({params}) -> {tensor}:\n"
                 f'                R.func_attr({{"Composite": "byoc.{name}", '
                 f'"PartitionedFromPattern": "nn.{name}_"}})\n'
                 f"                with R.dataflow():\n"
                 f"                    out = {body}\n"
                 f"                    R.output(out)\n"
                 f"                return out\n\n"
                 f"            out = fused({args})\n")
    else:
        inner = f"            out = {body}\n"
    source = (f"@I.ir_module\nclass Module:\n    @R.function\n"
              f"    def main({params}) -> {tensor}:\n        with R.dataflow():\n"
              f"{inner}            R.output(out)\n        return out\n")
    return tvm.script.from_source(source)


def _composite_case(bias: bool) -> RuleCase:
    rule = AttentionComposite("byoc", bias=bias)
    return RuleCase(
        rule, _composite_script(bias, False), _composite_script(bias, True),
        negatives=[
            Negative("causal_mask", rule.example(causal_mask="TopLeft"),
                     "the attention has causal_mask=TopLeft"),
            Negative("the_other_form", _composite_script(not bias, False),
                     "nn.attention" if bias else "nn.attention_bias"),
        ],
        tolerance=EXACT)


ATTENTION_COMPOSITE_CASE = _composite_case(bias=False)
ATTENTION_BIAS_COMPOSITE_CASE = _composite_case(bias=True)


def test_the_attention_composite_meets_the_rule_contract():
    check_rule(ATTENTION_COMPOSITE_CASE)


def test_the_attention_bias_composite_meets_the_rule_contract():
    check_rule(ATTENTION_BIAS_COMPOSITE_CASE)


def test_the_composites_are_named_as_tvms_cutlass_table_names_them():
    names = {rule.rule_name for rule in LIBRARY.by_prefix("byoc.attention")}
    assert names == {"byoc.attention", "byoc.attention_bias"}


# -- the model zoo ---------------------------------------------------------------------------
ZOO_MODELS = [("gpt2", {}), ("bert", {}), ("vit", {}), ("llama", {}),
              ("bert", {"attention": "sdpa"}), ("vit", {"attention": "sdpa"}),
              ("llama", {"attention": "sdpa"}),
              ("gpt2", {"batch": "dynamic", "seq": "dynamic"}),
              ("onnx:gpt2", {"opset": 14}), ("onnx:gpt2", {"opset": 17}),
              ("onnx:bert", {"opset": 14}), ("onnx:bert", {"opset": 17}),
              # T5: a position bias and the mask, two additive terms, on unscaled scores
              ("t5", {}), ("t5", {"attention": "sdpa"}), ("onnx:t5", {"opset": 14}),
              # Falcon: multi-query, the importer broadcasts the one key/value head
              ("falcon", {}), ("falcon", {"attention": "sdpa"}),
              ("falcon", {"batch": "dynamic", "seq": "dynamic"}),
              # ALiBi added to the scores before the scale; the 40B layout's grouped heads
              ("falcon", {"alibi": True}), ("falcon", {"alibi": True, "attention": "sdpa"}),
              ("falcon", {"layout": "40b", "heads": 4, "kv_heads": 2}),
              ("falcon", {"layout": "40b", "heads": 4, "kv_heads": 2, "alibi": True,
                          "batch": "dynamic", "seq": "dynamic"})]


@pytest.mark.models
@pytest.mark.parametrize("name, options", ZOO_MODELS,
                         ids=[f"{n}{''.join(f'-{k}={v}' for k, v in o.items())}"
                              for n, o in ZOO_MODELS])
def test_every_attention_of_a_zoo_model_collapses_with_the_output_kept(name, options, zoo,
                                                                      zoo_vm):
    model = zoo(name, **options)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY.rewrite_rules(), model.mod, log=log)
    count = model.families["attention"]
    assert count and log.count(RULE) == count
    assert len(attentions(after, model.entry)) == count
    # float32 model output within 1e-4 of the unrewritten module (issue 11's bound).
    vm = numeric.build(after)
    out = vm[model.entry](*(tvm.runtime.tensor(np.array(a)) for a in model.arguments()))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    np.testing.assert_allclose(got, zoo_vm(model)(), rtol=0, atol=1e-4)


FLOAT16_ZOO = [("gpt2", {}), ("bert", {}), ("bert", {"attention": "sdpa"}),
               ("falcon", {"attention": "sdpa"}),
               ("falcon", {"layout": "40b", "heads": 4, "kv_heads": 2, "attention": "sdpa"}),
               ("falcon", {"alibi": True, "attention": "sdpa"}), ("vit", {"attention": "sdpa"}),
               ("llama", {"attention": "sdpa"})]
# Eager attention through transformers' shared eager_attention_forward (ViT, Llama, every
# Falcon layout) runs its softmax in float32 between casts: collapsed too, with the
# precision named in the log (below); Llama's (index 1) is run against torch above.
FLOAT32_SOFTMAX_ZOO = [("vit", {}), ("llama", {}), ("falcon", {}),
                       ("falcon", {"layout": "40b", "heads": 4, "kv_heads": 2}),
                       ("falcon", {"alibi": True})]


@pytest.mark.models
@pytest.mark.parametrize("name, options", FLOAT16_ZOO + FLOAT32_SOFTMAX_ZOO[1:2],
                         ids=[f"{n}{''.join(f'-{k}={v}' for k, v in o.items())}"
                              for n, o in FLOAT16_ZOO + FLOAT32_SOFTMAX_ZOO[1:2]])
def test_every_attention_of_a_float16_zoo_model_collapses_and_still_matches_torch(
        name, options, zoo):
    # The float16 import accumulates each batched matmul in float32 and casts it back
    # (patternkit.models.low_precision): a matmul in float16, which R.nn.attention
    # computes.  Tolerance: ten float16 ulps at the output's largest value, against torch
    # in float16 (llvm's attention accumulates in float16, torch in float32).
    model = zoo(name, dtype="float16", **options)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY.rewrite_rules(), model.mod, log=log)
    count = model.families["attention"]
    assert count and log.count(RULE) == count
    assert len(attentions(after, model.entry)) == count
    got = numeric.run(after, [np.array(a) for a in model.arguments()], model.entry)[0]
    reference = model.reference()[0]
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float64) - reference).max() <= 1e-2 * np.abs(reference).max()


@pytest.mark.models
@pytest.mark.parametrize("name, options", FLOAT32_SOFTMAX_ZOO,
                         ids=[f"{n}{''.join(f'-{k}={v}' for k, v in o.items())}"
                              for n, o in FLOAT32_SOFTMAX_ZOO])
def test_a_float16_eager_softmax_in_float32_collapses_with_its_precision_logged(
        name, options, zoo, caplog):
    # eager_attention_forward: softmax(scores, dtype=float32).to(float16); the numbers
    # are checked against torch on Llama above (one build: CI's budget)
    model = zoo(name, dtype="float16", **options)
    with caplog.at_level("INFO", logger="patternkit.patterns.attention.collapse"):
        log = pk.RewriteLog()
        pk.rewrite(LIBRARY.rewrite_rules(), model.mod, log=log)
    assert log.count(RULE) == model.families["attention"] > 0
    named = [r.getMessage() for r in caplog.records
             if "ran in float32 between casts of float16 scores" in r.getMessage()]
    assert len(named) == log.count(RULE)


@pytest.mark.models
def test_an_sdpa_bert_keeps_a_fully_padded_sequence_as_torch_computes_it(zoo, zoo_vm):
    # the guard on a real model: the first sequence is padding throughout, where
    # R.nn.attention alone would give NaN and torch's SDPA gives its zeroed rows
    model = zoo("bert", attention="sdpa")
    inputs = dict(model.inputs)
    inputs["attention_mask"] = np.array(inputs["attention_mask"])
    inputs["attention_mask"][0] = 0
    after = pk.rewrite(LIBRARY.rewrite_rules(), model.mod)
    assert len(attentions(after, model.entry)) == model.families["attention"]
    vm = numeric.build(after)
    out = vm[model.entry](*(tvm.runtime.tensor(np.array(a)) for a in model.arguments(inputs)))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, zoo_vm(model)(inputs), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, model.reference(inputs)[0], rtol=0, atol=1e-4)
