"""attention.collapse on the 3-D form: batch and heads merged into one axis around
``torch.bmm`` / ``torch.baddbmm`` (as older Hugging Face models write attention), the
softmax over the merged ``(B*N, S, T)`` scores, the result reshaped back into heads.

The modules are small torch modules exported with ``torch.export`` and imported with
patternkit's importer, as users bring them; every collapse is checked on llvm against the
written-out form, and every refusal names its reason.
"""

from __future__ import annotations

import warnings

import pytest

import patternkit as pk
from patternkit.engine.driver import RewriteLog
from patternkit.patterns import LIBRARY
from patternkit.patterns.attention.plan import BFLOAT16, FLOAT16, FLOAT32

torch = pytest.importorskip("torch")

RULE = "attention.collapse"
BATCH, HEADS, SEQ, HEAD_DIM = 2, 2, 8, 16
TOLERANCE = {"float32": FLOAT32, "float16": FLOAT16, "bfloat16": BFLOAT16}


def _merge(x):
    b, n, s, h = x.shape
    return x.reshape(b * n, s, h)


class MergedBmm(torch.nn.Module):
    """``bmm(q, k^T) * scale``, softmax, ``bmm(p, v)`` on (B*N, S, H), split back."""

    def __init__(self, split_back: str = "heads", softmax_axis: int = -1):
        super().__init__()
        self.split_back, self.softmax_axis = split_back, softmax_axis

    def forward(self, q, k, v):
        b, n, s, h = q.shape
        scores = torch.bmm(_merge(q), _merge(k).transpose(1, 2)) * h ** -0.5
        out = torch.bmm(scores.softmax(self.softmax_axis), _merge(v))
        if self.split_back == "heads":
            return out.reshape(b, n, s, h)
        return out.reshape(b, s, n, h)  # not the heads the merge made


class MergedBaddbmm(torch.nn.Module):
    """``baddbmm(bias, q, k^T, alpha=scale)`` with a (B*N, S, T) bias or a causal
    (S, T) triangle, as Bloom-era models write it.
    """

    def __init__(self, bias: str = "merged"):
        super().__init__()
        self.bias = bias

    def forward(self, q, k, v, extra):
        b, n, s, h = q.shape
        if self.bias == "causal":
            t = k.shape[2]
            extra = torch.triu(torch.full((s, t), -1e4, dtype=q.dtype), diagonal=1)
        scores = torch.baddbmm(extra, _merge(q), _merge(k).transpose(1, 2), beta=1.0,
                               alpha=h ** -0.5)
        return torch.bmm(scores.softmax(-1), _merge(v)).reshape(b, n, s, h)


def _imported(module, args, dynamic_seq: bool = False):
    from patternkit.models.importing import from_torch

    dynamic = None
    if dynamic_seq:
        seq = torch.export.Dim("seq", min=2, max=64)
        dynamic = tuple({2: seq} if a.dim() == 4 else {1: seq, 2: seq} for a in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.export(module.eval(), args, dynamic_shapes=dynamic)
    mod, _, _ = from_torch(program, False, "main", type(module).__name__, {})
    return mod


def _inputs(dtype: str, extra: bool = False):
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    args = [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM).to(dt) for _ in range(3)]
    if extra:
        args.append((torch.rand(BATCH * HEADS, SEQ, SEQ) - 0.5).to(dt))
    return tuple(args)


def _collapsed(mod):
    log = RewriteLog()
    after = pk.rewrite(LIBRARY, mod, log=log)
    return after, log


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("dynamic_seq", [False, True], ids=["static", "symbolic_seq"])
def test_a_merged_heads_bmm_attention_collapses_with_the_numbers_kept(dtype, dynamic_seq):
    before = _imported(MergedBmm(), _inputs(dtype), dynamic_seq)
    after, log = _collapsed(before)
    assert log.count(RULE) == 1
    assert after.script().count("R.nn.attention") == 1
    assert "R.nn.softmax" not in after.script()
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol,
                            shape_vars={"seq": SEQ})


# torch.export computes a float16 or bfloat16 baddbmm in float32 (its operands and bias
# upcast, the sum cast back before the softmax): collapsed in the model's dtype, the
# precision logged
@pytest.mark.parametrize("bias, dtype", [("merged", "float32"), ("causal", "float32"),
                                         ("merged", "float16"), ("causal", "bfloat16")])
def test_a_baddbmm_attention_collapses_with_its_bias_split_into_heads(bias, dtype, caplog):
    before = _imported(MergedBaddbmm(bias), _inputs(dtype, extra=True))
    with caplog.at_level("INFO", logger="patternkit.patterns.attention.collapse"):
        after, log = _collapsed(before)
    assert log.count(RULE) == 1
    assert after.script().count("R.nn.attention") == 1
    assert ("computed in float32" in caplog.text) == (dtype != "float32")
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol)


def test_a_merged_result_reshaped_into_other_axes_than_the_heads_is_refused():
    before = _imported(MergedBmm(split_back="sequence_first"), _inputs("float32"))
    after, log = _collapsed(before)
    assert log.count(RULE) == 0
    assert any("not split back into the query's heads" in r for r in log.reasons(RULE))


def test_a_softmax_over_the_merged_query_axis_is_refused():
    before = _imported(MergedBmm(softmax_axis=1), _inputs("float32"))
    after, log = _collapsed(before)
    assert log.count(RULE) == 0
    assert any("the softmax normalises axis 1" in r for r in log.reasons(RULE))

