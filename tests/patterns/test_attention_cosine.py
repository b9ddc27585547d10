"""attention.cosine: Swin v2's cosine attention (normalised q and k, a learned per-head
scale, a position bias) collapses into R.nn.attention with a bias, the scale folded into q.

The contract case is the torch importer's form (read off ``zoo:swinv2``) with symbolic
batch, written out below; the float16 case is the same module in float16; the refusals
come from the family's builder (``patternkit.patterns.attention.cosine_examples``); and
transformers' own ``Swinv2SelfAttention``, exported with torch.export, collapses with its
numbers kept.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm

import patternkit as pk
from patternkit.patterns import LIBRARY
from patternkit.patterns.attention.cosine import FLOAT16, FLOAT32, AttentionCosine
from patternkit.testing import Negative, RuleCase, check_rule
from patternkit.verification import numeric

RULE = "attention.cosine"

#: Swin v2's window attention after the torch importer (2 heads of 4, 4 tokens a window),
#: the logit scale and the position table as parameters; ``{dt}`` is the dtype.
BEFORE = """
@I.ir_module
class Module:
    @R.function
    def main(xq: R.Tensor(("batch", 4, 8), "{dt}"), xk: R.Tensor(("batch", 4, 8), "{dt}"),
             xv: R.Tensor(("batch", 4, 8), "{dt}"), logit_scale: R.Tensor((2, 1, 1), "{dt}"),
             table: R.Tensor((2, 4, 4), "{dt}"), mask: R.Tensor(("batch", 1, 4, 4), "{dt}"),
             ) -> R.Tensor(("batch", 4, 8), "{dt}"):
        batch = T.int64()
        with R.dataflow():
            q0 = R.reshape(xq, R.shape([batch, 4, 2, 4]))
            q = R.permute_dims(q0, axes=[0, 2, 1, 3])
            k0 = R.reshape(xk, R.shape([batch, 4, 2, 4]))
            k = R.permute_dims(k0, axes=[0, 2, 1, 3])
            v0 = R.reshape(xv, R.shape([batch, 4, 2, 4]))
            v = R.permute_dims(v0, axes=[0, 2, 1, 3])
            q_abs = R.abs(q)
            q_sq = R.power(q_abs, R.const(2.0, "{dt}"))
            q_sum = R.sum(q_sq, axis=[-1], keepdims=True)
            q_norm = R.power(q_sum, R.const(0.5, "{dt}"))
            q_clip = R.clip(q_norm, R.prim_value(T.float64(1e-12)), R.prim_value(T.float64("inf")))
            q_den = R.broadcast_to(q_clip, R.shape([batch, 2, 4, 4]))
            q_n = R.divide(q, q_den)
            k_abs = R.abs(k)
            k_sq = R.power(k_abs, R.const(2.0, "{dt}"))
            k_sum = R.sum(k_sq, axis=[-1], keepdims=True)
            k_norm = R.power(k_sum, R.const(0.5, "{dt}"))
            k_clip = R.clip(k_norm, R.prim_value(T.float64(1e-12)), R.prim_value(T.float64("inf")))
            k_den = R.broadcast_to(k_clip, R.shape([batch, 2, 4, 4]))
            k_n = R.divide(k, k_den)
            k_t = R.permute_dims(k_n, axes=[0, 1, 3, 2])
            q_b = R.broadcast_to(q_n, R.shape([batch, 2, 4, 4]))
            q_3 = R.reshape(q_b, R.shape([batch * 2, 4, 4]))
            k_b = R.broadcast_to(k_t, R.shape([batch, 2, 4, 4]))
            k_3 = R.reshape(k_b, R.shape([batch * 2, 4, 4]))
            s_3 = R.matmul(q_3, k_3, out_dtype="{dt}")
            s = R.reshape(s_3, R.shape([batch, 2, 4, 4]))
            clamped = R.clip(logit_scale, R.prim_value(T.float64("-inf")),
                             R.prim_value(T.float64(4.6051701859880918)))
            factor = R.exp(clamped)
            scaled = R.multiply(s, factor)
            sig = R.sigmoid(table)
            pos = R.multiply(sig, R.const(16.0, "{dt}"))
            pos4 = R.expand_dims(pos, axis=[0])
            biased = R.add(scaled, pos4)
            masked = R.add(biased, mask)
            p = R.nn.softmax(masked, axis=-1)
            p_b = R.broadcast_to(p, R.shape([batch, 2, 4, 4]))
            p_3 = R.reshape(p_b, R.shape([batch * 2, 4, 4]))
            v_b = R.broadcast_to(v, R.shape([batch, 2, 4, 4]))
            v_3 = R.reshape(v_b, R.shape([batch * 2, 4, 4]))
            o_3 = R.matmul(p_3, v_3, out_dtype="{dt}")
            o = R.reshape(o_3, R.shape([batch, 2, 4, 4]))
            o_t = R.permute_dims(o, axes=[0, 2, 1, 3])
            out = R.reshape(o_t, R.shape([batch, 4, 8]))
            R.output(out)
        return out
"""

#: What the rule makes of it: the normalised q times the per-head scale (permuted to
#: BSNH, (1, 1, N, 1)), the normalised k, v as split, the position bias plus the mask.
EXPECTED = """
@I.ir_module
class Module:
    @R.function
    def main(xq: R.Tensor(("batch", 4, 8), "{dt}"), xk: R.Tensor(("batch", 4, 8), "{dt}"),
             xv: R.Tensor(("batch", 4, 8), "{dt}"), logit_scale: R.Tensor((2, 1, 1), "{dt}"),
             table: R.Tensor((2, 4, 4), "{dt}"), mask: R.Tensor(("batch", 1, 4, 4), "{dt}"),
             ) -> R.Tensor(("batch", 4, 8), "{dt}"):
        batch = T.int64()
        with R.dataflow():
            q0 = R.reshape(xq, R.shape([batch, 4, 2, 4]))
            q = R.permute_dims(q0, axes=[0, 2, 1, 3])
            k0 = R.reshape(xk, R.shape([batch, 4, 2, 4]))
            k = R.permute_dims(k0, axes=[0, 2, 1, 3])
            v0 = R.reshape(xv, R.shape([batch, 4, 2, 4]))
            q_abs = R.abs(q)
            q_sq = R.power(q_abs, R.const(2.0, "{dt}"))
            q_sum = R.sum(q_sq, axis=[-1], keepdims=True)
            q_norm = R.power(q_sum, R.const(0.5, "{dt}"))
            q_clip = R.clip(q_norm, R.prim_value(T.float64(1e-12)), R.prim_value(T.float64("inf")))
            q_den = R.broadcast_to(q_clip, R.shape([batch, 2, 4, 4]))
            q_n = R.divide(q, q_den)
            k_abs = R.abs(k)
            k_sq = R.power(k_abs, R.const(2.0, "{dt}"))
            k_sum = R.sum(k_sq, axis=[-1], keepdims=True)
            k_norm = R.power(k_sum, R.const(0.5, "{dt}"))
            k_clip = R.clip(k_norm, R.prim_value(T.float64(1e-12)), R.prim_value(T.float64("inf")))
            k_den = R.broadcast_to(k_clip, R.shape([batch, 2, 4, 4]))
            k_n = R.divide(k, k_den)
            clamped = R.clip(logit_scale, R.prim_value(T.float64("-inf")),
                             R.prim_value(T.float64(4.6051701859880918)))
            factor = R.exp(clamped)
            sig = R.sigmoid(table)
            pos = R.multiply(sig, R.const(16.0, "{dt}"))
            pos4 = R.expand_dims(pos, axis=[0])
            q_bsnh = R.permute_dims(q_n, axes=[0, 2, 1, 3])
            factor4 = R.expand_dims(factor, axis=[0])
            factor_bsnh = R.permute_dims(factor4, axes=[0, 2, 1, 3])
            q_scaled = R.multiply(q_bsnh, factor_bsnh)
            k_bsnh = R.permute_dims(k_n, axes=[0, 2, 1, 3])
            bias = R.add(pos4, mask)
            o_t = R.nn.attention(q_scaled, k_bsnh, v0, bias, scale=1.0)
            {cast}out = R.reshape(o_t, R.shape([batch, 4, 8]))
            R.output(out)
        return out
"""


def _module(text: str, dtype: str) -> tvm.IRModule:
    cast = "" if dtype == "float32" else f'o_t = R.astype(o_t, "{dtype}")\n            '
    return tvm.script.from_source(text.replace("{dt}", dtype).replace("{cast}", cast))


#: Each refusal of the rule (a builder form of cosine_examples.REFUSALS) and its reason.
REFUSED = {
    "scale_varying_along_the_queries": "the scores' scale has shape (2, 16, 1), not one "
                                       "number per head",
    "normalised_over_the_sequence": "the query is divided by its norm over axes [2] "
                                    "(keepdims=True), not over its head axis (3)",
    "softmax_over_the_queries": "the softmax normalises axis 2 of the scores, attention the "
                                "key axis (-1)",
    "float16_scores_accumulated_in_float32": "the dtype of the value is float32, the "
                                             "query's float16: R.nn.attention computes in "
                                             "one dtype",
    "scores_of_unknown_shape": "the scores: no known shape, so its batch, heads, "
                               "sequence and key axes cannot be told apart",
    "scores_viewed_across_windows": "the scores (4, 2, 16, 16) are viewed as (4, 2, 1, 16, "
                                    "16), not split into windows (B/W, W, 2, 16, 16)",
    "window_mask_of_rank_6": "the window mask (1, 1, 2, 1, 16, 16) does not add to the "
                             "windowed scores (2, 2, 2, 16, 16) as a term of their shape",
    "norm_clamped_by_another_primfunc": "the query's norm is clamped by a call_tir of "
                                        "'fused_maximum_add', not of a PrimFunc emit_te "
                                        "names after TOPI's maximum",
    "float16_scores_accumulated_in_bfloat16": "the scores of float16 operands accumulate in "
                                              "bfloat16 and are cast to float16",
    "bfloat16_attention": "cosine attention in bfloat16: scores up to the scale (<= 100) "
                          "are rounded at other points",
    # no normalisation, no match: explain names the query's matmul operand
    "query_not_normalised": "no match",
}


def _negatives() -> list[Negative]:
    rule = AttentionCosine()
    return [Negative(name, rule.example(name), reason) for name, reason in REFUSED.items()]


COSINE_CASE = RuleCase(AttentionCosine(), _module(BEFORE, "float32"),
                       _module(EXPECTED, "float32"), negatives=_negatives(), tolerance=FLOAT32)
COSINE_FLOAT16_CASE = RuleCase(AttentionCosine(), _module(BEFORE, "float16"),
                               _module(EXPECTED, "float16"), tolerance=FLOAT16,
                               negatives=[n for n in _negatives() if "float16" in n.name])


def test_float16_cosine_attention_meets_the_rule_contract():
    check_rule(COSINE_FLOAT16_CASE)


def test_each_refusal_builder_has_its_reason_asserted():
    from patternkit.patterns.attention.cosine_examples import REFUSALS

    assert set(REFUSED) == set(REFUSALS)


def test_swinv2_window_attention_from_torch_export_collapses_with_its_numbers_kept():
    """transformers' Swinv2SelfAttention, as users bring it, in a plain and a shifted
    block (its window mask added through a 5-D view of the scores): the library rewrites
    both cosine attentions into R.nn.attention (before this rule: none, and
    attention.collapse skipped them, the query read outside its match), and the result
    agrees with torch on llvm.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.swinv2.modeling_swinv2 import Swinv2SelfAttention

    from patternkit.models.importing import from_torch

    class WindowAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            config = transformers.Swinv2Config(embed_dim=16, num_heads=[2], window_size=4)
            self.attention = Swinv2SelfAttention(config, dim=16, num_heads=2, window_size=4)

        def forward(self, windows, shift_mask):
            plain = self.attention(windows)[0]
            return self.attention(plain, shift_mask)[0]

    torch.manual_seed(0)
    module = WindowAttention().eval()
    windows = torch.randn(4, 16, 16)
    # 2 windows per image, some pairs of tokens masked as a shifted window masks them
    shift_mask = torch.where(torch.rand(2, 16, 16) > 0.7, -100.0, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.export(module, (windows, shift_mask))
    before, _, _ = from_torch(program, False, "main", "WindowAttention", {})
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count(RULE) == 2 and log.count("attention.collapse") == 0
    assert after.script().count("R.nn.attention") == 2
    assert "R.nn.softmax" not in after.script()
    # one build: the rewritten module against torch itself (the import is the contract's)
    fused = numeric.run(after, [windows.numpy(), shift_mask.numpy()], "main")[0]
    with torch.no_grad():
        reference = module(windows, shift_mask).numpy()
    np.testing.assert_allclose(fused, reference, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


@pytest.mark.models
def test_cosine_attention_through_the_torchscript_onnx_exporter_collapses_with_its_numbers_kept():
    """The spelling matrix's Swin v2 block (F.normalize, the clamped per-head logit scale,
    a position bias) exported by the TorchScript exporter at opset 14 (its norm a
    ReduceL2, its clamp a one-sided Clip that from_onnx writes as a call_tir of TOPI's
    maximum with a NaN-guarded bound): both cosine attentions collapse (before: none,
    attention.collapse stopped at the normalised query), the result agrees with the import
    and with torch on llvm.
    """
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    from patternkit.models.importing import from_onnx_model
    from patternkit.models.onnx_models import export_to_onnx
    from patternkit.models.spelling_sources import find_spelling, spelling_model

    model = spelling_model(find_spelling("attention/cosine (Swin v2)"))
    x = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(0))
    data = export_to_onnx(model, (x,), ["x"], opset=14, text="cosine")
    before, _ = from_onnx_model(onnx.load_from_string(data), False, "main", "cosine", {})
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count(RULE) == 2
    assert after.script().count("R.nn.attention") == 2
    assert "R.nn.softmax" not in after.script()
    fused = numeric.run(after, [x.numpy()], "main")[0]
    np.testing.assert_allclose(fused, numeric.run(before, [x.numpy()], "main")[0],
                               rtol=FLOAT32.rtol, atol=FLOAT32.atol)
    with torch.no_grad():
        np.testing.assert_allclose(fused, model(x).numpy(), rtol=1e-4, atol=1e-4)


def test_a_float16_block_as_the_torch_import_writes_it_collapses_within_the_float16_tolerance():
    """A float16 model imported by torch.export computes its batched matmuls in float32
    and casts them back (patternkit's low-precision converters): before, the rule did not
    match them; now both matmuls are read as float16 ones and the result stays within
    FLOAT16 of the module as imported, at the clamp of the scale (100).
    """
    import math

    from patternkit.patterns.attention.cosine_examples import cosine_block

    before = cosine_block("float16", accumulate="float32", logit=math.log(100.0))
    log = pk.RewriteLog()
    after = pk.rewrite([AttentionCosine()], before, log=log)
    assert log.count(RULE) == 1 and "R.nn.softmax" not in after.script()
    pk.assert_same_numerics(before, after, rtol=FLOAT16.rtol, atol=FLOAT16.atol)
