"""The library's near-miss detectors on real torch imports: a family's shape its rules
leave is reported with the rule and its reason; a model whose families all collapse (or
go to a composite) reports none."""

from __future__ import annotations

import math

import pytest

import patternkit as pk
from patternkit.patterns import LIBRARY
from patternkit.patterns.near_misses import NEAR_MISSES, detectors

torch = pytest.importorskip("torch")


def imported(module, *args):
    from patternkit.models.importing import from_torch

    mod, _, _ = from_torch(torch.export.export(module.eval(), args), False, "main",
                           type(module).__name__, {})
    return mod


def near_misses(mod):
    log = pk.RewriteLog()
    pk.rewrite(LIBRARY, mod, log=log)
    return log.near_misses(NEAR_MISSES)


class PerHeadScaledAttention(torch.nn.Module):
    """Scores scaled by a learned per-head tensor, which attention.collapse refuses."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(4, 1, 1) + 0.5)

    def forward(self, q, k, v):
        return torch.softmax((q @ k.transpose(-1, -2)) * self.scale, -1) @ v


class TensorEpsLayerNorm(torch.nn.Module):
    """A layer norm written out whose epsilon is a per-feature tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("eps", torch.full((16,), 1e-5))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps)


class OffGelu(torch.nn.Module):
    """GELU written out with the wrong divisor (1.5, not sqrt(2))."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 1.5))


class UnnegatedRotary(torch.nn.Module):
    """A half rotation that forgets to negate the second half: no rotary embedding."""

    def forward(self, x, cos, sin):
        x1, x2 = x[..., :4], x[..., 4:]
        return x * cos + torch.cat((x2, x1), dim=-1) * sin


class StatisticsAsInputsBatchNorm(torch.nn.Module):
    """A batch norm whose statistics are inputs, not the constants batchnorm.collapse folds."""

    def forward(self, x, mean, var):
        return (x - mean) / torch.sqrt(var + 1e-5)


class PlusTwoHardswish(torch.nn.Module):
    """Hard-swish with 2 where 3 belongs."""

    def forward(self, x):
        return x * torch.clamp(x + 2, 0, 6) / 6


class CrossGatedMlp(torch.nn.Module):
    """A gate and an up projection of two different inputs: no gated MLP."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 16, bias=False)
        self.up = torch.nn.Linear(8, 16, bias=False)

    def forward(self, x, y):
        return torch.nn.functional.silu(self.gate(x)) * self.up(y)


class TensorEpsRmsNorm(torch.nn.Module):
    """An RMS norm whose epsilon is a per-feature tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("eps", torch.full((8,), 1e-6))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DoublePrecisionSilu(torch.nn.Module):
    """SiLU whose sigmoid runs in float64 between casts."""

    def forward(self, x):
        return x * torch.sigmoid(x.double()).float()


class WrongAxisSoftmax(torch.nn.Module):
    """A hand-written softmax whose sum runs over another axis than its max."""

    def forward(self, s):
        e = torch.exp(s - s.max(-1, keepdim=True).values)
        return e / e.sum(-2, keepdim=True)


@pytest.mark.parametrize("module, shapes, family, rule, kind, reason", [
    (StatisticsAsInputsBatchNorm(), [(2, 4, 8), (8,), (8,)], "batchnorm", "batchnorm.collapse",
     "no match", "sqrt(add((… | …), const))) (depth 2) vs var"),
    (PlusTwoHardswish(), [(2, 8)], "hardswish", "hardsigmoid.canonicalize", "no match",
     "no match: const(3) (depth 5) vs const float32 2"),
    (CrossGatedMlp(), [(2, 8), (2, 8)], "gated_mlp", "byoc.swiglu", "no match",
     "(depth 7 in up_accumulation=direct in up_bias=plain) vs y"),
    (TensorEpsRmsNorm(), [(2, 8)], "rmsnorm", "rmsnorm.collapse", "check",
     "eps has shape (8,): epsilon must be a scalar constant"),
    (DoublePrecisionSilu(), [(2, 8)], "silu", "silu.collapse", "no match",
     "no match: sigmoid(*) (depth 2) vs 'lv2' = R.astype(lv1, dtype=\"float32\")"),
    (WrongAxisSoftmax(), [(2, 5, 5)], "softmax", "softmax.collapse", "check",
     "the max reduces axis 2 but the sum axis 1: the shift does not cancel"),
], ids=lambda value: type(value).__name__ if isinstance(value, torch.nn.Module) else None)
def test_each_family_names_its_rule_and_reason(module, shapes, family, rule, kind, reason):
    args = [torch.rand(*shape) + 0.5 for shape in shapes]
    (miss,) = near_misses(imported(module, *args))
    assert (miss.family, miss.rule, miss.kind) == (family, rule, kind)
    assert reason in miss.reason


class PerChannelDequantize(torch.nn.Module):
    """Dequantisation by hand with a scale per element (dequantize.collapse: one number or
    one per channel of an axis)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.rand(2, 8) + 0.1)

    def forward(self, q):
        return (q.float() - 3.0) * self.scale


class PerChannelQuantize(PerChannelDequantize):
    """Quantisation by hand with a scale per element (quantize.collapse: per tensor or per
    channel)."""

    def forward(self, x):
        return torch.clamp(torch.round(x / self.scale) + 3, -128, 127).to(torch.int8)


@pytest.mark.parametrize("module, x, family", [
    (PerChannelDequantize(), torch.randint(-128, 127, (2, 8), dtype=torch.int8), "dequantize"),
    (PerChannelQuantize(), torch.randn(2, 8), "quantize"),
], ids=["dequantize", "quantize"])
def test_a_per_channel_quantisation_names_the_quantize_rule_and_reason(module, x, family):
    (miss,) = near_misses(imported(module, x))
    assert (miss.family, miss.rule, miss.kind) == (family, f"{family}.collapse", "check")
    assert miss.reason.startswith("the scale has shape (2, 8)")


class Block(torch.nn.Module):
    """A decoder block whose every family the library takes: a layer norm and an
    attention written out, an RMS norm, a SwiGLU MLP and GELU."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 16, bias=False)
        self.up = torch.nn.Linear(8, 16, bias=False)

    def forward(self, q, k, v):
        mu = q.mean(-1, keepdim=True)
        h = (q - mu) / torch.sqrt(((q - mu) ** 2).mean(-1, keepdim=True) + 1e-5)
        attention = torch.softmax((h @ k.transpose(-1, -2)) / math.sqrt(8), -1) @ v
        rms = attention * torch.rsqrt(attention.pow(2).mean(-1, keepdim=True) + 1e-6)
        mlp = torch.nn.functional.silu(self.gate(rms)) * self.up(rms)
        return torch.nn.functional.gelu(mlp)


def test_an_attention_with_a_scale_the_rule_refuses_is_a_near_miss_with_the_reason():
    args = (torch.randn(2, 4, 5, 8),) * 3
    (miss,) = near_misses(imported(PerHeadScaledAttention(), *args))
    assert (miss.family, miss.rule, miss.kind) == ("attention", "attention.collapse", "check")
    assert "not split back into the query's heads" in miss.reason


class SoftcappedAttention(torch.nn.Module):
    """Gemma 2's attention: the scaled scores soft-capped, tanh(scores / 50) * 50."""

    def forward(self, q, k, v):
        scores = (q @ k.transpose(-1, -2)) * 0.25
        return torch.softmax(torch.tanh(scores / 50.0) * 50.0, -1) @ v


class PlainAttention(torch.nn.Module):
    """The same attention without the softcap: collapsed."""

    def forward(self, q, k, v):
        return torch.softmax((q @ k.transpose(-1, -2)) * 0.25, -1) @ v


def test_a_softcapped_attention_is_a_near_miss_named_for_its_softcap():
    args = (torch.randn(2, 4, 5, 8),) * 3
    (miss,) = near_misses(imported(SoftcappedAttention(), *args))
    assert (miss.family, miss.rule, miss.kind) == ("attention", "attention.collapse",
                                                   "unsupported")
    assert miss.reason.startswith("a logit softcap, tanh(scores / c) * c (Gemma 2), between "
                                  "the scores and the softmax")
    assert near_misses(imported(PlainAttention(), *args)) == []  # the rule takes it


def test_a_layer_norm_whose_epsilon_is_a_tensor_is_a_near_miss_with_the_reason():
    (miss,) = near_misses(imported(TensorEpsLayerNorm(), torch.randn(2, 5, 16)))
    assert (miss.family, miss.rule, miss.kind) == ("norm", "layernorm.collapse", "check")
    assert miss.reason == "eps has shape (16,): epsilon must be a scalar constant"


def test_an_onnx_export_of_a_layer_norm_with_a_tensor_epsilon_is_a_near_miss():
    onnx = pytest.importorskip("onnx")
    import contextlib
    import io
    import warnings

    from tvm.relax.frontend.onnx import from_onnx

    buffer = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(TensorEpsLayerNorm(), (torch.randn(2, 5, 16),), buffer,
                          opset_version=17, dynamo=False, input_names=["x"])
    mod = from_onnx(onnx.load_from_string(buffer.getvalue()), shape_dict={"x": [2, 5, 16]})
    (miss,) = near_misses(mod)
    assert (miss.family, miss.rule, miss.kind) == ("norm", "layernorm.collapse", "check")
    assert miss.reason == "eps has shape (16,): epsilon must be a scalar constant"


def test_a_gelu_with_another_constant_names_the_gelu_rule():
    (miss,) = near_misses(imported(OffGelu(), torch.randn(2, 8)))
    assert (miss.family, miss.rule, miss.kind) == ("gelu", "gelu.collapse", "no match")
    assert miss.reason.endswith("no match: const(1.41421) (depth 10) vs const float32 1.5")


def test_a_rotation_that_is_no_rotary_embedding_names_a_rope_composite():
    x, cos, sin = torch.randn(2, 5, 8), torch.randn(5, 8), torch.randn(5, 8)
    (miss,) = near_misses(imported(UnnegatedRotary(), x, cos, sin))
    assert (miss.family, miss.rule, miss.kind) == ("rope", "byoc.rope", "no match")
    assert "no match: negative(strided_slice(*, ...))" in miss.reason


def test_a_model_whose_families_all_collapse_has_no_near_miss():
    mod = imported(Block(), *(torch.randn(2, 4, 5, 8),) * 3)
    log = pk.RewriteLog()
    pk.rewrite(LIBRARY, mod, log=log)
    assert {"layernorm.collapse", "attention.collapse", "rmsnorm.collapse"} <= set(log.counts())
    # the SwiGLU and the GELU stay for the composites, which take them: no miss either
    assert log.near_misses(NEAR_MISSES) == []


def test_a_relu6_after_a_biased_conv_is_no_hard_swish_near_miss():
    # clip(conv + bias, 0, 6): an add under a clip, as in hard-swish's clip(x + 3, 0, 6)
    convs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU6(),
                                torch.nn.Conv2d(4, 4, 1))
    assert near_misses(imported(convs, torch.randn(1, 3, 8, 8))) == []


class Pooler(torch.nn.Module):
    """BERT's pooler: tanh of a biased linear layer (no GELU-tanh)."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.dense(x))


class SqueezeExcitation(torch.nn.Module):
    """EfficientNet's block: silu(depthwise conv) scaled by a sigmoid gate (no gated MLP)."""

    def __init__(self, c=8):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.reduce, self.expand = torch.nn.Conv2d(c, 2, 1), torch.nn.Conv2d(2, c, 1)

    def forward(self, x):
        x = torch.nn.functional.silu(self.dw(x))
        s = torch.nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True)))
        return x * torch.sigmoid(self.expand(s))


@pytest.mark.parametrize("module, shape", [(Pooler(), (2, 8)),
                                           (SqueezeExcitation(), (1, 8, 6, 6))],
                         ids=["tanh_pooler", "squeeze_excitation"])
def test_a_tanh_pooler_and_a_squeeze_excitation_are_no_near_misses(module, shape):
    # every tanh was a GELU-tanh near miss, every silu(conv) * gate a gated-MLP one
    assert near_misses(imported(module, torch.randn(*shape))) == []


def test_the_detectors_follow_the_rules_chosen():
    only_norms = detectors(LIBRARY.by_prefix("layernorm."))
    assert [d.family for d in only_norms] == ["norm"]
    assert [r.name for r in only_norms[0].rules] == ["layernorm.collapse"]
    assert detectors(pk.RuleSet()) == ()
    assert {d.family for d in NEAR_MISSES} >= {"attention", "norm", "rmsnorm", "batchnorm",
                                               "gelu", "silu", "hardswish", "rope",
                                               "gated_mlp", "dequantize", "quantize"}
