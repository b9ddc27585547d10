"""attention.causal_mask: a bias that is provably a causal triangle (a constant, a
registered ``tril`` buffer tested against 0, ``arange`` comparisons, ``full(-inf).triu(1)``)
becomes ``causal_mask="TopLeft"`` / ``"BottomRight"`` on ``R.nn.attention``; a band of
it ``window_size``.  Off-by-one triangles, misaligned bands and finite fills are refused
with what they are.

The rule is opt-in (not in LIBRARY): TVM 0.27's llvm causal attention gives NaN on a row
whose kept scores all lie below about -88, where the bias gives the softmax (shown below).
The rule's contract case lives here (run from test_attention.py, where the library's
meta-test looks for it); the end-to-end tests export small torch modules written as
hand-written GPTs and Hugging Face write their masks.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.engine import RuleSet
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.attention.causal_mask import AttentionCausalMask, masked_attention
from patternkit.patterns.attention.plan import FLOAT32
from patternkit.testing import Negative, RuleCase

RULE = "attention.causal_mask"
#: The library with the opt-in rule, as a user targeting a flash-attention kernel asks.
WITH_CAUSAL = LIBRARY | RuleSet([AttentionCausalMask()])


@I.ir_module
class CausalAttentionWithPadding:
    """:func:`masked_attention` (``arange`` spelling, a padding mask) with the triangle
    become the op's causal mask; the mask's computation is dead and goes."""

    @R.function
    def main(q: R.Tensor((2, 8, 2, 16), "float32"), k: R.Tensor((2, 8, 2, 16), "float32"),
             v: R.Tensor((2, 8, 2, 16), "float32"), mask: R.Tensor((2, 1, 1, 8), "float32"),
             ) -> R.Tensor((2, 8, 2, 16), "float32"):
        with R.dataflow():
            gv = R.nn.attention(q, k, v, mask, scale=0.25, causal_mask="TopLeft")
            R.output(gv)
        return gv


CAUSAL_CASE = RuleCase(
    AttentionCausalMask(), masked_attention(spelling="arange", padding=True),
    CausalAttentionWithPadding,
    negatives=[
        Negative("triangle_off_by_one", masked_attention(diagonal=1),
                 "the mask keeps [0, 1] of row 0: not a causal triangle (TopLeft keeps [0])"),
        Negative("triangle_missing_its_diagonal", masked_attention(spelling="arange",
                                                                   diagonal=-1),
                 "the mask keeps [] of row 0: not a causal triangle"),
        Negative("band_with_more_keys_than_queries", masked_attention(shape="cross", window=3),
                 "the mask keeps [2, 3, 4] of row 0: not a causal triangle"),
        Negative("finite_fill", masked_attention(fill=-1e4),
                 "the mask's masked entries include -10000.0, not -inf"),
    ],
    tolerance=FLOAT32)


@pytest.mark.parametrize("spelling", ["constant", "triu_fill", "arange", "buffer"])
@pytest.mark.parametrize("shape, causal", [("static", "TopLeft"), ("cross", "BottomRight")])
def test_every_spelling_of_the_triangle_becomes_the_causal_mask(spelling, shape, causal):
    before = masked_attention(spelling=spelling, shape=shape)
    log = pk.RewriteLog()
    after = pk.rewrite(pk.RuleSet([AttentionCausalMask()]), before, log=log)
    assert log.count(RULE) == 1
    assert f'causal_mask="{causal}"' in after.script()
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


def test_a_band_becomes_a_window_checked_through_the_expansion():
    # TVM 0.27 cannot build a windowed attention for llvm (docs/tvm-bugs.md): the band's
    # collapse is compared with the model after attention.expand writes it out again
    before = masked_attention(window=3)
    log = pk.RewriteLog()
    after = pk.rewrite(pk.RuleSet([AttentionCausalMask()]), before, log=log)
    assert log.count(RULE) == 1
    assert 'causal_mask="TopLeft", window_size=3' in after.script()
    written_out = pk.rewrite(EXPANSIONS, after)
    pk.assert_same_numerics(before, written_out, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


# -- end to end: torch modules, torch.export, patternkit's importer ----------------------------
torch = pytest.importorskip("torch")
SEQ = 8


class CausalAttention(torch.nn.Module):
    """q @ k^T * scale, a causal mask spelled as ``spelling``, softmax, @ v (BNSH)."""

    def __init__(self, spelling: str, diagonal: int = 1):
        super().__init__()
        self.spelling, self.diagonal = spelling, diagonal
        self.register_buffer("tril", torch.tril(torch.ones(SEQ, SEQ)).view(1, 1, SEQ, SEQ))

    def forward(self, q, k, v):
        s, t = q.shape[2], k.shape[2]
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if self.spelling == "buffer":  # nanoGPT
            scores = scores.masked_fill(self.tril[:, :, :s, :t] == 0, float("-inf"))
        elif self.spelling == "arange":
            allowed = torch.arange(s)[:, None] >= torch.arange(t)[None, :]
            scores = scores.masked_fill(~allowed, float("-inf"))
        else:  # Hugging Face's full(finfo.min).triu(1), or -inf
            fill = float("-inf") if self.spelling == "triu_inf" else torch.finfo(q.dtype).min
            scores = scores + torch.full((s, t), fill).triu(self.diagonal)
        return torch.softmax(scores, -1) @ v


def _imported(module):
    from patternkit.models.importing import from_torch

    torch.manual_seed(0)
    args = tuple(torch.randn(2, 2, SEQ, 16) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.export(module.eval(), args)
    mod, _, _ = from_torch(program, False, "main", type(module).__name__, {})
    return mod


@pytest.mark.parametrize("spelling", ["buffer", "arange", "triu_min"])
def test_a_torch_causal_attention_collapses_with_the_causal_mask(spelling):
    before = _imported(CausalAttention(spelling))
    log = pk.RewriteLog()
    after = pk.rewrite(WITH_CAUSAL, before, log=log)
    assert log.count("attention.collapse") == 1 and log.count(RULE) == 1
    text = after.script()
    assert 'causal_mask="TopLeft"' in text and "R.nn.attention_bias" not in text
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


def test_a_minus_inf_triu_mask_collapses_though_the_model_does_not_build():
    # TVM 0.27 cannot legalise the imported full((s, t), -inf) for llvm (topi.full reads
    # its dtype as a string): numerics NOT RUN; the collapse drops the full
    after = pk.rewrite(WITH_CAUSAL, _imported(CausalAttention("triu_inf")))
    assert 'causal_mask="TopLeft"' in after.script() and "R.full" not in after.script()


def test_a_torch_triangle_off_by_one_stays_a_bias_with_its_reason():
    before = _imported(CausalAttention("triu_min", diagonal=2))
    log = pk.RewriteLog()
    after = pk.rewrite(WITH_CAUSAL, before, log=log)
    assert log.count("attention.collapse") == 1 and log.count(RULE) == 0
    assert "causal_mask=None" in after.script()
    assert any("not a causal triangle" in r for r in log.reasons(RULE)), log.reasons(RULE)
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


def test_the_rule_is_opt_in_because_llvm_causal_attention_loses_very_negative_rows():
    # the first query keeps one key; a score of -200 there: the bias form's softmax is 1,
    # TVM 0.27's llvm causal mask zeroes the masked scores before the row max, so its
    # exponential underflows against a max of 0 and the row is 0 / 0
    assert "attention.causal_mask" not in [rule.rule_name for rule in LIBRARY]
    before = masked_attention()
    after = pk.rewrite(RuleSet([AttentionCausalMask()]), before)
    q = np.zeros((2, 8, 2, 16), "float32")
    q[:, 0] = -10.0
    k = np.ones((2, 8, 2, 16), "float32") * 5.0
    v = np.ones((2, 8, 2, 16), "float32")
    from patternkit.verification import numeric

    written = numeric.run(before, [q, k, v], "main")[0]
    fused = numeric.run(after, [q, k, v], "main")[0]
    assert np.isfinite(written).all() and np.isnan(fused[:, 0]).all()
